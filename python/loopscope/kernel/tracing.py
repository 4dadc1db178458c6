"""What the capture's two sides share: the lab's ``Capture`` (``capture.py``)
and its reader process (``drain.py``, ``instance.py``).

The reader imports this and nothing heavier (no tables, no run record): it
starts at every run, and what it loads is CPU it spends beside the probes.
Here: where tracefs is, the filters events are recorded under, the
namespace offset of this process's clock, the reader's replies, and the
removal of an instance.
"""

from __future__ import annotations

import os
import subprocess
import sys
import time
from pathlib import Path

from typing_extensions import TypedDict

TRACEFS = ("/sys/kernel/tracing", "/sys/kernel/debug/tracing")
INSTANCE_PREFIX = "loopscope-"


# Events recorded only where a filter in the kernel passes them (the
# ``.function`` form compares a pointer with a kernel symbol): wake-ups
# done by a task (not from a hard or soft interrupt or an NMI), the timers
# of sleeping threads (their soft and hard expiry say how much timer slack
# a wake-up was given), and of the functions IPIs run, only the TLB flush
# (it names an IPI as a TLB shootdown). A kernel that refuses a filter
# does without the event, and the run says so: unfiltered, they would be
# recorded for every timer and every cross-CPU call.
FILTERS = {
    # wake-ups one task gives another (not those of interrupts): who a blocked thread waited for
    "sched:sched_waking": "!(common_flags & 0x58)",
    "timer:hrtimer_start": "function.function == hrtimer_wakeup",
    "csd:csd_function_entry": "func.function == flush_tlb_func",
}

# Threads attribution never measures: the lab's loads (``ld:<name>``) and
# its own components. Their scheduling and interrupts are still recorded
# (they are causes), but the events attribution reads only for a measured
# thread (its wake-ups, migrations, page faults, the timers it sleeps on)
# are not: under the kcapture bench's flood these were 13 % of the events
# in a probe's window (the flood's paced sends alone arm 7 k timers and
# take 7 k wake-ups a second). ``comm`` is the event's target task;
# ``COMM`` the task it fired in.
NOT_MEASURED = ["ld:*", "ls-agent", "ls-ctl", "ls-kcapture", "ls-netem", "ls-sync*"]
PER_THREAD = {
    "sched:sched_wakeup": "comm",
    "sched:sched_waking": "comm",
    "sched:sched_migrate_task": "comm",
    "exceptions:page_fault_user": "COMM",
    "timer:hrtimer_start": "COMM",
}


#: where an event says which CPU it concerns, when that is not the CPU it fires on
CPU_FIELDS = {"sched:sched_waking": ["target_cpu"], "sched:sched_wakeup": ["target_cpu"], "sched:sched_migrate_task": ["orig_cpu", "dest_cpu"]}


def cpu_filter(event: str, cpus: list[int] | None) -> str | None:
    """Only what concerns ``cpus``: an event that fires there, a wake-up aimed
    there (from any CPU), a migration from or to one of them (None: every CPU;
    a rare event, a task moved between cgroups, is kept everywhere)."""
    if not cpus or event == "cgroup:cgroup_attach_task":
        return None
    conds = [f"{f} == {c}" for f in CPU_FIELDS.get(event, ["CPU"]) for c in cpus]
    return conds[0] if len(conds) == 1 else "(" + " || ".join(conds) + ")"


def filter_for(event: str, also_not: list[int] | None = None, cpus: list[int] | None = None) -> str | None:
    """The kernel filter an event is recorded under, or None for all of it.

    ``also_not``: thread ids to leave out of the per-thread events that
    fire in the task itself (the capture's reader passes its own);
    ``cpus``: only what concerns these CPUs (``cpu_filter``)."""
    # unparenthesized: the kernel's parser reads "sym)" as a symbol's name
    parts = [FILTERS[event]] if event in FILTERS else []
    if (on := cpu_filter(event, cpus)) is not None:
        parts.append(on)
    field = PER_THREAD.get(event)
    if field:
        parts += [f'!({field} ~ "{c}")' if "*" in c else f'{field} != "{c}"' for c in NOT_MEASURED]
        if field == "COMM":
            parts += [f"common_pid != {t}" for t in also_not or []]
    return " && ".join(parts) or None


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


class Ready(TypedDict, total=False):
    """The reader's first line: the instance is recording (or why not)."""

    ready: bool
    page_size: int
    cpus: list[int]
    missing: list[str]
    filters: dict[str, str]
    unfiltered: list[str]
    buffer_kb: int
    #: the reader's CPU time when it said ready (its start, the instance made, the ring buffers allocated)
    setup_cpu_s: float
    error: str


class HalfFull(TypedDict):
    """A read the kernel forced (a CPU's buffer half full): when, and how long it took."""

    mono_ns: int
    kernel_ns: int
    read_ns: int
    after: str


class Drained(TypedDict, total=False):
    """The reader's answer to a drain (one segment written), or, at stop, with its totals."""

    seg: int
    events: int
    lost_events: int
    read_ns: int
    bytes_read: int
    error: str
    totals: dict[str, int]
    half_full: list[HalfFull]


class Kept(TypedDict, total=False):
    """The flight recorder's answer to a keep: events kept and read, how long
    tracing was paused (and when, kernel ns), the CPUs whose buffer no longer
    reached back to the window's start, earlier pauses inside the window."""

    kept: int
    read: int
    read_ns: int
    write_ns: int
    paused_ns: int
    pause: list[int]
    short: list[dict[str, int]]
    blind: list[list[int]]
    bytes: int
    error: str
    totals: dict[str, int]
    seq: int  # the keep's number, to match an answer with its question
    age_ns: int  # how long after the window's start it was taken


def run_instances(run_id: str) -> list[str]:
    """The trace instances of run ``run_id`` on this kernel: its agent's
    (``loopscope-<run id>``, as the agent names it) and a second buffer's
    (``-b``). An agent killed outright leaves them recording; the run's
    controller removes them when it ends."""
    tf = tracefs()
    if tf is None:
        return []
    name = run_instance_name(run_id)
    return [n for n in (name, f"{name}-b") if (tf / "instances" / n).is_dir()]


def run_instance_name(run_id: str) -> str:
    """The name of the trace instance a run's agent records into."""
    return f"{INSTANCE_PREFIX}{run_id}"[:60]


def remove_instance(name: str) -> bool:
    """Turn an instance off and remove it (its buffers go with it)."""
    tf = tracefs()
    if tf is None:
        return False
    d = tf / "instances" / name
    if not d.is_dir():
        return False
    try:
        (d / "tracing_on").write_text("0")
    except OSError:
        pass
    why = ""
    for _ in range(50):
        try:
            d.rmdir()
            return True
        except FileNotFoundError:
            return True
        except OSError as e:
            # A reader still holds a buffer open: it is being killed.
            why = e.strerror or str(e)
            time.sleep(0.05)
    sys.stderr.write(f"loopscope: trace instance {name} could not be removed: {why} (loopscope cleanup removes it)\n")
    return False
