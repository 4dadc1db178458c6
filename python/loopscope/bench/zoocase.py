"""The cause zoo's cases: what each injects, the experiment file it runs, what it
needs of this machine (``missing``), and the C injectors the bench builds.
``bench/zoo.py`` runs them; ``bench/zooscore.py`` scores them."""

from __future__ import annotations

import json
import os
import shutil
import subprocess
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Callable

from typing_extensions import TypedDict
from loopscope.errors import RunError
from loopscope.host import shared
from loopscope.kernel import capture
from loopscope import cbuild
from loopscope.host import swapfile
from loopscope.host import cpulimit


Progress = Callable[[str], None] | None


#: the cgroup the throttle case limits (under the cpu controller's root; `loopscope cleanup` removes it)
THROTTLE_GROUP = "ls-zoo-throttle"


PROBE_CPU = 1


OTHER_CPU = 0


HERE = Path(__file__).resolve().parent


class CauseShare(TypedDict):
    cause: str
    share: float


class RemedyTried(TypedDict, total=False):
    """``loopscope advise`` on a case's run, and its follow-up's verdict."""

    offered: str | None
    ratio_p99: float | None
    ci95: list[float] | None
    significant: bool
    tunings: list[dict[str, object]]  # the remedy phase's tunings, as the follow-up file writes them
    why: str
    against: str
    run: str


class CaseResult(TypedDict, total=False):
    """One injected cause, scored (or why it was skipped)."""

    name: str
    #: another recorder's set lacks what shows this cause: which events (the top cause is then no verdict)
    invisible: str
    expected: str
    injected: str
    skipped: str | None
    top_cause: str | None
    top_share: float | None
    expected_share: float
    expected_rank: int | None
    baseline_expected_share: float
    unexplained_share: float
    outliers: int
    baseline_outliers: int
    causes: list[CauseShare]
    run: str
    remedy: RemedyTried
    #: rtla's rule on the same outliers: its most-blamed label (by outlier time), and whether that is the expected cause
    baseline_top: str | None
    baseline_ok: bool
    #: the injected phase's p99 lateness by the program's own clock, and by loopscope's kernel capture alone
    self_p99_ns: int | None
    loopscope_p99_ns: int | None
    #: the slowdown case: the injected phase's median run time of the same work over the baseline's
    run_time_ratio: float | None


@dataclass
class Case:
    """One injected cause: the experiment's loads and tunings for the
    injected phase, what must be there to inject it, and the label explain
    must rank first."""

    name: str
    expected: str
    what: str
    loads: list[dict[str, object]] = field(default_factory=list)
    tunings: list[dict[str, object]] = field(default_factory=list)
    # loads of the baseline phase (what the injected phase changes back)
    baseline: list[dict[str, object]] = field(default_factory=list)
    # a process the bench starts outside the lab, gated by the phase ([]: none,
    # the probe reads the gate itself)
    outside: list[str] | None = None
    needs: list[str] = field(default_factory=list)
    # labels counted as the expected cause (the kernel may run it either way)
    also: list[str] = field(default_factory=list)
    # the probe, when not the timer on PROBE_CPU (its name must be t)
    probe: dict[str, Any] | None = None
    # a swap file of this many MiB for the case (turned off and deleted after)
    swap_mb: int = 0
    # a cgroup with a CPU limit for the case (name, quota µs, period µs), made before its run and removed after
    cpu_limit: tuple[str, int, int] | None = None
    # the measured program's threads (a name prefix) whose own lateness is compared with loopscope's from the kernel
    self_check: str | None = None
    # a real-time spinner that only RT throttling (sched_rt_runtime_us) keeps from holding its CPU for good
    rt_spinner: bool = False
    # tunings of every phase (the baseline's too): the same ground for both
    every_phase: list[dict[str, object]] = field(default_factory=list)
    # the probe's table is a shared-memory file of the bench's (host/shared.py), removed after the case
    shared: bool = False


def cases(zoo: str, lockprog: str, table: str, ping: str = "zoo-ping") -> list[Case]:
    """The named cases, in order. ``zoo`` is the built ls-zoo program,
    ``lockprog``, ``table`` and ``ping`` the zoo-lock, zoo-table and
    zoo-ping program probes."""
    return [*_neighbour_cases(zoo, ping), *_program_cases(zoo, lockprog, table), *_contention_cases(zoo, lockprog, table)]


