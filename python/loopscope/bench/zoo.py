"""``loopscope bench explain``: explain scored against injected causes.

A classifier is trusted once it has been scored on cases whose answer is
known. Each case here is a short experiment on this machine: a timer probe
on one CPU (``PROBE_CPU``), a ``baseline`` phase and an ``injected`` phase
in alternating repetitions, where the injected phase adds one known cause of
lateness with a real program (stress-ng, ``ls-zoo``: the small C program in
``zoo_inject.c``, built by the bench, or a tuning of the kernel). The run is
then explained exactly as a user's run is (``analysis.explain``), and the
case is scored on what explain says of the injected phase's outliers (above
its p99): the cause ranked first, the expected cause's share and rank, its
share in the baseline phase (it must be absent there) and the share nobody
explains.

The expected cause is declared by the case, never inferred from the run.
A case this machine cannot inject (no stress-ng, one CPU, a missing kernel
feature) is reported ``skipped`` with the reason and is never counted as
passed: ``accuracy`` is over the named cases, skipped ones counting as
misses.

Injectors live either inside the lab (a ``command`` load of the injected
phase: the lab starts and stops it with the phase) or, when the case is
about a process the lab does not know (``fifo``), outside it: then a gate
load of the injected phase holds a lock on a file (``flock FILE sleep``),
and the injector acts only while the lock is held (the kernel releases it
when the load dies, however it dies). Every injector dies with the bench
(``PR_SET_PDEATHSIG``) and gives back what it changed on SIGTERM; the lab
gives back its tunings on every exit path.
"""

from __future__ import annotations

import json
import os
import shutil
import signal
import subprocess
import sys
import tempfile
import time
from dataclasses import dataclass, field, replace
from pathlib import Path
from typing import Any, Callable

from typing_extensions import NotRequired, TypedDict

from loopscope.analysis.explained import ExplainDoc, Group

from loopscope.errors import RunError
from loopscope.host import shared
from loopscope.kernel import capture
from loopscope import cbuild
from loopscope.kernel import store as S
from loopscope.rundir import RunDir

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
    tunings: list[dict[str, Any]]  # the remedy phase's tunings, as the follow-up file writes them
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


class AnomalyResult(TypedDict, total=False):
    """One of the study's anomalies: detected, measured and named (or skipped)."""

    name: str
    injected_ns: int
    #: what the detector must measure: ``injected_ns``, or for quantization the tick when the CPU's tick kept running
    #: (it ends each sleep the slack holds open before the slack does)
    expected_ns: int
    #: quantization: the timer interrupts a second on the probe's CPU during the run (the kernel's HZ when its tick never stopped)
    ticks_per_s: float | None
    expected: str
    injected: str
    detected_ns: int | None
    cause: str | None
    ok: bool
    skipped: str | None
    finding: str | None
    cause_share: float | None
    windows_with_cause: int | None
    windows: int | None
    run: str


class ZooBench(TypedDict):
    """What ``loopscope bench explain --json`` prints."""

    remedies_that_helped: list[str] | None
    cases: list[CaseResult]
    accuracy: float | None
    #: the same score for rtla's rule (blame whoever ran when the timer fired) on the same outliers
    baseline_accuracy: float | None
    #: the bursts case (known lengths at known instants; not among the named cases): its entry, and the median
    #: absolute difference between the time explain gives the bursts in each outlier and the bursts' overlap with it
    bursts: NotRequired[CaseResult | None]
    duration_error_us: NotRequired[float | None]
    #: who recorded the kernel (native: loopscope's capture), the event set, and its tracepoints
    recorder: NotRequired[str]
    events: NotRequired[str]
    event_list: NotRequired[list[str]]
    anomalies: list[AnomalyResult]
    ran: int
    skipped: int
    settings: dict[str, str | float | int]
    seconds: float
    workdir: str


