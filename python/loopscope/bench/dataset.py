"""``loopscope bench dataset``: how long ``runs``, ``query`` and ``trend``
take over a directory of many real runs, against the same answer read
straight from the runs' files.

The dataset: ``runs`` short real runs (a 1 kHz timer for ``duration`` in
one repetition, no kernel capture), each on one of ``hosts`` network
namespace hosts in turn (``h1``, ``h2``, …), so the runs have hosts to
group by; or an existing directory (``dataset``). Then, alternating,
``repeat`` times each, every command as a user runs it (a new process):

- ``runs DIR --format json``, against a Python process reading every
  ``run.json`` (the floor of listing runs);
- ``query DIR`` of the timer's p99 by host from ``summary``, against the
  same figure from DuckDB over the glob of ``comparisons.parquet`` (the
  floor: no views, no run records, no identity joins);
- ``trend DIR --probe timer --by host -o page``, against the same points
  read by DuckDB and drawn by matplotlib;
- the weak case: ``query`` over ``records`` (every sample of every run:
  p99 by host of the raw latencies), against DuckDB over the glob of
  ``timer.parquet``.

Figures are medians with their range; ratios are loopscope's median over
the floor's. Targets (issue): query ≤ 2 s, trend ≤ 3 s, runs ≤ 2 s over
200 runs.
"""

from __future__ import annotations

import json
import shutil
import statistics
import subprocess
import sys
import time
from pathlib import Path
from typing import Callable

from typing_extensions import TypedDict

from loopscope.errors import RunError
from loopscope.host import scratch

SPEC = """name: fleet-{host}
hosts:
  - name: {host}
probes:
  - {{kind: timer, interval_us: 1000, host: {host}}}
duration: {duration}
repetitions: 1
kernel: {{capture: off}}
"""

P99_BY_HOST = "SELECT host, median(value_ns) AS p99_ns, count(*) AS runs FROM summary WHERE probe = 'timer' AND metric = 'p99' GROUP BY host ORDER BY host"
RECORDS_BY_HOST = "SELECT host, quantile_cont(value_ns, 0.99) AS p99_ns, count(*) AS samples FROM records WHERE measure = 'latency' GROUP BY host ORDER BY host"

FLOOR_QUERY = """import duckdb, sys
print(duckdb.sql("SELECT host, median(value_ns), count(*) FROM read_parquet('" + sys.argv[1] + "/*/tables/comparisons.parquet', union_by_name = true) "
                 "WHERE probe = 'timer' AND metric = 'p99' GROUP BY host ORDER BY host").fetchall())
"""
FLOOR_RECORDS = """import duckdb, sys
print(duckdb.sql("SELECT host, quantile_cont(latency_ns, 0.99), count(*) FROM read_parquet('" + sys.argv[1] + "/*/tables/timer.parquet', union_by_name = true) "
                 "GROUP BY host ORDER BY host").fetchall())
"""
FLOOR_RUNS = """import json, sys
from pathlib import Path
runs = [json.loads(p.read_text()) for p in sorted(Path(sys.argv[1]).glob("*/run.json"))]
print(json.dumps({"runs": [{"run_id": r["run_id"], "experiment": r["name"], "started_utc": r.get("started_utc")} for r in runs]}))
"""
FLOOR_TREND = """import duckdb, sys
import matplotlib
matplotlib.use("Agg")
import matplotlib.pyplot as plt
rows = duckdb.sql("SELECT host, started_utc, value_ns, value_lo_ns, value_hi_ns FROM read_parquet('" + sys.argv[1] + "/*/tables/comparisons.parquet', union_by_name = true) "
                  "WHERE probe = 'timer' AND metric = 'p99' AND phase = baseline_phase ORDER BY started_utc").fetchall()
fig, ax = plt.subplots(figsize=(9.4, 3.8))
for h in sorted({r[0] for r in rows}):
    pts = [(i, r) for i, r in enumerate(rows) if r[0] == h]
    ax.errorbar([i for i, _ in pts], [r[2] for _, r in pts], yerr=[[r[2] - r[3] for _, r in pts], [r[4] - r[2] for _, r in pts]], fmt="o", label=h)
fig.savefig(sys.argv[2], format="svg")
"""


class Timing(TypedDict):
    median: float
    range: list[float]


class Case(TypedDict):
    loopscope: Timing
    floor: Timing
    ratio: float
    target_s: float | None