def _neighbour_cases(zoo: str, ping: str) -> list[Case]:
    """What runs beside the probe: a hog, a real-time process, a packet flood, timers, cross-CPU calls, timer slack."""
    c, o = PROBE_CPU, OTHER_CPU
    return [
        Case(
            "hog",
            "load: hog",
            f"a CPU hog at nice -20 on CPU {c}, a load of the lab",
            loads=[{"name": "hog", "kind": "command", "command": ["nice", "-n", "-20", "stress-ng", "--cpu", "1", "--taskset", str(c), "--quiet"]}],
            needs=["stress-ng", "nice"],
        ),
        Case(
            "fifo",
            "thread: zoo-fifo",
            f"a SCHED_FIFO process outside the lab, busy 2 ms in every 20 ms on CPU {c}",
            outside=[zoo, "fifo", "--cpu", str(c), "--prio", "10", "--burst-us", "2000", "--period-us", "20000"],
        ),
        Case(
            "netrx",
            "softirq: NET_RX",
            f"a UDP flood into the probe's host, its receive steered to CPU {c} (RPS on lo), the sender on CPU {o}",
            loads=[{"name": "flood", "kind": "net", "protocol": "udp", "rate": "unlimited", "size": 64, "dest": "127.0.0.1:9"}],
            tunings=[
                {"kind": "affinity", "load": "flood", "cpus": [o]},
                {"kind": "write", "path": "/sys/class/net/lo/queues/rx-0/rps_cpus", "value": f"{1 << c:x}"},
            ],
            needs=["/sys/class/net/lo/queues/rx-0/rps_cpus"],
            also=["thread: ksoftirqd"],
        ),
        # the probe is woken by a thread on the other CPU, not by a timer of
        # its own: a timer probe's own wake-up comes in the timer interrupt,
        # which is then in every window, baseline included (5-25 % of a quiet
        # baseline's outlier time here)
        Case(
            "timers",
            "timer interrupt",
            f"500 high-resolution timers expiring together every 997 µs on CPU {c} (perf cpu-clock events), while a thread there is woken every 1 ms from CPU {o}",
            probe={
                "kind": "program",
                "name": "t",
                "command": [ping, "--waker-cpu", str(o), "--period-us", "1000"],
                "cpu": [c],
                "attribute": ["ping/wake"],
                "wakeup": ["ping/wake"],
            },
            loads=[{"name": "timers", "kind": "command", "command": [zoo, "timers", "--cpu", str(c), "--events", "500", "--period-us", "997"]}],
            also=["softirq: HRTIMER"],
        ),
        Case(
            "ipi",
            "IPI: function call",
            f"cross-CPU function calls from a SCHED_IDLE task on CPU {o} to CPU {c} (enabling and disabling a group of 128 perf events there)",
            loads=[{"name": "ipi", "kind": "command", "command": [zoo, "ipi", "--target", str(c), "--cpu", str(o), "--group", "128", "--gap-us", "10"]}],
        ),
        Case(
            "slack",
            "timer slack",
            "5 ms of timer slack on the probe's threads (/proc/TID/timerslack_ns; 1 ns in the baseline phase, not the default 50 µs)",
            loads=[{"name": "slack", "kind": "command", "command": [zoo, "slack", "--prefix", "ls-timer", "--ns", "5000000", "--cpu", str(o)]}],
            baseline=[{"name": "noslack", "kind": "command", "command": [zoo, "slack", "--prefix", "ls-timer", "--ns", "1", "--cpu", str(o)]}],
        ),
    ]


def _program_cases(zoo: str, lockprog: str, table: str) -> list[Case]:
    """What happens to a program: its memory paged out, a lock another of its threads holds, its cgroup's CPU limit."""
    c, o = PROBE_CPU, OTHER_CPU
    return [
        Case(
            "faults",
            "page faults",
            f"a control loop on CPU {c} whose 64 MiB lookup table is not locked in memory, paged out to swap every 20 ms from CPU {o} (process_madvise MADV_PAGEOUT: memory pressure aimed at it)",
            probe={
                "kind": "program",
                "name": "t",
                "command": [table, "--cpu", str(c), "--table-mib", "64"],
                "attribute": ["loop/cycle"],
                "wakeup": ["loop/cycle"],
            },
            loads=[
                {
                    "name": "pageout",
                    "kind": "command",
                    "command": [zoo, "pageout", "--prefix", "zoo-table", "--every-ms", "20", "--max-kib", "131072", "--cpu", str(o)],
                }
            ],
            swap_mb=256,
        ),
        Case(
            "blocked",
            "blocked: zoo-holder",
            f"a program whose thread on CPU {c} waits for a mutex another of its threads (zoo-holder, CPU {o}) holds 3 ms in every 8 ms",
            probe={
                "kind": "program",
                "name": "t",
                "command": [lockprog, "--cpu", str(c), "--holder-cpu", str(o), "--gate", "{gate}"],
                "attribute": ["lock/wait"],
            },
            outside=[],
        ),
        Case(
            "throttle",
            f"throttled: /{THROTTLE_GROUP}",
            f"a SCHED_OTHER control loop on CPU {c} in a cgroup allowed 20 ms of CPU every 100 ms, its quota spent by a busy sibling in the group on CPU {c}",
            probe={
                "kind": "program",
                "name": "t",
                "command": [table, "--cpu", str(c), "--table-mib", "1", "--lookups", "16", "--mlock"],
                "attribute": ["loop/cycle"],
                "wakeup": ["loop/cycle"],
            },
            loads=[
                {
                    "name": "limit",
                    "kind": "command",
                    "command": [zoo, "throttle", "--prefix", "zoo-table", "--group", THROTTLE_GROUP, "--cpu", str(c), "--scan-cpu", str(o)],
                }
            ],
            cpu_limit=(THROTTLE_GROUP, 20_000, 100_000),
            self_check="zoo-table",
        ),
    ]


