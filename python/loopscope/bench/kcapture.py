"""``loopscope bench kcapture``: what recording kernel events costs the thing measured.

The timer probe (1 kHz, ``seconds`` per run, idle machine) alone and with the
kernel capture loopscope runs during experiments (``perf record -a -k mono``
on the attribution tracepoints), alternating, ``runs`` times each. One run's
p99 on this machine varies more than the effect, so each figure is the
median over its runs, and the runs are listed. Also counted: the kernel
events a run recorded, those lost, and the CPU perf itself used.
"""

from __future__ import annotations

import json
import statistics
import subprocess
import sys
import tempfile
from pathlib import Path
from typing import Any, Callable

from loopscope.errors import RunError


def _timer(seconds: float, work: Path, tag: str) -> dict[str, Any]:
    r = subprocess.run(
        [sys.executable, "-m", "loopscope.cli", "probe", "timer", "--interval-us", "1000", "--duration", f"{seconds:g}s", "--json", "--trace", str(work / f"{tag}.lstrace")],
        capture_output=True, text=True, timeout=seconds + 60,
    )
    if r.returncode != 0:
        raise RunError(f"bench kcapture: the timer probe failed: {r.stderr.strip()[-400:]}")
    return dict(json.loads(r.stdout))


def run(*, quick: bool = False, runs: int | None = None, seconds: float | None = None, progress: Callable[[str], None] | None = None) -> dict[str, Any]:
    from loopscope.kernel import capture, events

    say = progress or (lambda s: None)
    n = runs or (2 if quick else 5)
    secs = seconds or (2.0 if quick else 10.0)
    have, lack, refused = capture.available()
    if refused:
        raise RunError(f"bench kcapture: kernel capture is not possible here: {refused}")
    without, with_ = [], []
    with tempfile.TemporaryDirectory(prefix="ls-bench-kcap-") as d:
        work = Path(d)
        for i in range(n):
            say(f"  run {i + 1}/{n}: timer alone ({secs:g} s) …")
            j = _timer(secs, work, f"alone{i}")
            without.append({"p50_ns": j["p50_ns"], "p99_ns": j["p99_ns"], "max_ns": j["max_ns"]})
            say(f"  run {i + 1}/{n}: timer under kernel capture ({secs:g} s) …")
            cap = capture.Capture(work / f"cap{i}")
            meta = cap.start()
            if meta["refused"]:
                raise RunError(f"bench kcapture: {meta['refused']}")
            try:
                j = _timer(secs, work, f"with{i}")
            finally:
                meta = cap.stop()
            got = events.read(cap.data)
            ev, lost = got.events, got.lost
            with_.append({
                "p50_ns": j["p50_ns"], "p99_ns": j["p99_ns"], "max_ns": j["max_ns"], "kernel_events": len(ev), "lost_kernel_events": lost,
                "perf_cpu_share": (meta["perf_cpu_s"] / meta["seconds"]) if meta.get("perf_cpu_s") is not None and meta.get("seconds") else None,
            })
    med = lambda xs, k: statistics.median(x[k] for x in xs)  # noqa: E731
    res = {
        "p50_ns_without": med(without, "p50_ns"),
        "p99_ns_without": med(without, "p99_ns"),
        "p50_ns_with": med(with_, "p50_ns"),
        "p99_ns_with": med(with_, "p99_ns"),
        "kernel_events": med(with_, "kernel_events"),
        "lost_kernel_events": sum(x["lost_kernel_events"] for x in with_),
        "perf_cpu_share": statistics.median(x["perf_cpu_share"] for x in with_ if x["perf_cpu_share"] is not None) if any(x["perf_cpu_share"] is not None for x in with_) else None,
        "runs_without": without,
        "runs_with": with_,
        "events": have,
        "missing_events": lack,
        "context": {"runs": n, "seconds": secs, "interval_us": 1000},
    }
    res["p99_ratio"] = res["p99_ns_with"] / res["p99_ns_without"] if res["p99_ns_without"] else None
    res["p50_ratio"] = res["p50_ns_with"] / res["p50_ns_without"] if res["p50_ns_without"] else None
    return res


def print_human(r: dict[str, Any]) -> None:
    from loopscope.units import format_ns

    c = r["context"]
    print(f"kernel capture cost: timer probe at 1 kHz, {c['seconds']:g} s per run, {c['runs']} runs each, alternating; medians")
    print(f"  p50 {format_ns(r['p50_ns_without'])} alone, {format_ns(r['p50_ns_with'])} under capture (ratio {r['p50_ratio']:.3f})")
    print(f"  p99 {format_ns(r['p99_ns_without'])} alone, {format_ns(r['p99_ns_with'])} under capture (ratio {r['p99_ratio']:.3f})")
    print(f"    p99 per run alone: {', '.join(format_ns(x['p99_ns']) for x in r['runs_without'])}")
    print(f"    p99 per run with:  {', '.join(format_ns(x['p99_ns']) for x in r['runs_with'])}")
    share = r["perf_cpu_share"]
    print(f"  {r['kernel_events']:,.0f} kernel events per run, {r['lost_kernel_events']} lost; perf used {share * 100:.1f} % of a CPU" if share is not None else f"  {r['kernel_events']:,.0f} kernel events per run, {r['lost_kernel_events']} lost")
