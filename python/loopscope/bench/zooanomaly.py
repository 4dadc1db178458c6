"""The cause zoo's anomalies: behaviours of a run that no single outlier shows
(periodic bursts, a warm-up, the quantum timer slack makes), each injected
and checked against what the detectors say."""

from __future__ import annotations

import json
import subprocess
import sys
import time
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Callable

from typing_extensions import TypedDict
from loopscope.errors import RunError
from loopscope.kernel import store as S
from loopscope.rundir import RunDir
from loopscope.bench.zoocase import Case, OTHER_CPU, PROBE_CPU, SPEC_HEAD, missing
import numpy as np
import polars as pl
from loopscope.trace import reader
from loopscope.analysis.detectors import detect
from loopscope.analysis.explain import causes_in, explain
from loopscope.kinds import KINDS
from loopscope.host import swapfile


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
    probe: dict[str, object]
    interval: str  # the series: group/name of the probe's intervals
    seconds: float
    loads: list[dict[str, object]] = field(default_factory=list)
    swap_mb: int = 0


def anomalies(zoo: str, pollprog: str, table: str, quick: bool = False) -> list[Anomaly]:
    """The three anomalies (``quick``: the cold start and its run half as
    long, 2 s in 8 s: the detector looks for a change within the first 30 %
    of the series either way). A sleep held open by timer slack ends at the
    first interrupt after its deadline: at the slack's end on a quiet CPU
    whose tick stops when idle (NOHZ), so 5 ms of slack quantizes at 5 ms.
    A CPU that keeps its tick running ends those sleeps at the tick instead
    (HZ=250: 4 ms): the run's capture says which (``_quantum``). It kept
    running here while the lab's own helpers still woke every 20-100 ms,
    and on a later day with the lab quiet (264 timer interrupts a second
    on the probe's CPU, the sandbox's own process the only other waker)."""
    c, o = PROBE_CPU, OTHER_CPU
    cold_s = 2 if quick else 4
    timer = {"kind": "timer", "name": "t", "interval_us": 1000, "cpu": [c]}
    return [
        Anomaly(
            "periodic",
            "periodic",
            "load: burst",
            f"a SCHED_FIFO burst of 200 ms every 8 s on CPU {c} (a load)",
            8_000_000_000,
            0.05,
            timer,
            "timer/wakeup",
            44.0,
            loads=[
                {
                    "name": "burst",
                    "kind": "command",
                    "command": [zoo, "fifo", "--cpu", str(c), "--prio", "10", "--burst-us", "200000", "--period-us", "8000000"],
                }
            ],
        ),
        Anomaly(
            "quantization",
            "quantization",
            "timer slack",
            f"a thread on CPU {c} polling for work with 50 µs sleeps and 5 ms of timer slack",
            5_000_000,
            0.10,
            {"kind": "program", "name": "t", "command": [pollprog, "--cpu", str(c), "--slack-ns", "5000000", "--poll-us", "50"], "attribute": ["poll/wait"]},
            "poll/wait",
            20.0,
        ),
        Anomaly(
            "warmup",
            "warm-up",
            "page faults",
            f"a cold start: a control loop's unlocked 64 MiB table paged out every 20 ms for the first {cold_s} s (from CPU {o})",
            cold_s * 1_000_000_000,
            None,
            {"kind": "program", "name": "t", "command": [table, "--cpu", str(c), "--table-mib", "64"], "attribute": ["loop/cycle"], "wakeup": ["loop/cycle"]},
            "loop/cycle",
            4.0 * cold_s,
            loads=[
                {
                    "name": "squeeze",
                    "kind": "command",
                    "command": [
                        zoo,
                        "pageout",
                        "--prefix",
                        "zoo-table",
                        "--every-ms",
                        "20",
                        "--max-kib",
                        "131072",
                        "--for-ms",
                        str(cold_s * 1000),
                        "--cpu",
                        str(o),
                    ],
                }
            ],
            swap_mb=256,
        ),
    ]


def _series(run_dir: Path, interval: str) -> list[tuple[int, Any, Any]]:
    """(rep, t_ns, value) of probe t's ``interval`` in every step of the run."""
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

    kernel = RunDir(run_dir).record().kernel
    caps = [c for c in kernel.captures if c.data] if kernel else []
    if not caps:
        return slack_ns, None
    st = S.open_capture(run_dir, caps[0])
    if "local_timer_entry" not in st.event_names or not st.t_first or not st.t_last:
        return slack_ns, None
    ev = st.load(st.t_first, st.t_last).filter((pl.col("event") == "local_timer_entry") & (pl.col("cpu") == PROBE_CPU))
    tick = tick_ns()
    ticks = tick_rate(ev["t_ns"].to_numpy(), (st.t_last - st.t_first) / 1e9, tick)
    return (min(slack_ns, tick) if ticks >= 0.5e9 / tick else slack_ns), round(ticks, 1)


#: the tick's grid in this many phases; its interrupts fall in one and its neighbours
GRID_BINS = 40


def tick_rate(t_ns: np.ndarray, seconds: float, tick: int) -> float:
    """Timer interrupts a second that were the scheduler's tick: those on
    the tick's grid (one phase of ``tick``, ±1.5/GRID_BINS of it). The
    probe's own timers interrupt too (a sleep the slack ends makes one),
    at phases that drift over the grid: counting every interrupt took a
    NOHZ CPU woken every 5 ms for one whose tick ran."""
    if len(t_ns) == 0 or seconds <= 0:
        return 0.0
    hist = np.bincount(((t_ns % tick) * GRID_BINS // tick).astype(np.int64), minlength=GRID_BINS)
    k = int(hist.argmax())
    return float(hist[k] + hist[(k - 1) % GRID_BINS] + hist[(k + 1) % GRID_BINS]) / seconds


def run_anomaly(an: Anomaly, work: Path, say: Callable[[str], None]) -> AnomalyResult:
    """Run one anomaly's experiment, then its detector and explain on it."""
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
            swap = swapfile.create(an.swap_mb)
        say(f"  anomaly {an.name}: {an.what} ({an.seconds:g} s) …")
        r = subprocess.run(
            [sys.executable, "-m", "loopscope.cli", "run", str(d / "spec.yaml"), "--run-dir", str(run_dir), "--no-report"],
            capture_output=True,
            text=True,
            timeout=900,
        )
        if r.returncode != 0:
            raise RunError(f"bench explain: anomaly {an.name}: the run failed ({r.returncode}): {r.stderr.strip()[-800:]}")
    finally:
        if swap is not None:
            swapfile.remove(swap)

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
    return {
        **head,
        "expected_ns": expected_ns,
        "ticks_per_s": ticks,
        "detected_ns": detected,
        "cause": cause["cause"] if cause else None,
        "ok": bool(ok),
        "skipped": None,
        "finding": found.text if found else None,
        "cause_share": cause["share"] if cause else None,
        "windows_with_cause": cause["windows_with"] if cause else None,
        "windows": cause["windows"] if cause else None,
        "run": str(run_dir),
    }
