"""Clock synchronization: estimating every host's clock against the reference.

``estimate`` does the mathematics (piecewise-linear offset from causality
bounds), ``sync`` reads a run's clock-sync traces and calibration pairs and
builds one ``ClockMap`` per host, which ``loopscope.timeline`` applies.
"""