@dataclass
class Case:
    """One injected cause: the experiment's loads and tunings for the
    injected phase, what must be there to inject it, and the label explain
    must rank first."""

    name: str
    expected: str
    what: str
    loads: list[dict[str, Any]] = field(default_factory=list)
    tunings: list[dict[str, Any]] = field(default_factory=list)
    # loads of the baseline phase (what the injected phase changes back)
    baseline: list[dict[str, Any]] = field(default_factory=list)
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
    c, o = PROBE_CPU, OTHER_CPU
    return [
        Case("hog", "load: hog", f"a CPU hog at nice -20 on CPU {c}, a load of the lab",
             loads=[{"name": "hog", "kind": "command", "command": ["nice", "-n", "-20", "stress-ng", "--cpu", "1", "--taskset", str(c), "--quiet"]}],
             needs=["stress-ng", "nice"]),
        Case("fifo", "thread: zoo-fifo", f"a SCHED_FIFO process outside the lab, busy 2 ms in every 20 ms on CPU {c}",
             outside=[zoo, "fifo", "--cpu", str(c), "--prio", "10", "--burst-us", "2000", "--period-us", "20000"]),
        Case("netrx", "softirq: NET_RX", f"a UDP flood into the probe's host, its receive steered to CPU {c} (RPS on lo), the sender on CPU {o}",
             loads=[{"name": "flood", "kind": "net", "protocol": "udp", "rate": "unlimited", "size": 64, "dest": "127.0.0.1:9"}],
             tunings=[{"kind": "affinity", "load": "flood", "cpus": [o]},
                      {"kind": "write", "path": "/sys/class/net/lo/queues/rx-0/rps_cpus", "value": f"{1 << c:x}"}],
             needs=["/sys/class/net/lo/queues/rx-0/rps_cpus"], also=["thread: ksoftirqd"]),
        # the probe is woken by a thread on the other CPU, not by a timer of
        # its own: a timer probe's own wake-up comes in the timer interrupt,
        # which is then in every window, baseline included (5-25 % of a quiet
        # baseline's outlier time here)
        Case("timers", "timer interrupt", f"500 high-resolution timers expiring together every 997 µs on CPU {c} (perf cpu-clock events), while a thread there is woken every 1 ms from CPU {o}",
             probe={"kind": "program", "name": "t", "command": [ping, "--waker-cpu", str(o), "--period-us", "1000"], "cpu": [c], "attribute": ["ping/wake"], "wakeup": ["ping/wake"]},
             loads=[{"name": "timers", "kind": "command", "command": [zoo, "timers", "--cpu", str(c), "--events", "500", "--period-us", "997"]}],
             also=["softirq: HRTIMER"]),
        Case("ipi", "IPI: function call", f"cross-CPU function calls from a SCHED_IDLE task on CPU {o} to CPU {c} (enabling and disabling a group of 128 perf events there)",
             loads=[{"name": "ipi", "kind": "command", "command": [zoo, "ipi", "--target", str(c), "--cpu", str(o), "--group", "128", "--gap-us", "10"]}]),
        Case("slack", "timer slack", "5 ms of timer slack on the probe's threads (/proc/TID/timerslack_ns; 1 ns in the baseline phase, not the default 50 µs)",
             loads=[{"name": "slack", "kind": "command", "command": [zoo, "slack", "--prefix", "ls-timer", "--ns", "5000000", "--cpu", str(o)]}],
             baseline=[{"name": "noslack", "kind": "command", "command": [zoo, "slack", "--prefix", "ls-timer", "--ns", "1", "--cpu", str(o)]}]),
        Case("faults", "page faults", f"a control loop on CPU {c} whose 64 MiB lookup table is not locked in memory, paged out to swap every 20 ms from CPU {o} (process_madvise MADV_PAGEOUT: memory pressure aimed at it)",
             probe={"kind": "program", "name": "t", "command": [table, "--cpu", str(c), "--table-mib", "64"], "attribute": ["loop/cycle"], "wakeup": ["loop/cycle"]},
             loads=[{"name": "pageout", "kind": "command", "command": [zoo, "pageout", "--prefix", "zoo-table", "--every-ms", "20", "--max-kib", "131072", "--cpu", str(o)]}],
             swap_mb=256),
        Case("blocked", "blocked: zoo-holder", f"a program whose thread on CPU {c} waits for a mutex another of its threads (zoo-holder, CPU {o}) holds 3 ms in every 8 ms",
             probe={"kind": "program", "name": "t", "command": [lockprog, "--cpu", str(c), "--holder-cpu", str(o), "--gate", "{gate}"], "attribute": ["lock/wait"]},
             outside=[]),
        Case("throttle", f"throttled: /{THROTTLE_GROUP}", f"a SCHED_OTHER control loop on CPU {c} in a cgroup allowed 20 ms of CPU every 100 ms, its quota spent by a busy sibling in the group on CPU {c}",
             probe={"kind": "program", "name": "t", "command": [table, "--cpu", str(c), "--table-mib", "1", "--lookups", "16", "--mlock"], "attribute": ["loop/cycle"], "wakeup": ["loop/cycle"]},
             loads=[{"name": "limit", "kind": "command", "command": [zoo, "throttle", "--prefix", "zoo-table", "--group", THROTTLE_GROUP, "--cpu", str(c), "--scan-cpu", str(o)]}],
             cpu_limit=(THROTTLE_GROUP, 20_000, 100_000), self_check="zoo-table"),
        Case("rt-throttle", "throttled: RT",
             f"a SCHED_FIFO spinner (priority 10, a load) on CPU {c} spends the CPU's real-time budget (sched_rt_runtime_us of every "
             f"sched_rt_period_us); the probe, a 50 Hz loop SCHED_FIFO 80 on CPU {c}, is held with every real-time task there until the next period",
             # every 20 ms: a throttle (the last 50 ms of each second here) holds one of its wake-ups in 50, a p99 one
             probe={"kind": "timer", "name": "t", "interval_us": 20000, "cpu": [c], "priority": 80},
             loads=[{"name": "spin", "kind": "command", "command": [zoo, "fifo", "--cpu", str(c), "--prio", "10", "--burst-us", "1000000", "--period-us", "1000000"]}],
             needs=["/proc/sys/kernel/sched_rt_runtime_us"], rt_spinner=True),
        # a neighbour on CPU 0 (stress-ng --cache or --stream) moved the work's run time here by -40 % to +90 % from
        # one run to the next, less than the host's own noise: the thrasher runs on the program's CPU instead, at
        # SCHED_IDLE, so it runs only while the program sleeps and nothing the kernel records is inside its work
        Case("slowdown", "slowed: no kernel event",
             f"a program on CPU {c} doing the same work every 4 ms (a chain of 16,000 dependent reads through a 512 KiB table in shared memory), "
             f"while a neighbour on CPU {o} writes to every cache line of that table: each read takes the line back from the other CPU's cache, "
             "so the work takes longer with no kernel event inside it",
             probe={"kind": "program", "name": "t", "command": [table, "--cpu", str(c), "--table-kib", "512", "--lookups", "16000", "--chase", "--period-us", "4000",
                                                                 "--mlock", "--shm", str(shared.path())],
                    "attribute": ["loop/work"]},
             # (a cache thrasher on the same CPU, stress-ng --cache at SCHED_IDLE, slowed this work 1.4-3.3x on one host and not at all on
             # another, whose L1 and L2 came back cold to the work anyway; nor did stress-ng --stream on the other CPU, with tables of
             # 16 KiB to 256 MiB: docs/benchmarks.md. Lines another CPU writes are missed on any host.)
             loads=[{"name": "writer", "kind": "command", "command": [zoo, "share", "--path", str(shared.path()), "--cpu", str(o)]}],
             # an idle vCPU here comes back late by up to milliseconds (the host), more than the work's own slowdown: no deep idle in any phase
             every_phase=[{"kind": "dma_latency", "us": 0}], shared=True),
        Case("inversion", "blocked: zoo-holder \u2190 preempted by load: hog",
             f"a SCHED_FIFO thread on CPU {c} waits for a mutex (no priority inheritance) that a SCHED_OTHER thread (zoo-holder, CPU {o}) holds 1.5 ms in every 2 ms, "
             f"while a SCHED_FIFO hog of lower priority, busy 4 ms in every 10 ms on CPU {o}, preempts the holder",
             probe={"kind": "program", "name": "t", "command": [lockprog, "--cpu", str(c), "--holder-cpu", str(o), "--hold-us", "1500", "--every-us", "2000", "--fifo", "50"],
                    "attribute": ["lock/wait"]},
             loads=[{"name": "hog", "kind": "command", "command": [zoo, "fifo", "--cpu", str(o), "--prio", "10", "--burst-us", "4000", "--period-us", "10000"]}]),
    ]


