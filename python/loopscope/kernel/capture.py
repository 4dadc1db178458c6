"""Recording kernel tracepoints during a run without competing with the probes.

The role of DSKI in the data-stream study, without a kernel patch and
without a copier that runs while the probes measure. The kernel writes the
tracepoints that explain a late thread (scheduler switches, wake-ups,
migrations and runtime; device, timer-vector and soft interrupts; user page
faults; on request the per-packet receive path) into the
per-CPU ring buffers of a tracefs instance of the run's own
(``instances/loopscope-<run>``, ``trace_clock`` mono, buffers sized for the
longest probe window). Nobody reads them while a probe measures: the lab
asks for a drain between windows (``drain``), when no probe runs. The
reader (``loopscope.kernel.drain``, comm ``ls-kcapture``) runs at
SCHED_IDLE, so even when it does run it yields to any runnable thread; it
wakes on its own only when a CPU's buffer is half full (``buffer_percent``),
which happens only in a window longer than the buffers hold, and every
such read is logged with its time so the run can say so.

Why not ``perf record``, as before: perf copies the buffers continuously
while the probes run, and in the demo it was the top named cause of
outliers in 11 of 21 groups though it used under 1 % of a CPU. Why not BPF
maps of per-thread runtime segments: the same wake-up and switch events
would have to be recorded, and the kernel already keeps them in per-CPU
buffers we can leave alone during a window (docs/explain.md compares the
three by measurement).

Timestamps are the kernel's CLOCK_MONOTONIC, which time namespaces do not
shift: the agent records its own namespace offset so events can be placed
on the host's clock. One capture per kernel: netns and local hosts share
this machine's.

What is missing is said, never skipped: no tracefs, no permission to create
an instance, a tracepoint this kernel lacks (left out and named), events
the kernel dropped (placed on their CPU by the pages' own flags, and
cross-checked against the buffers' overrun counters).
"""

from __future__ import annotations

import os
import select
import signal
import subprocess
import sys
import time
from pathlib import Path
from typing import Any, TypeVar

from pydantic import TypeAdapter, ValidationError

from loopscope.rundir import CaptureReport
from loopscope.kernel.tracing import (
    FILTERS as FILTERS,
    NOT_MEASURED as NOT_MEASURED,
    PER_THREAD as PER_THREAD,
    CPU_FIELDS as CPU_FIELDS,
    cpu_filter as cpu_filter,
    filter_for as filter_for,
    TRACEFS as TRACEFS,
    INSTANCE_PREFIX as INSTANCE_PREFIX,
    tracefs as tracefs,
    timens_offset_ns as timens_offset_ns,
    Ready as Ready,
    HalfFull as HalfFull,
    Drained as Drained,
    Kept as Kept,
    remove_instance as remove_instance,
)

# What attribution reads, and nothing more: every event is ring-buffer space
# and a cost where it fires (sched_waking and the hrtimer expiries, once
# recorded, were a fifth of the events under a network flood and read by
# nobody).
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
    "irq_vectors:call_function_entry",
    "irq_vectors:call_function_exit",
    "exceptions:page_fault_user",
    "timer:hrtimer_start",
    "csd:csd_function_entry",
    # rare (a task moved between cgroups): names the CPU-limited group a thread was moved into
    "cgroup:cgroup_attach_task",
]

# What a watching capture (``read="watch"``: a monitor's ``threads`` probe,
# only the program's threads) records: what their activations are made of.
WATCH_EVENTS = ["sched:sched_switch", "sched:sched_wakeup", "sched:sched_waking", "sched:sched_migrate_task", "timer:hrtimer_start"]
# A watching capture's buffers: a 1 kHz program makes ~5 k of its events a
# second, read every half second; room for seconds of a busier one.
WATCH_BUFFER_MB = 4


# Per-packet receive-path events: opt-in (``kernel.events``). Under a network
# flood they fire hundreds of thousands of times a second and fill the buffers.
NET_EVENTS = ["net:netif_receive_skb", "napi:napi_poll", "udp:udp_fail_queue_rcv_skb"]

FORMAT = "tracefs-segments/1"