def _contention_cases(zoo: str, lockprog: str, table: str) -> list[Case]:
    """What a program shares and loses: its CPU's real-time budget, a cache line another CPU writes, a lock's holder preempted."""
    c, o = PROBE_CPU, OTHER_CPU
    return [
        Case(
            "rt-throttle",
            "throttled: RT",
            f"a SCHED_FIFO spinner (priority 10, a load) on CPU {c} spends the CPU's real-time budget (sched_rt_runtime_us of every "
            f"sched_rt_period_us); the probe, a 50 Hz loop SCHED_FIFO 80 on CPU {c}, is held with every real-time task there until the next period",
            # every 20 ms: a throttle (the last 50 ms of each second here) holds one of its wake-ups in 50, a p99 one
            probe={"kind": "timer", "name": "t", "interval_us": 20000, "cpu": [c], "priority": 80},
            loads=[
                {
                    "name": "spin",
                    "kind": "command",
                    "command": [zoo, "fifo", "--cpu", str(c), "--prio", "10", "--burst-us", "1000000", "--period-us", "1000000"],
                }
            ],
            needs=["/proc/sys/kernel/sched_rt_runtime_us"],
            rt_spinner=True,
        ),
        # a neighbour on CPU 0 (stress-ng --cache or --stream) moved the work's run time here by -40 % to +90 % from
        # one run to the next, less than the host's own noise: the thrasher runs on the program's CPU instead, at
        # SCHED_IDLE, so it runs only while the program sleeps and nothing the kernel records is inside its work
        Case(
            "slowdown",
            "slowed: no kernel event",
            f"a program on CPU {c} doing the same work every 4 ms (a chain of 16,000 dependent reads through a 512 KiB table in shared memory), "
            f"while a neighbour on CPU {o} writes to every cache line of that table: each read takes the line back from the other CPU's cache, "
            "so the work takes longer with no kernel event inside it",
            probe={
                "kind": "program",
                "name": "t",
                "command": [
                    table,
                    "--cpu",
                    str(c),
                    "--table-kib",
                    "512",
                    "--lookups",
                    "16000",
                    "--chase",
                    "--period-us",
                    "4000",
                    "--mlock",
                    "--shm",
                    str(shared.path()),
                ],
                "attribute": ["loop/work"],
            },
            # (a cache thrasher on the same CPU, stress-ng --cache at SCHED_IDLE, slowed this work 1.4-3.3x on one host and not at all on
            # another, whose L1 and L2 came back cold to the work anyway; nor did stress-ng --stream on the other CPU, with tables of
            # 16 KiB to 256 MiB: docs/benchmarks.md. Lines another CPU writes are missed on any host.)
            loads=[{"name": "writer", "kind": "command", "command": [zoo, "share", "--path", str(shared.path()), "--cpu", str(o)]}],
            # an idle vCPU here comes back late by up to milliseconds (the host), more than the work's own slowdown: no deep idle in any phase
            every_phase=[{"kind": "dma_latency", "us": 0}],
            shared=True,
        ),
        Case(
            "inversion",
            "blocked: zoo-holder \u2190 preempted by load: hog",
            f"a SCHED_FIFO thread on CPU {c} waits for a mutex (no priority inheritance) that a SCHED_OTHER thread (zoo-holder, CPU {o}) holds 1.5 ms in every 2 ms, "
            f"while a SCHED_FIFO hog of lower priority, busy 4 ms in every 10 ms on CPU {o}, preempts the holder",
            probe={
                "kind": "program",
                "name": "t",
                "command": [lockprog, "--cpu", str(c), "--holder-cpu", str(o), "--hold-us", "1500", "--every-us", "2000", "--fifo", "50"],
                "attribute": ["lock/wait"],
            },
            loads=[{"name": "hog", "kind": "command", "command": [zoo, "fifo", "--cpu", str(o), "--prio", "10", "--burst-us", "4000", "--period-us", "10000"]}],
        ),
    ]