def bursts_case(zoo: str, log: Path) -> Case:
    """Known answers for time: a 1 ms SCHED_FIFO spin every 50 ms on the
    probe's CPU, each burst's start and end logged by the injector (each
    holds the 1 kHz probe's one wake-up inside it, 2 % of them: the
    phase's p99; a 200 µs burst every 100 ms held one wake-up in 500,
    below the p99 and the CPU's own idle exits)."""
    c = PROBE_CPU
    return Case("bursts", "load: bursts", f"a 1 ms SCHED_FIFO spin every 50 ms on CPU {c}, each burst's start and end written by the injector",
                loads=[{"name": "bursts", "kind": "command", "command": [zoo, "bursts", "--cpu", str(c), "--prio", "10", "--burst-us", "1000",
                                                                          "--period-us", "50000", "--log", str(log)]}])


def duration_error_us(run_dir: Path, log: Path, label: str = "load: bursts") -> float | None:
    """The median, over the injected phase's outliers that a burst overlaps
    or explain gives the label, of |time explain gives the label − the
    bursts' overlap with the outlier's window|, in µs (None: no such outlier).
    Where a burst was running when the probe's timer fired (the window's
    start), that timer's interrupt (and the soft interrupts after it) ran
    inside the burst's span by the injector's clock: the overlap leaves it
    out, as explain names it apart."""
    import numpy as np
    import polars as pl

    p = run_dir / "tables" / "attribution.parquet"
    if not p.exists() or not log.exists():
        return None
    b = np.array([[int(x) for x in ln.split()] for ln in log.read_text().splitlines() if len(ln.split()) == 2], dtype=np.int64).reshape(-1, 2)
    a = pl.read_parquet(p).filter((pl.col("phase") == "injected") & ((pl.col("probe") == "t") | pl.col("probe").str.starts_with("t ")))
    irq = pl.col("cause").str.starts_with("softirq: ") | (pl.col("cause") == "timer interrupt")
    per = a.group_by("id").agg(pl.col("t_ns").first(), pl.col("latency_ns").first(), pl.col("ns").filter(pl.col("cause") == label).sum().alias("named"),
                               pl.col("ns").filter(irq).sum().alias("tick"))
    errs = []
    for t, lat, named, tick in per.select("t_ns", "latency_ns", "named", "tick").iter_rows():
        lo, hi = int(t), int(t) + int(lat)
        overlap = int(np.clip(np.minimum(b[:, 1], hi) - np.maximum(b[:, 0], lo), 0, None).sum()) if len(b) else 0
        if overlap and ((b[:, 0] <= lo) & (b[:, 1] > lo)).any():
            # the probe's own timer fired inside the burst: its interrupt is in the injector's clock, and explain names it
            overlap = max(0, overlap - int(tick or 0))
        if overlap or named:
            errs.append(abs(int(named or 0) - overlap))
    return float(np.median(errs)) / 1e3 if errs else None


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
        from loopscope.host import swapfile

        why = swapfile.missing()
        if why:
            return why
    if case.rt_spinner and (why := _rt_throttling_off()):
        return why
    if case.cpu_limit:
        from loopscope.host import cpulimit

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


def _group(res: ExplainDoc, phase: str) -> Group | None:
    return next((g for g in res["groups"] if (g["probe"] == "t" or g["probe"].startswith("t ")) and g["phase"] == phase), None)


def _share(g: Group | None, labels: list[str]) -> float:
    if not g:
        return 0.0
    return sum(c["share"] or 0.0 for c in g.get("all_causes", []) if c["cause"] in labels)


