"""``loopscope bench timer``: the timer probe against cyclictest, alternating.

Both tools measure the same thing (wake-up latency of a periodic thread on
absolute deadlines, memory locked, SCHED_OTHER unless asked otherwise) and
run back to back, alternating, ``runs`` times each; the machine is noisy, so
the comparison is between medians over runs.

cyclictest, by default, holds /dev/cpu_dma_latency at 0 while it runs, which
keeps the CPUs out of deep idle states and shortens every wake-up (on this
VM from ~110 to ~75 µs at the median). So the comparison is made twice:
*tuned* (``cyclictest -m -i N`` against ``loopscope probe timer
--dma-latency 0``) and *as configured* (``cyclictest -m -i N
--default-system`` against ``loopscope probe timer``). cyclictest also gets
``-D T -q -h 20000 --json=F``: the histogram only adds the 1 µs buckets its
quantiles are read from (good to 1 µs); loopscope keeps every sample.
Agreement means ratios near 1 and overlapping ranges over the runs.
"""

from __future__ import annotations

import json
import shutil
import statistics
import subprocess
from pathlib import Path
from typing import Callable

from typing_extensions import NotRequired, TypedDict

import numpy as np

from loopscope.errors import RunError
from loopscope.probes.params import AS_CYCLICTEST, TimerParams
from loopscope.probes import timer
from loopscope.host import scratch

Progress = Callable[[str], None] | None


class Latency(TypedDict):
    """One run of one tool, in ns."""

    samples: int
    min_ns: float
    avg_ns: float
    p50_ns: float
    p99_ns: float
    max_ns: float
    missed: NotRequired[int]  # loopscope: periods it skipped
    beyond_histogram: NotRequired[int]  # cyclictest: samples past its last bucket


class Comparison(TypedDict):
    """Both tools' medians over the runs, their ratios, ranges and every run."""

    loopscope: dict[str, float]
    cyclictest: dict[str, float]
    ratio_loopscope_over_cyclictest: dict[str, float | None]
    range_over_runs: dict[str, dict[str, list[float]]]
    per_run: dict[str, list[Latency]]


class TimerBench(Comparison):
    """What ``loopscope bench timer --json`` prints: the tuned comparison at the
    top level, the untuned one under ``as_configured``."""

    interval_us: int
    duration_s: float
    runs: int
    as_configured: Comparison
    commands: dict[str, list[str]]
    note: str


def _cyclictest(interval_us: int, duration_ns: int, work: Path, tuned: bool) -> Latency:
    out = work / "ct.json"
    secs = max(1, round(duration_ns / 1e9))
    cmd = ["cyclictest", "-m", "-i", str(interval_us), "-D", str(secs), "-q", "-h", "20000", f"--json={out}"]
    if not tuned:
        cmd.insert(1, "--default-system")
    r = subprocess.run(cmd, capture_output=True, text=True, timeout=secs + 60)
    if r.returncode != 0 or not out.exists():
        raise RunError(f"cyclictest failed (exit {r.returncode}): {' '.join(cmd)}: {(r.stderr or r.stdout).strip()[-300:]}")
    t = json.loads(out.read_text())["thread"]["0"]
    hist = {int(k): int(v) for k, v in t["histogram"].items()}
    vals = np.array(sorted(hist), dtype=np.int64)
    cnt = np.array([hist[v] for v in vals], dtype=np.int64)
    cum = np.cumsum(cnt)
    total = int(cum[-1]) if len(cum) else 0

    cycles = int(t["cycles"])

    def q(p: float) -> float:
        # Samples beyond the histogram (> 20 ms) are above every bucket.
        rank = max(1, int(np.ceil(p * cycles)))
        if total == 0 or rank > total:
            return float(t["max"]) * 1000.0
        k = int(np.searchsorted(cum, rank))
        return float(vals[k]) * 1000.0

    return {
        "samples": int(t["cycles"]),
        "min_ns": t["min"] * 1000.0,
        "avg_ns": t["avg"] * 1000.0,
        "p50_ns": q(0.5),
        "p99_ns": q(0.99),
        "max_ns": t["max"] * 1000.0,
        "beyond_histogram": cycles - total,
    }


KEYS = ["min_ns", "avg_ns", "p50_ns", "p99_ns", "max_ns"]


