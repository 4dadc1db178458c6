"""``loopscope bench lab``: what the controller and agent cost a measurement.

Three figures, each measured here, back to back:

- ``agent_to_probe_ms``: from the controller spawning the agent to the first
  record of the first probe (its first wake-up deadline), over several tiny
  runs; the target is 500 ms;
- ``report_s``: building the report (tables, comparisons, HTML) of the demo
  run (``examples/demo.yaml``, run first); the target is 10 s;
- ``timer_run_vs_alone``: the timer probe through ``loopscope run`` and the
  same probe alone (``loopscope probe timer``), alternating; the lab adds no
  measurable noise when the two agree within their confidence intervals
  (p50 and p99, each run one sample: see ``_agreement``).
"""

from __future__ import annotations

import statistics
import subprocess
import sys
import time
from pathlib import Path
from typing import Callable

from typing_extensions import TypedDict

import numpy as np

from loopscope.stats import quantile
from loopscope.errors import RunError
from loopscope.rundir import RunDir
from loopscope.trace import reader
import polars as pl
from scipy import stats as st
from loopscope.kinds import KINDS
from loopscope.report import build
from loopscope.host import scratch

Progress = Callable[[str], None] | None
ROOT_EXAMPLES = Path(__file__).resolve().parents[3] / "examples"

TIMER_SPEC = """name: {name}
probes:
  - kind: timer
    interval_us: {interval}
loads: []
duration: {duration}
"""


def _cli(*args: str, cwd: Path, timeout: float = 900) -> subprocess.CompletedProcess[str]:
    r = subprocess.run([sys.executable, "-m", "loopscope.cli", *args], cwd=cwd, capture_output=True, text=True, timeout=timeout)
    if r.returncode != 0:
        raise RunError(f"loopscope {' '.join(args)} failed ({r.returncode}): {r.stderr.strip()[-600:]}")
    return r


def _first_record_ns(trace: Path) -> int:
    first = reader.read(trace, sort=False)["t_ns"].min()
    if not isinstance(first, int):
        raise RunError(f"bench lab: {trace} holds no record")
    return first


def _latencies(trace: Path) -> np.ndarray:
    df = reader.read(trace, sort=False)
    return df.filter(pl.col("name") == "wakeup")["dur_ns"].to_numpy()


class Agreement(TypedDict):
    """One quantile through the lab and alone: means over runs, their 95 % CIs, Welch's p."""

    via_run_ns: float
    via_run_ci95_ns: list[float]
    alone_ns: float
    alone_ci95_ns: list[float]
    ratio: float
    cis_overlap: bool
    welch_p: float | None
    per_run_via_ns: list[float]
    per_run_alone_ns: list[float]
    pooled: dict[str, float | list[float | None]]


class LabContext(TypedDict):
    runs: int
    timer_duration: str
    agent_ready_ms: list[float]
    probe_process_ms: list[float]
    report_html_bytes: int
    demo_spec: str
    demo_samples: int
    quick: bool


class LabBench(TypedDict):
    """What ``loopscope bench lab --json`` prints."""

    agent_to_probe_ms: float
    agent_to_probe_range_ms: list[float]
    report_s: float
    timer_run_vs_alone: dict[str, Agreement]
    context: LabContext


def _agreement(via: list[np.ndarray], alone: list[np.ndarray], q: float) -> Agreement:
    """Compare a quantile through the lab and alone. Runs are the unit: each
    run's quantile is one sample (the machine's state differs more between
    runs than the samples within one run tell), so the 95 % CIs are Student
    t intervals over runs, and the two agree when those overlap (Welch's
    test gives the p-value). The pooled-sample CIs are kept for reference:
    they only describe within-run noise and are far too narrow for this."""
    per_via = np.array([quantile(np.sort(x), q).value for x in via])
    per_alone = np.array([quantile(np.sort(x), q).value for x in alone])

    def tci(x: np.ndarray) -> list[float]:
        if len(x) < 2:
            return [float("nan"), float("nan")]
        h = float(st.t.ppf(0.975, len(x) - 1) * x.std(ddof=1) / np.sqrt(len(x)))
        return [float(x.mean() - h), float(x.mean() + h)]

    cv, ca = tci(per_via), tci(per_alone)
    pv = quantile(np.sort(np.concatenate(via)), q)
    pa = quantile(np.sort(np.concatenate(alone)), q)
    welch = st.ttest_ind(per_via, per_alone, equal_var=False) if len(per_via) > 1 else None
    return {
        "via_run_ns": float(per_via.mean()),
        "via_run_ci95_ns": cv,
        "alone_ns": float(per_alone.mean()),
        "alone_ci95_ns": ca,
        "ratio": round(float(per_via.mean() / per_alone.mean()), 3),
        "cis_overlap": bool(cv[0] <= ca[1] and ca[0] <= cv[1]),
        "welch_p": round(float(welch.pvalue), 3) if welch is not None else None,
        "per_run_via_ns": per_via.tolist(),
        "per_run_alone_ns": per_alone.tolist(),
        "pooled": {"via_ns": pv.value, "via_ci95_ns": [pv.lo, pv.hi], "alone_ns": pa.value, "alone_ci95_ns": [pa.lo, pa.hi]},
    }