# Sizing the buffers: the demo's busiest CPU (a 200 Mbit/s flood through the
# emulator, seven pipeline processes starting) recorded 165 k events/s over
# a 5 s step, more in its peaks, at about 38 bytes each in the ring buffer;
# a window is the probe's duration plus the few seconds a step needs to
# start its processes. At 150 k/s the bench's busy pipeline still woke the
# reader inside 8 of 10 windows.
EVENTS_PER_S_PER_CPU = 250_000
BYTES_PER_EVENT = 40
STEP_SLACK_S = 3.0
MIN_BUFFER_MB = 16
MAX_BUFFER_MB = 1024
# How long a keep may take before the keeper gives the window up (the reader
# goes on, and its late answer is skipped by its sequence number).
KEEP_TIMEOUT_S = 30.0


def available(events: list[str] | None = None) -> tuple[list[str], list[str], str | None]:
    """(events this kernel has, events it lacks, why capture is impossible or None)."""
    want = events or EVENTS
    tf = tracefs()
    if tf is None:
        return [], want, "tracefs is not mounted and cannot be (mount -t tracefs nodev /sys/kernel/tracing as root)"
    if not os.access(tf / "instances", os.W_OK):
        return [], want, f"creating a trace instance needs root ({tf}/instances is not writable)"
    have: list[str] = []
    lack: list[str] = []
    for e in want:
        sub, name = e.split(":", 1)
        (have if Path(tf, "events", sub, name, "format").is_file() else lack).append(e)
    if not have:
        return [], lack, "none of the kernel events exist on this kernel"
    return have, lack, None