def score(case: Case, res: ExplainDoc) -> CaseResult:
    """What explain said of the case's phases, against the declared cause."""
    labels = [case.expected, *case.also]
    inj, base = _group(res, "injected"), _group(res, "baseline")
    causes = inj.get("all_causes", []) if inj else []
    # the expected cause and the labels counted with it are one cause here
    merged: dict[str, float] = {}
    for c in causes:
        key = case.expected if c["cause"] in labels else c["cause"]
        merged[key] = merged.get(key, 0.0) + (c["share"] or 0.0)
    ranked = sorted(merged.items(), key=lambda kv: -kv[1])
    rank = next((i + 1 for i, (k, _) in enumerate(ranked) if k == case.expected), None)
    return {
        "name": case.name, "expected": case.expected, "injected": case.what,
        "top_cause": ranked[0][0] if ranked else None, "top_share": ranked[0][1] if ranked else None,
        "expected_share": merged.get(case.expected, 0.0), "expected_rank": rank,
        "baseline_expected_share": _share(base, labels),
        "unexplained_share": merged.get("unexplained", 0.0),
        "outliers": inj["outliers"] if inj else 0, "baseline_outliers": base["outliers"] if base else 0,
        "causes": [{"cause": k, "share": v} for k, v in ranked[:6]],
        "skipped": None,
    }


def self_and_kernel_p99(run_dir: Path, comm: str, phase: str) -> tuple[int | None, int | None]:
    """A phase's p99 lateness of the measured program by its own clock (the
    intervals it logged, deadline to its work's end) and by loopscope from
    the kernel alone (the timer lateness of its threads named ``comm``*, in
    that phase's steps)."""
    import polars as pl

    from loopscope.analysis.explain import windows_of
    from loopscope.analysis.threads import thread_activations, thread_names
    from loopscope.kinds import KINDS

    run = RunDir(run_dir).record()
    caps = [c for c in run.captures if c.data]
    spans = [(s.spawn_mono_ns, s.end_mono_ns) for s in run.steps if s.phase == phase]
    if not caps or not spans:
        return None, None
    w, _ = windows_of(run_dir, run, KINDS, caps)
    own = w.filter(pl.col("phase").cast(pl.String) == phase)["latency_ns"]
    st = S.open_capture(run_dir, caps[0])
    act = thread_activations(st, [t for t, n in thread_names(st).items() if n.startswith(comm)])
    inside = pl.any_horizontal([pl.col("on_ns").is_between(a, b) for a, b in spans])
    kernel = act.filter(inside & pl.col("complete"))["timer_lateness_ns"].drop_nulls()

    def p99(x: pl.Series) -> int | None:
        q = x.quantile(0.99, "linear") if len(x) else None
        return int(q) if q is not None else None

    return p99(own), p99(kernel)


def run_time_ratio(run_dir: Path) -> float | None:
    """The injected phase's median span of the probe over the baseline's: how much longer the same work took."""
    import polars as pl

    from loopscope.analysis.explain import windows_of
    from loopscope.kinds import KINDS

    run = RunDir(run_dir).record()
    w, _ = windows_of(run_dir, run, KINDS, [c for c in run.captures if c.data])
    med = {str(p): v for p, v in w.filter(pl.col("span")).group_by(pl.col("phase").cast(pl.String)).agg(pl.col("latency_ns").median()).iter_rows()}
    return med["injected"] / med["baseline"] if med.get("baseline") and med.get("injected") is not None else None


def rule_top(run_dir: Path, phase: str) -> str | None:
    """rtla's rule over a phase's outliers of the case's probe: the label it
    blames most, each outlier weighted by its length (as explain's shares
    are), threads grouped by name as explain groups them."""
    import polars as pl

    from loopscope.analysis.attribution import cause_family

    p = run_dir / "tables" / "attribution.parquet"
    if not p.exists():
        return None
    a = pl.read_parquet(p).filter((pl.col("phase") == phase) & ((pl.col("probe") == "t") | pl.col("probe").str.starts_with("t ")))
    if "rule" not in a.columns or not len(a):
        return None
    per = a.group_by("id").agg(pl.col("rule").first(), pl.col("latency_ns").first()).drop_nulls("rule")
    if not len(per):
        return None
    per = per.with_columns(pl.col("rule").map_elements(cause_family, return_dtype=pl.String))
    top = per.group_by("rule").agg(pl.col("latency_ns").sum()).sort("latency_ns", descending=True)
    return str(top["rule"][0])


def _start_outside(argv: list[str], gate: Path, log: Path) -> subprocess.Popen[bytes]:
    with open(log, "ab") as f:
        p = subprocess.Popen([*argv, "--gate", str(gate)], stdout=f, stderr=f, start_new_session=True)
    time.sleep(0.2)
    if p.poll() is not None:
        raise RunError(f"bench explain: the injector {Path(argv[0]).name} {argv[1]} exited at once ({p.returncode}): {log.read_text()[-400:]}")
    return p


def _stop(p: subprocess.Popen[bytes] | None) -> None:
    if p is None or p.poll() is not None:
        return
    try:
        os.killpg(p.pid, signal.SIGTERM)
        p.wait(timeout=5)
    except (ProcessLookupError, subprocess.TimeoutExpired):
        try:
            os.killpg(p.pid, signal.SIGKILL)
        except ProcessLookupError:
            pass
        p.wait()


