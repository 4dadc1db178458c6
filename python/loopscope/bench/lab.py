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
  (p50 and p99 of the pooled samples, medians of the per-run figures).
"""

from __future__ import annotations

import json
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path
from typing import Any, Callable

import numpy as np

from loopscope.analysis.stats import quantile
from loopscope.errors import RunError

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
    from loopscope.trace import reader

    return int(reader.read(trace, sort=False)["t_ns"].min())


def _latencies(trace: Path) -> np.ndarray:
    from loopscope.trace import reader
    import polars as pl

    df = reader.read(trace, sort=False)
    return df.filter(pl.col("name") == "wakeup")["dur_ns"].to_numpy()


def run(*, quick: bool = False, runs: int | None = None, demo: str | None = None, progress: Progress = None) -> dict[str, Any]:
    say = progress or (lambda s: None)
    n = runs or (2 if quick else 5)
    dur = "1s" if quick else "10s"
    with tempfile.TemporaryDirectory(prefix="loopscope-bench-lab-") as d:
        work = Path(d)
        # 1. Agent start to probe start.
        starts = []
        (work / "tiny.yaml").write_text(TIMER_SPEC.format(name="tiny", interval=1000, duration="200ms"))
        for i in range(n):
            say(f"  agent start to probe start, run {i + 1}/{n} …")
            _cli("run", "tiny.yaml", "--run-dir", f"tiny{i}", "--no-report", cwd=work)
            r = json.loads((work / f"tiny{i}" / "run.json").read_text())
            first = _first_record_ns(work / f"tiny{i}" / r["steps"][0]["trace"])
            t = r["timings"]
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
            r = json.loads((work / f"via{i}" / "run.json").read_text())
            via.append(_latencies(work / f"via{i}" / r["steps"][0]["trace"]))
            say(f"  timer alone, run {i + 1}/{n} …")
            _cli("probe", "timer", "--interval-us", "1000", "--duration", dur, "--json", "--trace", f"alone{i}.lstrace", cwd=work)
            alone.append(_latencies(work / f"alone{i}.lstrace"))
        agree = {}
        for q, name in ((0.5, "p50"), (0.99, "p99")):
            a = quantile(np.sort(np.concatenate(via)), q)
            b = quantile(np.sort(np.concatenate(alone)), q)
            per_via = [quantile(np.sort(x), q).value for x in via]
            per_alone = [quantile(np.sort(x), q).value for x in alone]
            overlap = a.lo is not None and b.lo is not None and (a.hi is None or b.lo <= a.hi) and (b.hi is None or a.lo <= b.hi)
            agree[name] = {
                "via_run_ns": a.value, "via_run_ci95_ns": [a.lo, a.hi], "alone_ns": b.value, "alone_ci95_ns": [b.lo, b.hi],
                "ratio": round(a.value / b.value, 3) if b.value else None, "cis_overlap": bool(overlap),
                "median_per_run_via_ns": statistics.median(per_via), "median_per_run_alone_ns": statistics.median(per_alone),
                "per_run_via_ns": per_via, "per_run_alone_ns": per_alone,
            }
        # 3. The report of the demo run.
        demo_spec = Path(demo) if demo else ROOT_EXAMPLES / "demo.yaml"
        if quick:
            (work / "demo.yaml").write_text(TIMER_SPEC.format(name="demo", interval=1000, duration="500ms").replace("loads: []", "loads:\n  - kind: cpu\n    level: 1"))
            demo_spec = work / "demo.yaml"
        say(f"  running {demo_spec} for the report benchmark …")
        _cli("run", str(demo_spec), "--run-dir", "demo", "--no-report", cwd=work, timeout=1800)
        from loopscope.report import build

        t0 = time.perf_counter()
        rep = build(work / "demo")
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


def print_human(r: dict[str, Any]) -> None:
    c = r["context"]
    print(f"agent start to probe start: {r['agent_to_probe_ms']} ms median over {c['runs']} runs, range {r['agent_to_probe_range_ms']} ms (target <= 500 ms)")
    print(f"  agent ready: {c['agent_ready_ms']} ms; probe process to its first record: {c['probe_process_ms']} ms")
    print(f"report of the demo run: {r['report_s']} s (target <= 10 s), {c['report_html_bytes'] / 1024:.0f} KiB of HTML")
    for q, a in r["timer_run_vs_alone"].items():
        ci = lambda v: f"[{v[0] / 1e3:.1f}, {'open' if v[1] is None else f'{v[1] / 1e3:.1f}'}] µs"  # noqa: E731
        print(
            f"timer {q}: via loopscope run {a['via_run_ns'] / 1e3:.1f} µs {ci(a['via_run_ci95_ns'])}, alone {a['alone_ns'] / 1e3:.1f} µs {ci(a['alone_ci95_ns'])}: "
            f"ratio {a['ratio']}, CIs {'overlap' if a['cis_overlap'] else 'do NOT overlap'}"
        )