def size_buffers(window_s: float | None, asked_mb: int | None = None) -> tuple[int, str]:
    """The ring buffer per CPU, in MiB, and why that size: what was asked, or
    twice what the longest window is expected to record (the reader wakes at
    half full), within bounds and within an eighth of the free memory."""
    ncpu = os.cpu_count() or 1
    try:
        avail_kb = next(int(line.split()[1]) for line in Path("/proc/meminfo").read_text().splitlines() if line.startswith("MemAvailable:"))
    except (OSError, StopIteration, ValueError):
        avail_kb = 1 << 22
    cap = max(1, avail_kb // 1024 // 8 // ncpu)
    if asked_mb:
        return min(asked_mb, cap), f"kernel.buffer_mb: {asked_mb}" + (f" (cut to {cap}: an eighth of the free memory)" if asked_mb > cap else "")
    w = (window_s or 10.0) + STEP_SLACK_S
    want = int(2 * w * EVENTS_PER_S_PER_CPU * BYTES_PER_EVENT / (1 << 20)) + 1
    mb = max(MIN_BUFFER_MB, min(MAX_BUFFER_MB, want, cap))
    why = f"twice a {w:g} s step at {EVENTS_PER_S_PER_CPU // 1000} k events/s per CPU"
    if mb < want:
        why += f"; {want} MiB wanted, cut to {mb} (a window this long wakes the reader while it runs)"
    return mb, why


R = TypeVar("R")
READY: TypeAdapter[Ready] = TypeAdapter(Ready)
DRAINED: TypeAdapter[Drained] = TypeAdapter(Drained)
KEPT: TypeAdapter[Kept] = TypeAdapter(Kept)


class Capture:
    """One kernel capture: a tracefs instance and its reader, until ``stop``."""

    def __init__(
        self,
        out_dir: Path,
        events: list[str] | None = None,
        buffer_mb: int | None = None,
        window_s: float | None = None,
        name: str | None = None,
        group: Path | None = None,
        read: str = "between-windows",
        flight: str = "alternate",
        reach_ns: int | None = None,
        cpus: list[int] | None = None,
    ) -> None:
        self.read = read
        #: record only what concerns these CPUs (None: every CPU)
        self.cpus = cpus
        self.reach_ns = reach_ns
        self.flight = flight
        self.out_dir = Path(out_dir)
        self.out_dir.mkdir(parents=True, exist_ok=True)
        self.log = self.out_dir / "reader.log"
        self.events, self.missing, self.refused = available(events)
        self.buffer_mb, self.buffer_why = size_buffers(window_s, buffer_mb)
        self.name = name or f"{INSTANCE_PREFIX}{os.getpid()}"
        self.proc: subprocess.Popen[bytes] | None = None
        self.started_ns = 0
        self.stopped_ns = 0
        self.ready: Ready = {}
        self.final: Drained = {}
        self.cpu_s: float | None = None
        self.tids: list[int] = []
        self.group = group
        self.keep_seq = 0

    def _group_idle(self, on: bool) -> None:
        """With the cpu controller, a group's tasks compete as one entity:
        mark the reader's group idle, as its policy is, outside asked drains."""
        if self.group is not None and (self.group / "cpu.idle").exists():
            try:
                (self.group / "cpu.idle").write_text("1" if on else "0")
            except OSError:
                pass

    def argv(self) -> list[str]:
        return [
            sys.executable,
            "-m",
            "loopscope.kernel.drain",
            "--instance",
            self.name,
            "--out",
            str(self.out_dir),
            "--buffer-mb",
            str(self.buffer_mb),
            "--events",
            ",".join(self.events),
            *(["--continuously"] if self.read == "continuously" else []),
            *(["--flight", self.flight] if self.read == "flight" else []),
            *(["--watch"] if self.read == "watch" else []),
            *(["--reach-ms", str(self.reach_ns // 1_000_000)] if self.read == "flight" and self.reach_ns else []),
            *(["--cpus", ",".join(str(c) for c in self.cpus)] if self.cpus else []),
        ]

    def pid_file(self) -> Path | None:
        """A watching capture's ``set_event_pid`` (the threads to record are written there)."""
        tf = tracefs()
        return tf / "instances" / self.name / "set_event_pid" if tf is not None else None

    def start(self, wrap: Any = None, env: dict[str, str] | None = None) -> CaptureReport:
        """Create the instance and start its reader; ``wrap`` (argv → argv) puts
        the reader in a cgroup, ``env`` marks it as the run's."""
        if self.refused:
            return self.meta()
        argv = self.argv()
        # polars' allocator would otherwise keep a thread that wakes on its own
        # to return memory, inside the windows: the reader must run only when asked.
        env = {**(env or os.environ), "_RJEM_MALLOC_CONF": "background_thread:false"}
        with open(self.log, "ab") as log:
            self.proc = subprocess.Popen(
                wrap(argv) if wrap else argv, stdin=subprocess.PIPE, stdout=subprocess.PIPE, stderr=log, start_new_session=True, env=env
            )
        self.started_ns = time.monotonic_ns()
        reply = self._reply(READY, timeout=20)
        if reply is None or not reply.get("ready"):
            why = (reply or {}).get("error") or self._log_tail() or "the reader said nothing"
            self.refused = f"the kernel capture's reader did not start: {why}"
            self._kill()
        else:
            self.ready = reply
            self.missing = sorted(set(self.missing) | set(reply.get("missing") or []))
            self._group_idle(True)
        return self.meta()

    def drain(self, label: str = "") -> Drained:
        """Read everything the buffers hold now (call it between windows)."""
        if self.proc is None or self.proc.poll() is not None:
            return {"error": "the kernel capture's reader is not running" + (f": {self._log_tail()}" if self.proc else "")}
        self._group_idle(False)
        try:
            self._send(f"drain {label}")
            return self._reply(DRAINED, timeout=120) or {"error": f"the kernel capture's reader did not answer a drain: {self._log_tail()}"}
        finally:
            self._group_idle(True)

    def keep(self, t0: int, t1: int, dest: Path, margin_ns: int) -> Kept:
        """A flight recorder's (``read="flight"``) window [t0, t1] (kernel ns)
        taken out of its buffers into a store in ``dest``; events from
        ``margin_ns`` before the newest are held for the next keep."""
        if self.proc is None or self.proc.poll() is not None:
            return {"error": "the flight recorder's reader is not running" + (f": {self._log_tail()}" if self.proc else "")}
        self.keep_seq += 1
        self._group_idle(False)
        try:
            self._send(f"keep {self.keep_seq} {t0} {t1} {margin_ns} {dest}")
            end = time.monotonic() + KEEP_TIMEOUT_S
            while True:
                # an answer to a keep that timed out earlier comes first: skip it
                got = self._reply(KEPT, timeout=max(0.0, end - time.monotonic()))
                if got is None:
                    return {"error": f"the flight recorder's reader did not answer a keep within {KEEP_TIMEOUT_S:g} s: {self._log_tail()}"}
                if got.get("seq") == self.keep_seq:
                    return got
        finally:
            self._group_idle(True)

    def stop(self) -> CaptureReport:
        if self.proc is not None:
            self.cpu_s = _cpu_s(self.proc.pid)
            try:
                # Its threads (polars' pool among them), for attribution to name as the capture's.
                self.tids = sorted(int(t) for t in os.listdir(f"/proc/{self.proc.pid}/task"))
            except OSError:
                pass
            if self.proc.poll() is None:
                self._group_idle(False)
                self._send("stop")
                self.final = self._reply(DRAINED, timeout=120) or {}
            try:
                self.proc.wait(timeout=10)
            except subprocess.TimeoutExpired:
                self._kill()
            if self.proc is not None:
                _close_pipes(self.proc)
            self.proc = None
            self.stopped_ns = time.monotonic_ns()
        remove_instance(self.name)
        remove_instance(f"{self.name}-b")  # a flight recorder's twin
        return self.meta()

    def _kill(self) -> None:
        if self.proc is not None:
            try:
                os.killpg(self.proc.pid, signal.SIGKILL)
            except ProcessLookupError:
                pass
            self.proc.wait()
            _close_pipes(self.proc)
            self.proc = None
        remove_instance(self.name)
        remove_instance(f"{self.name}-b")

    def _send(self, line: str) -> None:
        assert self.proc is not None and self.proc.stdin is not None
        try:
            self.proc.stdin.write((line + "\n").encode())
            self.proc.stdin.flush()
        except (BrokenPipeError, OSError):
            pass

    def _reply(self, shape: TypeAdapter[R], timeout: float) -> R | None:
        """The reader's next line, checked against ``shape`` (None: no answer, or not one it gives)."""
        assert self.proc is not None and self.proc.stdout is not None
        fd = self.proc.stdout.fileno()
        end = time.monotonic() + timeout
        buf = b""
        while not buf.endswith(b"\n"):
            r, _, _ = select.select([fd], [], [], max(0.0, end - time.monotonic()))
            if not r:
                return None
            b = os.read(fd, 65536)
            if not b:
                return None
            buf += b
        try:
            return shape.validate_json(buf.decode(errors="replace").strip().splitlines()[-1])
        except (ValidationError, IndexError):
            return None

    def _log_tail(self) -> str:
        try:
            return self.log.read_text(errors="replace").strip()[-400:]
        except OSError:
            return ""

    def meta(self) -> CaptureReport:
        return CaptureReport.model_validate(
            {
                "tool": f"tracefs instance, read {self.read}",
                "read": self.read,
                "format": FORMAT,
                "instance": self.name,
                "events": self.events,
                "missing_events": self.missing,
                "filters": self.ready.get("filters") or {},
                "unfiltered_events": self.ready.get("unfiltered") or [],
                "refused": self.refused,
                "data": str(self.out_dir) if (self.out_dir / "segments.jsonl").exists() else None,
                "log": str(self.log),
                "clock": "the kernel's CLOCK_MONOTONIC (not shifted by time namespaces)",
                "timens_offset_ns": timens_offset_ns(),
                "buffer_mb_per_cpu": self.buffer_mb,
                "buffer_why": self.buffer_why,
                "page_size": self.ready.get("page_size"),
                "seconds": (self.stopped_ns - self.started_ns) / 1e9 if self.stopped_ns else None,
                "reader_cpu_s": self.cpu_s,
                "reader_setup_cpu_s": self.ready.get("setup_cpu_s"),
                "reader_tids": self.tids,
                "reader": self.final.get("totals"),
            }
        )


def _close_pipes(p: subprocess.Popen[bytes]) -> None:
    for f in (p.stdin, p.stdout):
        if f is not None:
            try:
                f.close()
            except OSError:
                pass


def leftover_instances() -> list[str]:
    """loopscope's instances on this kernel (for ``loopscope cleanup``)."""
    tf = tracefs()
    if tf is None or not (tf / "instances").is_dir():
        return []
    return sorted(p.name for p in (tf / "instances").iterdir() if p.name.startswith(INSTANCE_PREFIX))


def _cpu_s(pid: int) -> float | None:
    """CPU time the reader has used so far (user + system, from /proc)."""
    try:
        f = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()
        return (int(f[11]) + int(f[12])) / os.sysconf("SC_CLK_TCK")
    except (OSError, IndexError, ValueError):
        return None