def run(*, quick: bool = False, runs: int | None = None, demo: str | None = None, progress: Progress = None) -> LabBench:
    say = progress or (lambda s: None)
    n = runs or (2 if quick else 5)
    dur = "1s" if quick else "10s"
    with scratch.directory("bench-lab") as d:
        work = Path(d)
        # 1. Agent start to probe start.
        starts = []
        (work / "tiny.yaml").write_text(TIMER_SPEC.format(name="tiny", interval=1000, duration="200ms"))
        for i in range(n):
            say(f"  agent start to probe start, run {i + 1}/{n} …")
            _cli("run", "tiny.yaml", "--run-dir", f"tiny{i}", "--no-report", cwd=work)
            r = RunDir(work / f"tiny{i}").record()
            first = _first_record_ns(work / f"tiny{i}" / r.steps[0].trace)
            t = {k: float(v or 0) for k, v in r.timings.items()}
            starts.append(
                {
                    "total_ms": (first - t["agent_spawn_mono_ns"]) / 1e6,
                    "agent_ready_ms": (t["agent_ready_mono_ns"] - t["agent_spawn_mono_ns"]) / 1e6,
                    "probe_process_ms": (first - t["first_probe_spawn_mono_ns"]) / 1e6,
                }
            )
        # 2. Timer through the lab vs alone, alternating.
        via, alone = [], []
        (work / "timer.yaml").write_text(TIMER_SPEC.format(name="timer", interval=1000, duration=dur))
        for i in range(n):
            say(f"  timer through loopscope run, run {i + 1}/{n} …")
            _cli("run", "timer.yaml", "--run-dir", f"via{i}", "--no-report", cwd=work)
            via.append(_latencies(work / f"via{i}" / RunDir(work / f"via{i}").record().steps[0].trace))
            say(f"  timer alone, run {i + 1}/{n} …")
            _cli("probe", "timer", "--interval-us", "1000", "--duration", dur, "--json", "--trace", f"alone{i}.lstrace", cwd=work)
            alone.append(_latencies(work / f"alone{i}.lstrace"))
        agree = {q: _agreement(via, alone, v) for q, v in (("p50", 0.5), ("p99", 0.99))}
        # 3. The report of the demo run.
        demo_spec = Path(demo) if demo else ROOT_EXAMPLES / "demo.yaml"
        if quick:
            (work / "demo.yaml").write_text(
                TIMER_SPEC.format(name="demo", interval=1000, duration="500ms").replace("loads: []", "loads:\n  - kind: cpu\n    level: 1")
            )
            demo_spec = work / "demo.yaml"
        say(f"  running {demo_spec} for the report benchmark …")
        _cli("run", str(demo_spec), "--run-dir", "demo", "--no-report", cwd=work, timeout=1800)
        t0 = time.perf_counter()
        rep = build(work / "demo", KINDS)
        report_s = time.perf_counter() - t0
        totals = [s["total_ms"] for s in starts]
        return {
            "agent_to_probe_ms": round(statistics.median(totals), 1),
            "agent_to_probe_range_ms": [round(min(totals), 1), round(max(totals), 1)],
            "report_s": round(report_s, 2),
            "timer_run_vs_alone": agree,
            "context": {
                "runs": n,
                "timer_duration": dur,
                "agent_ready_ms": [round(s["agent_ready_ms"], 1) for s in starts],
                "probe_process_ms": [round(s["probe_process_ms"], 1) for s in starts],
                "report_html_bytes": rep.html.stat().st_size,
                "demo_spec": str(demo_spec),
                "demo_samples": int(sum(1 for _ in rep.comparisons.iter_rows())),
                "quick": quick,
            },
        }


def _ci(v: list[float]) -> str:
    return f"[{v[0] / 1e3:.1f}, {v[1] / 1e3:.1f}] µs"


def print_human(r: LabBench) -> None:
    c = r["context"]
    print(f"agent start to probe start: {r['agent_to_probe_ms']} ms median over {c['runs']} runs, range {r['agent_to_probe_range_ms']} ms (target <= 500 ms)")
    print(f"  agent ready: {c['agent_ready_ms']} ms; probe process to its first record: {c['probe_process_ms']} ms")
    print(f"report of the demo run: {r['report_s']} s (target <= 10 s), {c['report_html_bytes'] / 1024:.0f} KiB of HTML")
    for q, a in r["timer_run_vs_alone"].items():
        print(
            f"timer {q} (mean of per-run values, 95% CI over runs): via loopscope run {a['via_run_ns'] / 1e3:.1f} µs {_ci(a['via_run_ci95_ns'])}, "
            f"alone {a['alone_ns'] / 1e3:.1f} µs {_ci(a['alone_ci95_ns'])}: ratio {a['ratio']}, CIs {'overlap' if a['cis_overlap'] else 'do NOT overlap'}, Welch p={a['welch_p']}"
        )
