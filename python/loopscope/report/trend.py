"""The page of a trend (``loopscope trend -o PAGE``): one probe's figure
over many runs, each with its interval and the steps worth a look marked,
as a self-contained page in the report's style. The points are the
dataset's (``dataset/trend.py``); the page is the report's.
"""

from __future__ import annotations

import datetime as _dt
from pathlib import Path

from loopscope.report import templates

from loopscope.dataset.trend import Point, Trend
from loopscope.report import charts
from loopscope.report.sections import ns


def page(t: Trend, root: Path) -> str:
    """The trend as one self-contained page in the report's style."""
    order = list(dict.fromkeys(p.run_id for p in t.points))
    index = {r: i for i, r in enumerate(order)}
    labels = [_short(next(p for p in t.points if p.run_id == r)) for r in order]
    series = {name: [(index[p.run_id], p.value_ns, p.lo_ns, p.hi_ns) for p in pts] for name, pts in t.series.items()}
    title = f"{t.probe}: {t.measure} {t.metric}" + (f" by {t.by}" if t.by else "") + f", {len(order)} runs"
    svg = charts.trend(series, labels, title, f"{t.measure} {t.metric}") if t.points else ""
    rows = [
        {
            "run": p.run_id,
            "started": p.started_utc.strftime("%Y-%m-%d %H:%M") if p.started_utc else "",
            "series": p.series,
            "host": p.host,
            "kernel": p.kernel or "",
            "phase": p.phase,
            "value": ns(p.value_ns),
            "ci": f"[{ns(p.lo_ns)}, {ns(p.hi_ns)}]" if p.lo_ns is not None and p.hi_ns is not None else "no interval",
            "reps": p.reps or "",
            "change": p.change,
        }
        for p in t.points
    ]
    return templates.template("trend.html.j2").render(
        css=templates.css(),
        t=t,
        root=str(root),
        chart=svg,
        rows=rows,
        runs=len(order),
        min_effect=f"{t.min_effect * 100:g} %",
        generated=_dt.datetime.now(_dt.timezone.utc).strftime("%Y-%m-%d %H:%M:%S UTC"),
    )


def _short(p: Point) -> str:
    return p.started_utc.strftime("%m-%d %H:%M") if p.started_utc else p.run_id[:15]