def _compare(ours: list[Latency], theirs: list[Latency]) -> Comparison:
    def med(rows: list[Latency], k: str) -> float:
        return float(statistics.median([float(x[k]) for x in rows]))  # type: ignore[literal-required]

    def rng(rows: list[Latency], k: str) -> list[float]:
        v = [float(x[k]) for x in rows]  # type: ignore[literal-required]
        return [min(v), max(v)]

    return {
        "loopscope": {k: round(med(ours, k), 1) for k in KEYS},
        "cyclictest": {k: round(med(theirs, k), 1) for k in KEYS},
        "ratio_loopscope_over_cyclictest": {k: round(med(ours, k) / med(theirs, k), 3) if med(theirs, k) else None for k in KEYS},
        "range_over_runs": {"loopscope": {k: rng(ours, k) for k in KEYS}, "cyclictest": {k: rng(theirs, k) for k in KEYS}},
        "per_run": {"loopscope": ours, "cyclictest": theirs},
    }


def run(*, interval_us: int = 1000, duration_ns: int = 10_000_000_000, runs: int = 3, progress: Progress = None) -> TimerBench:
    if not shutil.which("cyclictest"):
        raise RunError("cyclictest is not installed (Debian package rt-tests; scripts/install-deps.sh installs it)")
    rows: dict[str, tuple[list[Latency], list[Latency]]] = {"tuned": ([], []), "as_configured": ([], [])}
    with scratch.directory("bench-timer") as d:
        work = Path(d)
        for i in range(runs):
            for mode, tuned in (("tuned", True), ("as_configured", False)):
                if progress:
                    progress(f"  run {i + 1}/{runs} ({mode.replace('_', ' ')}): loopscope probe timer, then cyclictest …")
                p = (AS_CYCLICTEST if tuned else TimerParams(mlock=True)).model_copy(update={"interval_us": interval_us})
                r = timer.run(p, duration_ns, work / f"t{i}.lstrace")
                if r.interrupted:
                    # the probe turned Ctrl-C into an early stop; the bench stops with it
                    raise KeyboardInterrupt
                if tuned and not r.dma_latency_ok:
                    raise RunError(f"the tuned comparison needs /dev/cpu_dma_latency, as cyclictest does: {r.dma_latency}")
                s = r.summary
                rows[mode][0].append(
                    {
                        "samples": r.samples,
                        "min_ns": s.min,
                        "avg_ns": s.mean.value,
                        "p50_ns": s.p50.value,
                        "p99_ns": s.p99.value,
                        "max_ns": s.max,
                        "missed": r.missed,
                    }
                )
                rows[mode][1].append(_cyclictest(interval_us, duration_ns, work, tuned))
    return {
        "interval_us": interval_us,
        "duration_s": duration_ns / 1e9,
        "runs": runs,
        **_compare(*rows["tuned"]),
        "as_configured": _compare(*rows["as_configured"]),
        "commands": {
            "tuned": [f"loopscope probe timer --interval-us {interval_us} --dma-latency 0", f"cyclictest -m -i {interval_us}"],
            "as_configured": [f"loopscope probe timer --interval-us {interval_us}", f"cyclictest -m -i {interval_us} --default-system"],
        },
        "note": "top level: tuned (/dev/cpu_dma_latency held at 0 by both); as_configured: neither touches power management. cyclictest quantiles have 1 µs resolution",
    }


def print_human(r: TimerBench) -> None:
    print(f"timer latency, interval {r['interval_us']} µs, {r['duration_s']:g} s per run, {r['runs']} alternating runs each (medians over runs)")
    for title, c, cmds in (("tuned", r, r["commands"]["tuned"]), ("as configured", r["as_configured"], r["commands"]["as_configured"])):
        print(f"{title}: {cmds[0]}  vs  {cmds[1]}")
        print(f"  {'':8} {'loopscope':>12} {'cyclictest':>12} {'ratio':>7}   range over runs (loopscope | cyclictest)")
        for k in KEYS:
            a, b, q = c["loopscope"][k], c["cyclictest"][k], c["ratio_loopscope_over_cyclictest"][k]
            ra, rb = c["range_over_runs"]["loopscope"][k], c["range_over_runs"]["cyclictest"][k]
            print(
                f"  {k[:-3]:8} {a / 1000:10.1f}µs {b / 1000:10.1f}µs {q if q is not None else '-':>7}   [{ra[0] / 1000:.1f}, {ra[1] / 1000:.1f}] | [{rb[0] / 1000:.1f}, {rb[1] / 1000:.1f}] µs"
            )