def remedy_of(case: Case, run_dir: Path, reps: int, say: Callable[[str], None]) -> RemedyTried:
    """``loopscope advise`` on the case's run, as a user would run it, then
    its follow-up experiment: the remedy offered for the expected cause, and
    the remedy phase's p99 over the injected phase's, with its interval."""
    import polars as pl
    import yaml

    fu = run_dir.parent / f"{run_dir.name}-follow-up.yaml"
    a = subprocess.run([sys.executable, "-m", "loopscope.cli", "advise", str(run_dir), "--json", "-o", str(fu)], capture_output=True, text=True, timeout=600)
    if a.returncode != 0:
        return {"offered": None, "ratio_p99": None, "ci95": None, "significant": False, "why": a.stderr.strip()[-300:]}
    j = json.loads(a.stdout.strip().splitlines()[-1])
    mine = [r for r in j["advice"] if r["phase"] == "injected" and r["cause"] in (case.expected, *case.also)]
    offered = mine[0]["remedy"] if mine else None
    out: RemedyTried = {"offered": offered, "ratio_p99": None, "ci95": None, "significant": False, "tunings": []}
    if mine and not mine[0].get("runtime"):
        # a follow-up would try only the other causes' remedies: it proves nothing of this one
        return {**out, "why": f"the remedy for {mine[0]['cause']} is a change to the program ({mine[0]['knob']}): no run-time tuning proves it"}
    if not j.get("follow_up"):
        return {**out, "why": "no remedy a phase can apply at run time"}
    spec = yaml.safe_load(fu.read_text())
    rem = next((p for p in spec.get("phases") or [] if p.get("compare_with") == "injected"), None)
    if rem is None:
        return {**out, "why": "advise offered no remedy for the injected phase"}
    out["tunings"] = rem.get("tunings") or []
    say(f"  {case.name}: the follow-up ({offered or 'remedies of the other causes'}) …")
    fd = next(run_dir.parent / f"remedy-{i}" for i in range(1, 10_000) if not (run_dir.parent / f"remedy-{i}").exists())
    r = subprocess.run([sys.executable, "-m", "loopscope.cli", "run", str(fu), "--run-dir", str(fd), "--repetitions", str(reps)], capture_output=True, text=True, timeout=900)
    if r.returncode != 0:
        return {**out, "why": f"the follow-up run failed: {r.stderr.strip()[-300:]}"}
    c = pl.read_parquet(fd / "tables" / "comparisons.parquet").filter(
        (pl.col("phase") == rem["name"]) & (pl.col("metric") == "p99") & ((pl.col("probe") == "t") | pl.col("probe").str.starts_with("t ")))
    # a program probe has a row per interval: the one the case attributes (zoo-table logs loop/work and loop/cycle)
    if "measure" in c.columns:
        mine_only = c.filter(pl.col("measure").is_in((case.probe or {}).get("attribute") or []))
        c = mine_only if len(mine_only) else c
    if not len(c):
        return {**out, "why": "the follow-up has no p99 of the remedy phase"}
    row = c.row(0, named=True)
    return {**out, "ratio_p99": row["ratio"], "ci95": [row["ratio_lo"], row["ratio_hi"]], "significant": bool(row["significant"] and row["ratio"] < 1),
            "against": row["baseline_phase"], "run": str(fd)}


def run_case(case: Case, work: Path, duration_s: float, reps: int, say: Callable[[str], None], remedies: bool = True,
             recorder: str = "native", events: str = "full") -> CaseResult:
    from loopscope.analysis.explain import explain
    from loopscope.bench import recorders as REC

    why = missing(case) or (REC.missing(recorder) if recorder != "native" else None)
    if why:
        return {"name": case.name, "expected": case.expected, "injected": case.what, "skipped": why}
    if recorder != "native" and case.cpu_limit:
        # no look at the kernel's groups without loopscope's capture: the limit is named without its group
        case = replace(case, also=[*case.also, "throttled: CPU limit"])
    d = work / case.name
    d.mkdir(parents=True, exist_ok=True)
    gate = d / "gate.pid" if case.outside is not None else None
    (d / "spec.yaml").write_text(spec_text(case, duration_s, reps, gate, capture=recorder == "native"))
    run_dir = next(d / f"run-{i}" for i in range(1, 10_000) if not (d / f"run-{i}").exists())
    outside = None
    swap = None
    try:
        if case.cpu_limit:
            from loopscope.host import cpulimit

            cpulimit.make(*case.cpu_limit)
        if case.swap_mb:
            from loopscope.host import swapfile

            swap = swapfile.create(case.swap_mb)
        if case.outside and gate is not None:  # [] : the probe itself reads the gate
            outside = _start_outside(case.outside, gate, d / "injector.log")
        say(f"  {case.name}: {case.what} ({reps} × baseline/injected, {duration_s:g} s each) …")
        cmd = [sys.executable, "-m", "loopscope.cli", "run", str(d / "spec.yaml"), "--run-dir", str(run_dir), "--no-report"]
        present: list[str] | None = None
        if recorder == "native":
            r = subprocess.run(cmd, capture_output=True, text=True, timeout=600)
            if r.returncode != 0:
                raise RunError(f"bench explain: case {case.name}: the run failed ({r.returncode}): {r.stderr.strip()[-800:]}")
        else:
            rec = REC.record(recorder, events, d / ("kernel.dat" if recorder == "trace-cmd" else "perf.data"), cmd)
            status = json.loads((run_dir / "run.json").read_text()).get("status") if (run_dir / "run.json").exists() else None
            if status != "completed":
                raise RunError(f"bench explain: case {case.name}: the run under {recorder} did not complete ({status or 'no run.json'}; see {run_dir})")
            present = REC.attach(run_dir, rec)
            rec.unlink(missing_ok=True)
        say(f"  {case.name}: explaining …")
        from loopscope.kinds import KINDS

        res = explain(run_dir, KINDS, all_causes=True)
        if res is None:
            raise RunError(f"bench explain: case {case.name}: the run has no kernel capture to explain")
        out = score(case, res)
        out["run"] = str(run_dir)
        if present is not None and (inv := REC.invisible(case.expected, set(present))):
            out["invisible"] = inv
        if case.self_check:
            out["self_p99_ns"], out["loopscope_p99_ns"] = self_and_kernel_p99(run_dir, case.self_check, "injected")
        if case.expected == "slowed: no kernel event":
            out["run_time_ratio"] = run_time_ratio(run_dir)
        out["baseline_top"] = rule_top(run_dir, "injected")
        out["baseline_ok"] = out["baseline_top"] in (case.expected, *case.also)
        if remedies:  # the injectors and the swap stay for the follow-up: it runs the injected phase again
            out["remedy"] = remedy_of(case, run_dir, reps, say)
    finally:
        _stop(outside)
        if swap is not None:
            swapfile.remove(swap)
        if case.shared:
            shared.remove(shared.path())
        if case.cpu_limit:
            from loopscope.host import cpulimit

            g = cpulimit.group_dir(case.cpu_limit[0])
            if g is not None:
                cpulimit.remove(g)
    return out