def bursts_case(zoo: str, log: Path) -> Case:
    """Known answers for time: a 1 ms SCHED_FIFO spin every 50 ms on the
    probe's CPU, each burst's start and end logged by the injector (each
    holds the 1 kHz probe's one wake-up inside it, 2 % of them: the
    phase's p99; a 200 µs burst every 100 ms held one wake-up in 500,
    below the p99 and the CPU's own idle exits)."""
    c = PROBE_CPU
    return Case(
        "bursts",
        "load: bursts",
        f"a 1 ms SCHED_FIFO spin every 50 ms on CPU {c}, each burst's start and end written by the injector",
        loads=[
            {
                "name": "bursts",
                "kind": "command",
                "command": [zoo, "bursts", "--cpu", str(c), "--prio", "10", "--burst-us", "1000", "--period-us", "50000", "--log", str(log)],
            }
        ],
    )


SPEC_HEAD = """# loopscope bench explain: case {name} ({what})
name: zoo-{name}
hosts: [{{name: h1, kind: local}}]
probes:
  - {probe}
"""


def spec_text(case: Case, duration_s: float, reps: int, gate: Path | None, capture: bool = True) -> str:
    loads = [*case.loads, *case.baseline]
    names = [ld["name"] for ld in case.loads]
    if gate is not None:
        gate.touch()
        loads.append({"name": "gate", "kind": "command", "command": ["flock", str(gate), "sleep", "100000"]})
        names.append("gate")
    probe = case.probe or {"kind": "timer", "name": "t", "interval_us": 1000, "cpu": [PROBE_CPU]}
    probe = json.loads(json.dumps(probe).replace("{gate}", str(gate)))
    body = SPEC_HEAD.format(name=case.name, what=case.what, probe=json.dumps(probe))
    body += "loads:\n" + "".join(f"  - {json.dumps(ld)}\n" for ld in loads) if loads else "loads: []\n"
    body += f"phases:\n  - {{name: baseline, loads: {json.dumps([ld['name'] for ld in case.baseline])}, tunings: {json.dumps(case.every_phase)}}}\n"
    body += f"  - {{name: injected, loads: {json.dumps(names)}, tunings: {json.dumps([*case.every_phase, *case.tunings])}}}\n"
    body += f"duration: {duration_s:g}s\nwarmup: 0.5s\nrepetitions: {reps}\n"
    if not capture:  # another recorder records the kernel (bench/recorders.py)
        body += "kernel: {capture: off}\n"
    return body


def missing(case: Case) -> str | None:
    """Why this machine cannot inject the case, or None."""
    if (os.cpu_count() or 1) < 2:
        return "needs two CPUs (the probe on one, the injectors' senders on the other)"
    if os.geteuid() != 0:
        return "needs root (SCHED_FIFO, perf events on a CPU, timer slack of another process, kernel capture)"
    for n in case.needs:
        if n.startswith("/"):
            if not Path(n).exists():
                return f"{n} does not exist on this kernel"
        elif shutil.which(n) is None:
            return f"{n} is not installed (scripts/install-deps.sh test installs it)"
    if case.swap_mb:
        why = swapfile.missing()
        if why:
            return why
    if case.rt_spinner and (why := _rt_throttling_off()):
        return why
    if case.cpu_limit:
        why = cpulimit.missing()
        if why:
            return why

    _, _, refused = capture.available()
    return f"no kernel capture: {refused}" if refused else None


def _rt_throttling_off() -> str | None:
    """Why a real-time spinner must not run here: with RT throttling off
    nothing would ever take its CPU back (None: it is on)."""
    try:
        runtime = int(Path("/proc/sys/kernel/sched_rt_runtime_us").read_text())
        period = int(Path("/proc/sys/kernel/sched_rt_period_us").read_text())
    except (OSError, ValueError) as e:
        return f"cannot read the RT throttling settings: {e}"
    if runtime < 0 or runtime >= period:
        return f"RT throttling is off (sched_rt_runtime_us {runtime} of sched_rt_period_us {period}): a SCHED_FIFO spinner would keep its CPU for good"
    return None


def build_zoo(work: Path) -> dict[str, str]:
    """ls-zoo, zoo-lock, zoo-poll and zoo-table, compiled here: the
    injectors, and the programs the program probes run (built against
    loopscope's C library as a user's program is)."""

    out = work / "ls-zoo"
    r = subprocess.run([cbuild.compiler(), "-O2", "-pthread", str(HERE / "zoo_inject.c"), "-o", str(out)], capture_output=True, text=True)
    if r.returncode != 0:
        raise RunError(f"bench explain: building ls-zoo failed: {r.stderr.strip()[-600:]}")
    progs = {"zoo": str(out)}
    for name in ("lock", "poll", "table", "ping"):
        progs[name] = str(cbuild.build([HERE / f"zoo_{name}.c"], work / f"zoo-{name}"))
    return progs