class DatasetBench(TypedDict):
    """What ``loopscope bench dataset --json`` prints."""

    runs: int
    hosts: int
    recorded_s: float | None
    dataset_mb: float
    repeat: int
    cases: dict[str, Case]
    answer: list[list[object]]


def _record(root: Path, runs: int, hosts: int, duration: str, say: Callable[[str], None] | None) -> float:
    t0 = time.perf_counter()
    specs = root / ".specs"
    specs.mkdir(parents=True, exist_ok=True)
    for i in range(runs):
        host = f"h{i % hosts + 1}"
        spec = specs / f"{host}.yaml"
        if not spec.exists():
            spec.write_text(SPEC.format(host=host, duration=duration))
        r = subprocess.run([sys.executable, "-m", "loopscope.cli", "run", str(spec), "--results", str(root)], capture_output=True, text=True, timeout=300)
        if r.returncode != 0:
            raise RunError(f"bench dataset: run {i + 1} of {runs} failed: {r.stderr.strip()[-400:]}")
        if say and (i + 1) % 20 == 0:
            say(f"  recorded {i + 1} of {runs} runs ({time.perf_counter() - t0:.0f} s)")
    shutil.rmtree(specs)
    return time.perf_counter() - t0


def _timed(argv: list[str]) -> tuple[float, str]:
    t0 = time.perf_counter()
    r = subprocess.run(argv, capture_output=True, text=True, timeout=600)
    dt = time.perf_counter() - t0
    if r.returncode != 0:
        raise RunError(f"bench dataset: {' '.join(argv[:4])} … failed: {r.stderr.strip()[-400:]}")
    return dt, r.stdout


def _timing(xs: list[float]) -> Timing:
    return {"median": round(statistics.median(xs), 3), "range": [round(min(xs), 3), round(max(xs), 3)]}


def bench(
    runs: int = 200,
    hosts: int = 4,
    duration: str = "300ms",
    repeat: int = 5,
    dataset: str | None = None,
    keep: str | None = None,
    say: Callable[[str], None] | None = None,
) -> DatasetBench:
    ls = [sys.executable, "-m", "loopscope.cli"]
    with scratch.directory("bench-dataset") as tmp:
        if dataset is not None:
            root, recorded = Path(dataset), None
        else:
            root = Path(keep) if keep else Path(tmp) / "runs"
            recorded = _record(root, runs, hosts, duration, say)
        n = len(list(root.glob("*/run.json")))
        page = Path(tmp) / "trend.html"
        floor_svg = Path(tmp) / "floor.svg"
        cases = {
            "runs": ([*ls, "runs", str(root), "--format", "json"], [sys.executable, "-c", FLOOR_RUNS, str(root)], 2.0),
            "query": ([*ls, "query", str(root), P99_BY_HOST, "--format", "json"], [sys.executable, "-c", FLOOR_QUERY, str(root)], 2.0),
            "trend": (
                [*ls, "trend", str(root), "--probe", "timer", "--by", "host", "-o", str(page), "--json"],
                [sys.executable, "-c", FLOOR_TREND, str(root), str(floor_svg)],
                3.0,
            ),
            "records (weak case)": ([*ls, "query", str(root), RECORDS_BY_HOST, "--format", "json"], [sys.executable, "-c", FLOOR_RECORDS, str(root)], None),
        }
        out: dict[str, Case] = {}
        answer: list[list[object]] = []
        for name, (mine, floor, target) in cases.items():
            a, b = [], []
            for _ in range(repeat):
                dt, text = _timed(mine)
                a.append(dt)
                if name == "query":
                    answer = json.loads(text)["rows"]
                b.append(_timed(floor)[0])
            out[name] = {"loopscope": _timing(a), "floor": _timing(b), "ratio": round(statistics.median(a) / statistics.median(b), 2), "target_s": target}
            if say:
                say(f"  {name}: loopscope {out[name]['loopscope']['median']} s, floor {out[name]['floor']['median']} s")
        mb = sum(p.stat().st_size for p in root.rglob("*") if p.is_file()) / 1e6
    return {
        "runs": n,
        "hosts": hosts,
        "recorded_s": round(recorded, 1) if recorded else None,
        "dataset_mb": round(mb, 1),
        "repeat": repeat,
        "cases": out,
        "answer": answer,
    }