@dataclass
class Anomaly:
    """One of the anomalies Boie & Niehaus 2007 left unexplained, injected:
    the detector that must fire, what it must measure (``injected_ns``,
    within ``tolerance``, or just fire when None) and the cause its finding
    must name."""

    name: str
    detector: str
    expected: str
    what: str
    injected_ns: int
    tolerance: float | None
    probe: dict[str, Any]
    interval: str  # the series: group/name of the probe's intervals
    seconds: float
    loads: list[dict[str, Any]] = field(default_factory=list)
    swap_mb: int = 0


def anomalies(zoo: str, pollprog: str, table: str) -> list[Anomaly]:
    """The three anomalies. A sleep held open by timer slack ends at the
    first interrupt after its deadline: at the slack's end on a quiet CPU
    whose tick stops when idle (NOHZ), so 5 ms of slack quantizes at 5 ms.
    A CPU that keeps its tick running ends those sleeps at the tick instead
    (HZ=250: 4 ms): the run's capture says which (``_quantum``). It kept
    running here while the lab's own helpers still woke every 20-100 ms,
    and on a later day with the lab quiet (264 timer interrupts a second
    on the probe's CPU, the sandbox's own process the only other waker)."""
    c, o = PROBE_CPU, OTHER_CPU
    timer = {"kind": "timer", "name": "t", "interval_us": 1000, "cpu": [c]}
    return [
        Anomaly("periodic", "periodic", "load: burst", f"a SCHED_FIFO burst of 200 ms every 8 s on CPU {c} (a load)", 8_000_000_000, 0.05,
                timer, "timer/wakeup", 44.0,
                loads=[{"name": "burst", "kind": "command", "command": [zoo, "fifo", "--cpu", str(c), "--prio", "10", "--burst-us", "200000", "--period-us", "8000000"]}]),
        Anomaly("quantization", "quantization", "timer slack", f"a thread on CPU {c} polling for work with 50 µs sleeps and 5 ms of timer slack",
                5_000_000, 0.10,
                {"kind": "program", "name": "t", "command": [pollprog, "--cpu", str(c), "--slack-ns", "5000000", "--poll-us", "50"], "attribute": ["poll/wait"]},
                "poll/wait", 20.0),
        Anomaly("warmup", "warm-up", "page faults", f"a cold start: a control loop's unlocked 64 MiB table paged out every 20 ms for the first 4 s (from CPU {o})", 4_000_000_000, None,
                {"kind": "program", "name": "t", "command": [table, "--cpu", str(c), "--table-mib", "64"], "attribute": ["loop/cycle"], "wakeup": ["loop/cycle"]}, "loop/cycle", 16.0,
                loads=[{"name": "squeeze", "kind": "command", "command": [zoo, "pageout", "--prefix", "zoo-table", "--every-ms", "20", "--max-kib", "131072", "--for-ms", "4000", "--cpu", str(o)]}],
                swap_mb=256),
    ]


def _series(run_dir: Path, interval: str) -> list[tuple[int, Any, Any]]:
    """(rep, t_ns, value) of probe t's ``interval`` in every step of the run."""
    import polars as pl

    from loopscope.trace import reader

    g, n = interval.split("/", 1)
    out = []
    for st in RunDir(run_dir).record().steps:
        if st.probe != "t" or not (run_dir / st.trace).exists():
            continue
        df = reader.read(run_dir / st.trace, sort=True)
        iv = df.filter((pl.col("kind").cast(pl.String) == "interval") & (pl.col("group").cast(pl.String) == g) & (pl.col("name").cast(pl.String) == n))
        out.append((st.rep, iv["t_ns"].to_numpy(), iv["dur_ns"].to_numpy()))
    return out


def tick_ns() -> int:
    """The scheduler tick (1/HZ): the resolution of the coarse clocks."""
    coarse = getattr(time, "CLOCK_MONOTONIC_COARSE", 6)  # Linux's number; Python names it on few builds
    return int(round(time.clock_getres(coarse) * 1e9))


def _quantum(run_dir: Path, slack_ns: int) -> tuple[int, float | None]:
    """The quantum timer slack makes on the probe's CPU in this run, and
    the timer interrupts a second there that decide it: a sleep the slack
    holds open ends at the first interrupt after its deadline, the slack's
    end on a CPU whose tick stopped while idle (NOHZ), the tick where it
    kept running (this VM's idle governor keeps it for sleeps this short
    on some days, not on others): min(slack, tick) where the CPU took at
    least half of HZ's ticks."""
    import polars as pl


    kernel = RunDir(run_dir).record().kernel
    caps = [c for c in kernel.captures if c.data] if kernel else []
    if not caps:
        return slack_ns, None
    st = S.open_capture(run_dir, caps[0])
    if "local_timer_entry" not in st.event_names or not st.t_first or not st.t_last:
        return slack_ns, None
    ev = st.load(st.t_first, st.t_last).filter((pl.col("event") == "local_timer_entry") & (pl.col("cpu") == PROBE_CPU))
    ticks = len(ev) / max(1e-9, (st.t_last - st.t_first) / 1e9)
    tick = tick_ns()
    return (min(slack_ns, tick) if ticks >= 0.5e9 / tick else slack_ns), round(ticks, 1)


