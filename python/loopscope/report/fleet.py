"""The fleet page (``loopscope fleet DIR``): every monitor under a directory
on one page, from the dataset's views (``periods``, ``outliers``,
``outlier_causes``: ``dataset/query.py``).

- hosts × hours: each cell the largest period maximum of that host and hour,
  coloured by the top cause of the outlier that made it (grey: the maximum
  stayed below the threshold, or its outlier was not kept); the exact value,
  cause and share are the cell's tooltip. Columns are hours for up to a week,
  longer buckets beyond, so the grid fits a 1280 px page;
- the causes ranked over the fleet by their time in the outliers, and by host
  and by kernel (each one's top three);
- the worst outliers, each with its kept window's causes and where the window is.

An HTML table, no JavaScript, rendered through the report's template
machinery (``fleet.html.j2``, ``page.css``).
"""

from __future__ import annotations

import datetime as _dt
from pathlib import Path

from loopscope.report import templates
from typing_extensions import TypedDict

from loopscope import __version__
from loopscope.dataset.query import Query
from loopscope.report.sections import ns

#: most columns the grid draws (a week of hours); longer spans take longer buckets
MAX_COLUMNS = 168
#: how many causes get a colour of their own (the rest: "other")
COLOURED = 10
PALETTE = ["#1f77b4", "#d62728", "#2ca02c", "#ff7f0e", "#9467bd", "#8c564b", "#e377c2", "#17becf", "#bcbd22", "#7f7f7f"]
GREY = "#dfe3e8"


class Cell(TypedDict):
    cls: str
    title: str


class GridRow(TypedDict):
    host: str
    cells: list[Cell]


class CauseRow(TypedDict):
    cause: str
    time: str
    share: str
    outliers: int


class WorstRow(TypedDict):
    monitor: str
    host: str
    probe: str
    at: str
    value: str
    causes: str
    window: str


