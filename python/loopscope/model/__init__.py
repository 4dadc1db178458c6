"""Node calibration and portable CPU-time models (seeds/004): ``node`` (what a
machine charges for system calls and execution environments, per load),
``app`` (a program's CPU time and system-call structure), ``predict`` (an
app carried from one node or condition to another)."""