def run_anomaly(an: Anomaly, work: Path, say: Callable[[str], None]) -> AnomalyResult:
    """Run one anomaly's experiment, then its detector and explain on it."""
    import polars as pl

    from loopscope.analysis.detectors import detect
    from loopscope.analysis.explain import causes_in, explain

    head: AnomalyResult = {"name": an.name, "injected_ns": an.injected_ns, "expected": an.expected, "injected": an.what}
    why = missing(Case(an.name, an.expected, an.what, swap_mb=an.swap_mb))
    if why:
        return {**head, "detected_ns": None, "cause": None, "ok": False, "skipped": why}
    d = work / f"anomaly-{an.name}"
    d.mkdir(parents=True, exist_ok=True)
    body = SPEC_HEAD.format(name=an.name, what=an.what, probe=json.dumps(an.probe))
    body += "loads:\n" + "".join(f"  - {json.dumps(ld)}\n" for ld in an.loads) if an.loads else "loads: []\n"
    body += f"phases:\n  - {{name: anomaly, loads: {json.dumps([ld['name'] for ld in an.loads])}}}\n"
    body += f"duration: {an.seconds:g}s\nwarmup: 0\nrepetitions: 1\n"
    (d / "spec.yaml").write_text(body)
    run_dir = next(d / f"run-{i}" for i in range(1, 10_000) if not (d / f"run-{i}").exists())
    swap = None
    try:
        if an.swap_mb:
            from loopscope.host import swapfile

            swap = swapfile.create(an.swap_mb)
        say(f"  anomaly {an.name}: {an.what} ({an.seconds:g} s) …")
        r = subprocess.run([sys.executable, "-m", "loopscope.cli", "run", str(d / "spec.yaml"), "--run-dir", str(run_dir), "--no-report"],
                           capture_output=True, text=True, timeout=900)
        if r.returncode != 0:
            raise RunError(f"bench explain: anomaly {an.name}: the run failed ({r.returncode}): {r.stderr.strip()[-800:]}")
    finally:
        if swap is not None:
            swapfile.remove(swap)
    from loopscope.kinds import KINDS

    explain(run_dir, KINDS)
    p = run_dir / "tables" / "attribution.parquet"
    att = pl.read_parquet(p).filter(pl.col("probe").str.starts_with("t")) if p.exists() else None
    found, cause = None, None
    for rep, t, v in _series(run_dir, an.interval):
        f = next((f for f in detect(t, v) if f.kind == an.detector), None)
        if f is None:
            continue
        found = f
        c = causes_in(att.filter(pl.col("rep") == rep), f.windows) if att is not None else None
        cause = c
        break
    key = {"periodic": "period_s", "quantization": "step_ns", "warm-up": "seconds"}[an.detector]
    detected = None
    if found is not None:
        v = found.values[key]
        detected = int(v if key == "step_ns" else v * 1e9)
    expected_ns, ticks = an.injected_ns, None
    if an.detector == "quantization":
        expected_ns, ticks = _quantum(run_dir, an.injected_ns)
    ok = detected is not None and cause is not None and cause["cause"] == an.expected
    if ok and detected is not None and an.tolerance is not None:
        ok = abs(detected - expected_ns) <= an.tolerance * expected_ns
    return {**head, "expected_ns": expected_ns, "ticks_per_s": ticks, "detected_ns": detected, "cause": cause["cause"] if cause else None, "ok": bool(ok), "skipped": None,
            "finding": found.text if found else None, "cause_share": cause["share"] if cause else None,
            "windows_with_cause": cause["windows_with"] if cause else None, "windows": cause["windows"] if cause else None, "run": str(run_dir)}


