"""``loopscope bench report``: how long ``loopscope report`` takes on a run
whose derived files are gone, reading each trace once against the way it
read before (every part of the report opening the files it needs itself).

The run is copied to a scratch directory; before every build its derived
files (tables, timeline, clock estimate, explain, the page) are removed, so
each build does the whole job. The two ways alternate, ``runs`` times each;
the figures are medians with their range, the ratio is of the medians, and
each build says how many trace files it read (``traces_read``; the run's
trace count is the floor). ``page`` is the size of the last page built, its
largest inline chart and its chart count (the report's target: at most 1 MB).
"""

from __future__ import annotations

import shutil
import statistics
import time
from pathlib import Path
from typing import Callable

from typing_extensions import TypedDict

from loopscope.analysis.registry import Registry
from loopscope.trace import reader
import re
from loopscope.report import build
from loopscope.rundir import RunDir
from loopscope.host import scratch

DERIVED = ["tables", "report.html", "report.json", "timeline.json", "timeline.parquet", "clock.json", "explain.json"]


def _strip(run: Path) -> None:
    for name in DERIVED:
        p = run / name
        if p.is_dir():
            shutil.rmtree(p)
        elif p.exists():
            p.unlink()


class Timing(TypedDict):
    median: float
    range: list[float]


class PageSize(TypedDict):
    bytes: int
    largest_chart_bytes: int
    charts: int


class ReportBench(TypedDict):
    """What ``loopscope bench report --json`` prints: the report built with each
    part reading its own traces against each trace read once, alternating."""

    run: str
    traces: int
    runs: int
    seconds: dict[str, Timing]
    traces_read: dict[str, float]
    speedup: float | None
    page: PageSize


def bench(run_dir: Path, kinds: Registry, runs: int = 3, say: Callable[[str], None] | None = None) -> ReportBench:
    src = RunDir.open(run_dir).path
    traces = sum(1 for _ in src.rglob("*.lstrace"))
    out: dict[str, list[float]] = {"once": [], "each_part": []}
    reads: dict[str, list[int]] = {"once": [], "each_part": []}
    with scratch.directory("bench-report") as tmp:
        work = Path(tmp) / src.name
        shutil.copytree(src, work, ignore=shutil.ignore_patterns(*DERIVED))
        for i in range(runs):
            for way in ("each_part", "once") if i % 2 == 0 else ("once", "each_part"):
                _strip(work)
                before = reader.opened
                t0 = time.perf_counter()
                build(work, kinds, share_reads=way == "once")
                out[way].append(time.perf_counter() - t0)
                reads[way].append(reader.opened - before)
                if say:
                    say(f"  {way}: {out[way][-1]:.1f} s, {reads[way][-1]} trace files read")
        page = _page(work / "report.html")
    med = {k: statistics.median(v) for k, v in out.items()}
    return {
        "run": str(src),
        "traces": traces,
        "runs": runs,
        "seconds": {k: {"median": round(med[k], 2), "range": [round(min(v), 2), round(max(v), 2)]} for k, v in out.items()},
        "traces_read": {k: statistics.median(v) for k, v in reads.items()},
        "speedup": round(med["each_part"] / med["once"], 2) if med["once"] else None,
        "page": page,
    }


def _page(html: Path) -> PageSize:
    """The page's bytes, its largest inline SVG's bytes, and how many it has."""

    text = html.read_text()
    svgs = [len(m.group(0).encode()) for m in re.finditer(r"<svg.*?</svg>", text, re.S)]
    return {"bytes": len(text.encode()), "largest_chart_bytes": max(svgs, default=0), "charts": len(svgs)}
