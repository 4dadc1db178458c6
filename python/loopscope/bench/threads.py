"""``loopscope bench threads``: an uninstrumented program's timer lateness,
measured from the kernel, against the program's own account of it.

cyclictest is the program (``cyclictest -m -p 80 -i 1000 -t 1``, with its
histogram): it measures its own timer lateness (clock read after it woke,
minus the expiry it asked for), at 1 µs resolution. Runs alternate between
cyclictest alone and cyclictest under ``loopscope probe threads`` (the
kernel capture, the /proc watcher), so both sides sample the same state of
this shared machine:

- **agreement**: in each watched run, loopscope's timer lateness of
  cyclictest's measuring thread (its switch-in minus the expiry of its own
  ``hrtimer_start``) against cyclictest's own histogram of the same run,
  p50 and p99; agreed when within 10 % or 3 µs, whichever is larger.
  cyclictest reads its clock after it runs, loopscope takes the switch-in:
  loopscope's figure is the earlier by the return to user space; on a CPU
  whose switch out of idle the kernel does not trace, the switch-in is
  placed at the start of its bound (earlier still).
- **cost of watching**: cyclictest's own p99 with loopscope watching over
  without (medians over the runs); ``aa_spread``, the p99 ratio between two
  halves of the unwatched runs, is the noise floor it is read against. By
  default pairs are added until the spread is within 1.05 (else the cost is
  ``inconclusive``, not met).
"""

from __future__ import annotations

import json
import re
import shutil
import statistics
import subprocess
import sys
from collections.abc import Callable

from typing_extensions import TypedDict

from loopscope.errors import RunError

CYCLICTEST = ["cyclictest", "-m", "-p", "80", "-i", "1000", "-t", "1", "-q", "-h", "2000"]
AGREE_REL, AGREE_ABS_NS = 0.10, 3_000
WATCH_TARGET = 1.05


class Row(TypedDict):
    metric: str
    loopscope_ns: float | None
    cyclictest_ns: float | None


class RunFigures(TypedDict, total=False):
    watched: bool
    cyclictest_p50_ns: float
    cyclictest_p99_ns: float
    cyclictest_max_ns: float
    cyclictest_samples: int
    loopscope_p50_ns: float | None
    loopscope_p99_ns: float | None
    loopscope_max_ns: float | None
    activations: int
    kernel_events: int


class ThreadsBench(TypedDict):
    """What ``loopscope bench threads --json`` prints."""

    rows: list[Row]
    agree: bool
    watch_cost_p99: float | None
    aa_spread: float | None
    watch_verdict: str
    pairs: int
    seconds: float
    runs: list[RunFigures]


def histogram(text: str) -> tuple[float, float, float, int] | None:
    """cyclictest's histogram (µs buckets) → p50, p99, max (ns) and samples."""
    counts: dict[int, int] = {}
    for m in re.finditer(r"^(\d{6}) +(\d+)\s*$", text, re.M):
        if int(m.group(2)):
            counts[int(m.group(1))] = counts.get(int(m.group(1)), 0) + int(m.group(2))
    mx = re.search(r"# Max Latencies: +(\d+)", text)
    n = sum(counts.values())
    if not n:
        return None

    def q(f: float) -> float:
        k, acc = f * n, 0
        for us in sorted(counts):
            acc += counts[us]
            if acc >= k:
                return us * 1000.0
        return max(counts) * 1000.0

    return q(0.5), q(0.99), float(int(mx.group(1)) * 1000 if mx else max(counts) * 1000), n


def _alone(seconds: float) -> RunFigures:
    r = subprocess.run([*CYCLICTEST, "-D", f"{seconds:g}"], capture_output=True, text=True, timeout=seconds + 60)
    h = histogram(r.stdout)
    if r.returncode != 0 or h is None:
        raise RunError(f"cyclictest failed: {r.stderr.strip()[-300:]}", component="bench")
    return {"watched": False, "cyclictest_p50_ns": h[0], "cyclictest_p99_ns": h[1], "cyclictest_max_ns": h[2], "cyclictest_samples": h[3]}