def run(*, only: list[str] | None = None, quick: bool = False, duration_s: float | None = None, reps: int | None = None,
        workdir: str | None = None, progress: Progress = None, remedies: bool = True, recorder: str = "native", events: str = "full") -> ZooBench:
    say = progress or (lambda _m: None)
    duration_s = duration_s or (2.0 if quick else 5.0)
    reps = reps or (1 if quick else 3)
    work = Path(workdir) if workdir else Path(tempfile.mkdtemp(prefix="loopscope-zoo-"))
    work.mkdir(parents=True, exist_ok=True)
    progs = build_zoo(work)
    every = cases(progs["zoo"], progs["lock"], progs["table"], progs["ping"])
    odd = anomalies(progs["zoo"], progs["poll"], progs["table"])
    unknown = sorted(set(only or []) - {c.name for c in every} - {f"anomaly-{a.name}" for a in odd} - {"anomalies", "bursts"})
    if unknown:
        from loopscope.errors import InputError

        raise InputError(f"--case: no case named {', '.join(unknown)}; the cases are {', '.join(c.name for c in every)}, bursts, anomalies (all three) or {', '.join('anomaly-' + a.name for a in odd)}")
    chosen = [c for c in every if not only or c.name in only]
    odd = [a for a in odd if not only or "anomalies" in only or f"anomaly-{a.name}" in only]
    t0 = time.monotonic()
    native = recorder == "native"
    remedies = remedies and native  # the follow-up proves a remedy with loopscope's capture; another recorder is scored on names
    if not native:
        odd = []  # the anomalies' detectors read the probes' records, not the recorder's: nothing to compare
    results = [run_case(c, work, duration_s, reps, say, remedies, recorder, events) for c in chosen]
    timed: CaseResult | None = None
    error_us = None
    if native and (not only or "bursts" in only):
        log = work / "bursts" / "bursts.log"
        log.parent.mkdir(parents=True, exist_ok=True)
        log.unlink(missing_ok=True)
        timed = run_case(bursts_case(progs["zoo"], log), work, duration_s, reps, say, remedies=False)
        error_us = duration_error_us(Path(timed["run"]), log) if timed.get("run") else None
    found = [run_anomaly(a, work, say) for a in odd]
    ran = [r for r in results if not r.get("skipped")]
    hit = sum(1 for r in ran if r.get("expected_rank") == 1)
    helped = [r["name"] for r in ran if (r.get("remedy") or {}).get("significant")]
    # the runs stay for a look (loopscope report / explain RUN); say where, and that they are the user's to remove
    say(f"the cases' experiments and runs are kept in {work} (remove it when done; --dir chooses where)")
    return {
        "remedies_that_helped": helped if remedies else None,
        "cases": results,
        "accuracy": hit / len(results) if results else None,
        "baseline_accuracy": sum(1 for r in ran if r.get("baseline_ok")) / len(results) if results else None,
        "anomalies": found,
        "bursts": timed, "duration_error_us": error_us,
        "recorder": recorder, "events": events, "event_list": _event_list(recorder, events),
        "ran": len(ran), "skipped": len(results) - len(ran),
        "settings": {"duration_s": duration_s, "repetitions": reps, "probe": f"timer 1 kHz on CPU {PROBE_CPU}", "threshold": "p99 of each phase"},
        "seconds": time.monotonic() - t0,
        "workdir": str(work),
    }


def _event_list(recorder: str, events: str) -> list[str]:
    """The tracepoints the recorder was asked for (loopscope's capture filters some: docs/explain.md)."""
    from loopscope.bench import recorders as REC

    if recorder == "perf" and events == "minimal":
        return ["perf sched record (sched:sched_switch, sched:sched_wakeup, sched:sched_wakeup_new, sched:sched_migrate_task, sched:sched_stat_*)"]
    return REC.events_of(events)


def _pct(v: float | None) -> str:
    return f"{100 * v:.1f} %" if v is not None else "–"


def print_human(r: ZooBench) -> None:
    from rich.console import Console
    from rich.table import Table

    t = Table(title="explain against injected causes (the injected phase's outliers, above its p99)")
    for col in ("case", "expected", "rank", "share", "top cause", "baseline", "unexplained", "outliers", "rtla's rule blames", "remedy: p99 ratio [95 % CI]"):
        t.add_column(col)
    for c in r["cases"]:
        if c.get("skipped"):
            t.add_row(c["name"], c["expected"], "skipped", c["skipped"], "", "", "", "", "", "")
            continue
        rem = c.get("remedy") or {}
        ratio, ci = rem.get("ratio_p99"), rem.get("ci95")
        rtext = (f"{ratio:.2f} [{ci[0]:.2f}, {ci[1]:.2f}]{' *' if rem.get('significant') else ''}" if ratio is not None and ci
                 else (rem.get("why") or "–"))
        t.add_row(c["name"], c["expected"], str(c["expected_rank"] or "absent"), _pct(c["expected_share"]),
                  f"{c['top_cause']} ({_pct(c['top_share'])})", _pct(c["baseline_expected_share"]), _pct(c["unexplained_share"]), str(c["outliers"]),
                  f"{c.get('baseline_top') or '–'}{' (right)' if c.get('baseline_ok') else ''}", rtext)
    con = Console()
    con.print(t)
    if r.get("anomalies"):
        a = Table(title="the study's anomalies, injected: detected and named")
        for col in ("anomaly", "injected", "detected", "expected cause", "named", "ok"):
            a.add_column(col)
        from loopscope.units import format_ns

        for x in r["anomalies"]:
            if x.get("skipped"):
                a.add_row(x["name"], format_ns(x["injected_ns"]), "skipped", x["expected"], x["skipped"], "no")
                continue
            named = f"{x['cause']} ({x['windows_with_cause']} of {x['windows']} windows)" if x.get("cause") else "–"
            a.add_row(x["name"], format_ns(x["injected_ns"]), format_ns(x["detected_ns"]) if x["detected_ns"] is not None else "not detected",
                      x["expected"], named, "yes" if x["ok"] else "no")
        con.print(a)
    if r.get("bursts") and not (r["bursts"] or {}).get("skipped"):
        b = r["bursts"] or {}
        err = r.get("duration_error_us")
        con.print(f"bursts (known lengths at known instants): {b.get('expected')} {_pct(b.get('expected_share'))} of the outliers' time; "
                  f"explain's time against the injected overlap: median error {f'{err:.1f} µs' if err is not None else '–'}")
    if r.get("baseline_accuracy") is not None:
        con.print(f"rtla's rule (blame whoever ran when the timer fired) on the same outliers: accuracy {r['baseline_accuracy']:.2f}")
    con.print(f"accuracy: {r['accuracy']:.2f} ({r['ran']} ran, {r['skipped']} skipped; a skipped case counts as a miss); {r['seconds']:.0f} s; runs in {r['workdir']}")