def _bucket_hours(hours: float) -> int:
    """The grid's column width in hours: 1 up to a week, else as many as keep it to ``MAX_COLUMNS`` columns."""
    return max(1, -(-int(hours) // MAX_COLUMNS))


def page(q: Query, root: Path) -> str:
    """The fleet page of the monitors under ``root``."""
    span = q.run("SELECT min(start_utc), max(end_utc) FROM periods").rows[0]
    t0, t1 = span if span and span[0] is not None else (None, None)
    width = _bucket_hours(((t1 - t0).total_seconds() / 3600) if t0 and t1 else 1)
    causes = _ranked(q)
    colour = {c["cause"]: i for i, c in enumerate(causes[:COLOURED])}
    monitors = [m for m in q.ds.monitors if m.readable]
    # a host name two monitors share (each machine's spec says localhost) is two hosts: named with its monitor
    seen = [h for m in monitors for h in m.hosts]
    key = "run_id || ' · ' || host" if len(seen) != len(set(seen)) else "host"
    hosts = [r[0] for r in q.run(f"SELECT DISTINCT {key} FROM periods ORDER BY 1").rows]
    return templates.template("fleet.html.j2").render(
        css=templates.css(),
        root=str(root),
        monitors=len(monitors),
        hosts=len(hosts),
        kernels=len({k for m in monitors for k in m.hosts.values() if k}),
        outliers=sum(m.outliers_above for m in monitors),
        kept=sum(m.kept for m in monitors),
        span=f"{t0:%Y-%m-%d %H:%M} to {t1:%Y-%m-%d %H:%M} UTC" if t0 and t1 else "no period yet",
        width=width,
        grid=_grid(q, t0, width, hosts, colour, key) if t0 else [],
        columns=_columns(t0, t1, width) if t0 and t1 else [],
        legend=[{"cls": f"c{i}", "cause": c} for c, i in colour.items()],
        palette=PALETTE,
        grey=GREY,
        causes=causes,
        by_host=_top_by(q, key),
        by_kernel=_top_by(q, "kernel"),
        worst=_worst(q),
        notes=q.ds.notes() + q.notes,
        version=__version__,
        generated=_dt.datetime.now(_dt.timezone.utc).strftime("%Y-%m-%d %H:%M:%S UTC"),
    )


def _columns(t0: _dt.datetime, t1: _dt.datetime, width: int) -> list[str]:
    """Each column's label: its start, shown every so many columns."""
    start = t0.replace(minute=0, second=0, microsecond=0)
    n = int((t1 - start).total_seconds() // (3600 * width)) + 1
    every = max(1, n // 8)
    return [(start + _dt.timedelta(hours=i * width)).strftime("%m-%d %H:00") if i % every == 0 else "" for i in range(n)]


def _grid(q: Query, t0: _dt.datetime, width: int, hosts: list[str], colour: dict[str, int], key: str) -> list[GridRow]:
    start = t0.replace(minute=0, second=0, microsecond=0)
    edge = f"TIMESTAMPTZ '{start.isoformat()}'"
    col = f"floor(epoch(start_utc - {edge}) / {3600 * width})::INTEGER"
    cells = q.run(
        f"SELECT p.h, p.col, p.mx, o.top_cause, o.top_share FROM (SELECT {key} AS h, {col} AS col, max(max_ns) AS mx FROM periods GROUP BY ALL) p "
        f"LEFT JOIN (SELECT {key} AS h, {col.replace('start_utc', 'at_utc')} AS col, arg_max(top_cause, value_ns) AS top_cause, arg_max(top_share, value_ns) AS top_share "
        "FROM outliers GROUP BY ALL) o ON o.h = p.h AND o.col = p.col"
    ).rows
    n = max((int(c[1]) for c in cells), default=-1) + 1
    by = {(h, int(c)): (mx, cause, share) for h, c, mx, cause, share in cells}
    out: list[GridRow] = []
    for h in hosts:
        row: list[Cell] = []
        for i in range(n):
            got = by.get((h, i))
            if got is None:
                row.append({"cls": "none", "title": f"{h}: not measured"})
                continue
            mx, cause, share = got
            cls = f"c{colour[cause]}" if cause in colour else ("other" if cause else "quiet")
            what = f"{cause} {share * 100:.0f} %" if cause and share is not None else "no outlier kept"
            row.append({"cls": cls, "title": f"{h}: max {ns(mx)}; {what}"})
        out.append({"host": h, "cells": row})
    return out


def _ranked(q: Query) -> list[CauseRow]:
    rows = q.run("SELECT cause, sum(ns) AS t, count(DISTINCT (run_id, t_ns)) AS n FROM outlier_causes GROUP BY cause ORDER BY t DESC, cause").rows
    total = sum(float(r[1] or 0) for r in rows) or 1.0
    return [{"cause": str(c), "time": ns(float(t or 0)), "share": f"{float(t or 0) / total:.1%}", "outliers": int(n)} for c, t, n in rows]


def _top_by(q: Query, key: str) -> list[dict[str, str]]:
    """Each host's (``key``: an expression of it) or kernel's three causes with the most time, with their shares of its outliers' time."""
    rows = q.run(
        f"SELECT k, cause, t FROM (SELECT coalesce({key}, 'unknown') AS k, cause, sum(ns) AS t FROM outlier_causes GROUP BY ALL) "
        "QUALIFY row_number() OVER (PARTITION BY k ORDER BY t DESC, cause) <= 3 ORDER BY k, t DESC"
    ).rows
    totals = dict(q.run(f"SELECT coalesce({key}, 'unknown'), sum(ns) FROM outlier_causes GROUP BY ALL").rows)
    out: dict[str, list[str]] = {}
    for k, cause, t in rows:
        out.setdefault(str(k), []).append(f"{cause} {float(t) / float(totals.get(k) or 1):.0%}")
    return [{"key": k, "causes": " · ".join(v)} for k, v in out.items()]


def _worst(q: Query, n: int = 20) -> list[WorstRow]:
    rows = q.run(
        "SELECT o.run_id, o.host, o.probe, o.at_utc, o.value_ns, o.causes, o.kept_window, m.path FROM outliers o "
        f"JOIN (SELECT DISTINCT run_id, path FROM runs) m ON m.run_id = o.run_id ORDER BY o.value_ns DESC LIMIT {n}"
    ).rows
    out: list[WorstRow] = []
    for run_id, host, probe, at, v, causes, window, path in rows:
        text = " · ".join(f"{c['cause']} {c['share'] * 100:.0f} %" for c in (causes or [])[:4]) or "not kept"
        out.append(
            {
                "monitor": str(run_id),
                "host": str(host),
                "probe": str(probe),
                "at": at.strftime("%Y-%m-%d %H:%M:%S.%f")[:-3] if at else "",
                "value": ns(float(v)),
                "causes": text,
                "window": f"{path}/windows/ (window {window})" if window else "",
            }
        )
    return out