def _watched(seconds: float) -> RunFigures:
    r = subprocess.run(
        [sys.executable, "-m", "loopscope.cli", "probe", "threads", "--json", "--threads", "^cyclictest$", "--", *CYCLICTEST, "-D", f"{seconds:g}"],
        capture_output=True,
        text=True,
        timeout=seconds + 120,
    )
    h = histogram(r.stderr)
    if r.returncode != 0 or h is None:
        raise RunError(f"loopscope probe threads failed: {r.stderr.strip()[-300:]}", component="bench")
    j = json.loads(r.stdout.strip().splitlines()[-1])
    t = max(j["threads"], key=lambda x: x["activations"])
    lat = t["timer_lateness_ns"] or {}
    return {
        "watched": True,
        "cyclictest_p50_ns": h[0],
        "cyclictest_p99_ns": h[1],
        "cyclictest_max_ns": h[2],
        "cyclictest_samples": h[3],
        "loopscope_p50_ns": lat.get("p50"),
        "loopscope_p99_ns": lat.get("p99"),
        "loopscope_max_ns": lat.get("max"),
        "activations": t["activations"],
        "kernel_events": j["kernel_events"],
    }


def _med(rs: list[RunFigures], k: str) -> float | None:
    v = [float(x) for r in rs if isinstance(x := r.get(k), (int, float))]
    return float(statistics.median(v)) if v else None


def spread(alone: list[RunFigures]) -> float | None:
    a = [r["cyclictest_p99_ns"] for r in alone[0::2]]
    b = [r["cyclictest_p99_ns"] for r in alone[1::2]]
    return float(statistics.median(a) / statistics.median(b)) if a and b else None


def run(quick: bool = False, pairs: int | None = None, seconds: float | None = None, progress: Callable[[str], None] | None = None) -> ThreadsBench:
    for tool in ("cyclictest",):
        if shutil.which(tool) is None:
            raise RunError(f"bench threads needs {tool} (rt-tests)", component="bench")
    secs = seconds or (2.0 if quick else 10.0)
    least, most = (1, 1) if quick else (pairs or 4, pairs or 12)
    alone: list[RunFigures] = []
    watched: list[RunFigures] = []
    i = 0
    while True:
        # alternate which goes first, so neither side always follows the other
        order = (_alone, _watched) if i % 2 == 0 else (_watched, _alone)
        for f in order:
            r = f(secs)
            (watched if r["watched"] else alone).append(r)
            if progress:
                progress(
                    f"pair {i + 1}: {'watched' if r['watched'] else 'alone'}: cyclictest p99 {r['cyclictest_p99_ns'] / 1e3:.1f} µs"
                    + (f", loopscope p99 {(r.get('loopscope_p99_ns') or 0) / 1e3:.1f} µs" if r["watched"] else "")
                )
        i += 1
        sp = spread(alone)
        if i >= most or (i >= least and (i % 2 == 0 and sp is not None and max(sp, 1 / sp) <= WATCH_TARGET)):
            break
    rows: list[Row] = []
    ok = True
    for m in ("p50", "p99"):
        # per run: loopscope's figure against cyclictest's of the same run; the medians shown
        lo, cy = _med(watched, f"loopscope_{m}_ns"), _med(watched, f"cyclictest_{m}_ns")
        rows.append({"metric": m, "loopscope_ns": lo, "cyclictest_ns": cy})
        ok = ok and lo is not None and cy is not None and abs(lo - cy) <= max(AGREE_REL * cy, AGREE_ABS_NS)
    cost = (_med(watched, "cyclictest_p99_ns") or 0) / (_med(alone, "cyclictest_p99_ns") or 1)
    sp = spread(alone)
    v = "inconclusive" if sp is None or max(sp, 1 / sp) > WATCH_TARGET else ("met" if cost <= WATCH_TARGET else "not met")
    return {"rows": rows, "agree": ok, "watch_cost_p99": cost, "aa_spread": sp, "watch_verdict": v, "pairs": i, "seconds": secs, "runs": alone + watched}


def print_human(r: ThreadsBench) -> None:
    for row in r["rows"]:
        lo, cy = row["loopscope_ns"], row["cyclictest_ns"]
        print(f"timer lateness {row['metric']}: loopscope {(lo or 0) / 1e3:.1f} µs, cyclictest {(cy or 0) / 1e3:.1f} µs")
    print(f"agree (within 10 % or 3 µs): {r['agree']}")
    sp = r["aa_spread"]
    print(
        f"cyclictest p99 watched / alone: {r['watch_cost_p99']:.3f} (aa_spread {sp if sp is None else round(sp, 3)}; {r['watch_verdict']}); {r['pairs']} pairs of {r['seconds']:g} s"
    )
