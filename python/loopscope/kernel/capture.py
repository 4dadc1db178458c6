"""Recording kernel tracepoints during a run, on CLOCK_MONOTONIC.

The role of DSKI in seeds/000, without a kernel patch: ``perf record -a -k
mono`` on the tracepoints that explain a late thread (scheduler switches,
wake-ups and migrations; device, timer-vector and soft interrupts; user page
faults; hrtimer expiries; on request, the per-packet receive path). perf reads the
kernel's per-CPU ring buffers through mmap and writes them unparsed, so the
cost during the run is the tracepoints themselves plus one process copying
buffers; parsing happens afterwards (``events.read``). Timestamps are the
kernel's CLOCK_MONOTONIC, which time namespaces do not shift: the agent
records its own namespace offset so the events can be placed on the host's
clock. One capture per kernel: netns and local hosts share this machine's.

What is missing is said, never skipped silently: no perf, no permission
(perf_event_paranoid, no CAP_PERFMON/root), a tracepoint this kernel lacks
(it is left out and named), and events lost to full buffers (perf's own
count of lost chunks and samples).
"""

from __future__ import annotations

import os
import shutil
import signal
import subprocess
import time
from pathlib import Path
from typing import Any

EVENTS = [
    "sched:sched_switch",
    "sched:sched_wakeup",
    "sched:sched_waking",
    "sched:sched_migrate_task",
    "sched:sched_stat_runtime",
    "irq:irq_handler_entry",
    "irq:irq_handler_exit",
    "irq:softirq_entry",
    "irq:softirq_exit",
    "irq_vectors:local_timer_entry",
    "irq_vectors:local_timer_exit",
    "irq_vectors:call_function_single_entry",
    "irq_vectors:call_function_single_exit",
    "irq_vectors:reschedule_entry",
    "irq_vectors:reschedule_exit",
    "exceptions:page_fault_user",
    "timer:hrtimer_expire_entry",
    "timer:hrtimer_expire_exit",
]

# Per-packet receive-path events: opt-in (``kernel.events``). Under a network
# flood they fire hundreds of thousands of times a second and perf, copying
# them, becomes a cause of the outliers it is there to explain.
NET_EVENTS = ["net:netif_receive_skb", "napi:napi_poll", "udp:udp_fail_queue_rcv_skb"]

TRACEFS = ("/sys/kernel/tracing", "/sys/kernel/debug/tracing")


def tracefs() -> Path | None:
    for p in TRACEFS:
        if Path(p, "events").is_dir():
            return Path(p)
    # Mount it when we may (root); a failure leaves it absent.
    if os.geteuid() == 0 and Path(TRACEFS[0]).is_dir():
        subprocess.run(["mount", "-t", "tracefs", "nodev", TRACEFS[0]], capture_output=True)
        if Path(TRACEFS[0], "events").is_dir():
            return Path(TRACEFS[0])
    return None


def available(events: list[str] | None = None) -> tuple[list[str], list[str], str | None]:
    """(events this kernel has, events it lacks, why capture is impossible or None)."""
    want = events or EVENTS
    perf = shutil.which("perf")
    if perf is None:
        return [], want, "perf is not installed (scripts/install-deps.sh installs linux-perf)"
    tf = tracefs()
    if tf is None:
        return [], want, "tracefs is not mounted and cannot be (mount -t tracefs nodev /sys/kernel/tracing as root)"
    have, lack = [], []
    for e in want:
        sub, name = e.split(":", 1)
        (have if Path(tf, "events", sub, name).is_dir() else lack).append(e)
    if not have:
        return [], lack, "none of the kernel events exist on this kernel"
    paranoid = Path("/proc/sys/kernel/perf_event_paranoid")
    if os.geteuid() != 0 and paranoid.exists() and int(paranoid.read_text().strip() or "2") > -1:
        return [], want, f"system-wide tracepoints need root or CAP_PERFMON (perf_event_paranoid is {paranoid.read_text().strip()})"
    return have, lack, None


def timens_offset_ns() -> int:
    """This process's CLOCK_MONOTONIC minus the kernel's (its time namespace's offset)."""
    try:
        for line in Path("/proc/self/timens_offsets").read_text().splitlines():
            f = line.split()
            if f and f[0] in ("monotonic", "1"):
                return int(f[1]) * 1_000_000_000 + int(f[2])
    except (OSError, ValueError, IndexError):
        pass
    return 0


class Capture:
    """One ``perf record`` over the whole machine, until ``stop``."""

    def __init__(self, out_dir: Path, events: list[str] | None = None, buffer_pages: int = 1024) -> None:
        self.out_dir = Path(out_dir)
        self.out_dir.mkdir(parents=True, exist_ok=True)
        self.data = self.out_dir / "kernel.perf"
        self.log = self.out_dir / "perf.log"
        self.events, self.missing, self.refused = available(events)
        self.buffer_pages = buffer_pages
        self.proc: subprocess.Popen[bytes] | None = None
        self.started_ns = 0
        self.stopped_ns = 0
        self.cpu_s: float | None = None

    def argv(self) -> list[str]:
        a = ["perf", "record", "-q", "-a", "-k", "mono", "-m", str(self.buffer_pages), "-o", str(self.data)]
        for e in self.events:
            a += ["-e", e]
        return a

    def start(self, wrap: Any = None, env: dict[str, str] | None = None) -> dict[str, Any]:
        """Start recording; ``wrap`` (argv → argv) puts perf in a cgroup, ``env``
        marks it as the run's (so clean-up finds it)."""
        if self.refused:
            return self.meta()
        argv = self.argv()
        with open(self.log, "ab") as log:
            self.proc = subprocess.Popen(wrap(argv) if wrap else argv, stdin=subprocess.DEVNULL, stdout=log, stderr=log, start_new_session=True, env=env)
        self.started_ns = time.monotonic_ns()
        # perf needs a moment to open its buffers; a refusal shows at once.
        deadline = time.monotonic() + 5
        while time.monotonic() < deadline and not (self.data.exists() and self.data.stat().st_size > 0):
            if self.proc.poll() is not None:
                self.refused = f"perf record exited at once: {self.log.read_text(errors='replace').strip()[-300:]}"
                self.proc = None
                break
            time.sleep(0.02)
        return self.meta()

    def stop(self) -> dict[str, Any]:
        self.cpu_s = _cpu_s(self.proc.pid) if self.proc is not None else None
        if self.proc is not None:
            if self.proc.poll() is None:
                os.killpg(self.proc.pid, signal.SIGINT)
            try:
                self.proc.wait(timeout=30)
            except subprocess.TimeoutExpired:
                os.killpg(self.proc.pid, signal.SIGKILL)
                self.proc.wait()
            self.proc = None
            self.stopped_ns = time.monotonic_ns()
        return self.meta()

    def meta(self) -> dict[str, Any]:
        return {
            "tool": "perf record -a -k mono",
            "events": self.events,
            "missing_events": self.missing,
            "refused": self.refused,
            "data": str(self.data) if self.data.exists() else None,
            "log": str(self.log),
            "clock": "the kernel's CLOCK_MONOTONIC (not shifted by time namespaces)",
            "timens_offset_ns": timens_offset_ns(),
            "seconds": (self.stopped_ns - self.started_ns) / 1e9 if self.stopped_ns else None,
            "perf_cpu_s": self.cpu_s,
        }


def _cpu_s(pid: int) -> float | None:
    """CPU time perf has used so far (user + system, from /proc)."""
    try:
        f = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()
        return (int(f[11]) + int(f[12])) / os.sysconf("SC_CLK_TCK")
    except (OSError, IndexError, ValueError):
        return None
