"""A monitor's three charts per probe, drawn by the report's ``svg.py``.

- The whole run's histogram: log latency bins (``EDGES``, 8 per factor of
  ten), log counts (the tail is what a long run is for), the threshold.
- The maximum of each period over time, each point coloured by the top
  cause of the outlier that made it.
- The period histograms over time: a heat map of log counts, each period
  as wide as it lasted and the time between periods (not measured) blank.
  It is one embedded PNG, a pixel column per screen pixel, so a month of
  periods weighs what an hour does.
"""

from __future__ import annotations

import datetime as _dt
from typing import Any

import numpy as np

from loopscope.report.svg import MANY, PALETTE, Figure, Panel, Scale, domain, heat, tick_room
from loopscope.rundir import monitor as record
from loopscope.units import format_ns

# latency bins for the histogram and the heat map: 8 per factor of ten, 100 ns to 100 s
EDGES = np.logspace(2, 11, 73)
WIDTH = 900.0


def counts(h: Any) -> np.ndarray:
    """A histogram's counts in ``EDGES`` bins."""
    out = np.zeros(len(EDGES) - 1)
    for item in h.get_recorded_iterator():
        i = int(np.clip(np.searchsorted(EDGES, item.value_iterated_to, side="right") - 1, 0, len(out) - 1))
        out[i] += item.count_at_value_iterated_to
    return out


def span(rows: list[record.PeriodLine]) -> tuple[np.ndarray, np.ndarray, str]:
    """Each period's start and end since the first one started, in seconds,
    minutes or hours as the monitor's length reads best; and the unit."""
    t = [(_dt.datetime.fromisoformat(r["start_utc"]).timestamp(), _dt.datetime.fromisoformat(r["end_utc"]).timestamp()) for r in rows]
    t0 = min(a for a, _ in t)
    total = max(b for _, b in t) - t0
    div, unit = (1.0, "seconds") if total < 120 else ((60.0, "minutes") if total < 7200 else (3600.0, "hours"))
    return np.array([(a - t0) / div for a, _ in t]), np.array([(b - t0) / div for _, b in t]), unit


def _panel(fig: Figure, top: float, xd: tuple[float, float], yd: tuple[float, float], xlog: bool, ylog: bool, ylabels: list[str] | None = None) -> Panel:
    """A panel 170 px high under ``top``, its left margin from its y tick labels."""
    labels = ylabels if ylabels is not None else [f"{v:g}" for v in Scale(yd[0], yd[1], 0, 170, ylog).ticks()]
    left = 8 + 22 + tick_room(labels)
    return Panel.at(left, top, fig.w - left - 30, 170, xd, yd, xlog=xlog, ylog=ylog)


def histogram(name: str, whole: np.ndarray, lo: int, hi: int, thr_ns: int | None) -> str:
    """The whole run's values in their bins, counts on a log scale."""
    fig = Figure(WIDTH)
    top = fig.title(f"{name}: every value of the run ({int(whole.sum()):,})", 8, 18)
    top = fig.legend([(f"threshold {format_ns(thr_ns)}", PALETTE[1])], 8, top + 4, line=True) + 6 if thr_ns else top + 6
    xd = (EDGES[lo] / 1e3, EDGES[hi] / 1e3)
    yd = (0.7, max(float(whole.max(initial=0)), 1.0) * 1.5)
    p = _panel(fig, top, xd, yd, True, True)
    p.axes("latency (µs)", "values (log)")
    for k in range(lo, hi):
        if whole[k] > 0:
            p.rect(EDGES[k] / 1e3, EDGES[k + 1] / 1e3, 0.7, float(whole[k]), PALETTE[0])
    if thr_ns:
        p.vline(thr_ns / 1e3, PALETTE[1])
    fig.add(p)
    fig.grow(p.y + p.h + 42)
    return fig.svg()


def maxima(name: str, rows: list[record.PeriodLine], outl: list[record.OutlierLine], thr_ns: int | None) -> str:
    """Each period's maximum at its middle, coloured by the top cause of the outlier that made it."""
    by_t = {(o["probe"], o["t_ns"]): o for o in outl}
    starts, ends, unit = span(rows)
    x = (starts + ends) / 2
    mx = np.array([r.get("max_ns") or 0 for r in rows], dtype=np.float64) / 1e3
    causes = [
        (o.get("top_cause") if (o := by_t.get((name, r.get("max_t_ns", -1)))) is not None else None)
        or ("below the threshold" if thr_ns and (r.get("max_ns") or 0) <= thr_ns else "not kept")
        for r in rows
    ]
    names = sorted(set(causes), key=causes.index)
    colour = {c: "#ced4da" if c == "below the threshold" else MANY[i % len(MANY)] for i, c in enumerate(names)}
    fig = Figure(WIDTH)
    top = fig.title(f"{name}: the maximum of each period, by the top cause of the outlier that made it", 8, 18)
    top = fig.legend([(c, colour[c]) for c in names], 8, top + 4) + 6
    p = _panel(fig, top, (0.0, float(ends.max()) or 1.0), domain(mx, log=True), False, True)
    p.axes(f"{unit} since the first period began (each point at its period's middle)", "maximum (µs)")
    p.line(x, np.maximum(mx, 1e-3), "#adb5bd", 0.8)
    for c in names:
        sel = [j for j, cc in enumerate(causes) if cc == c]
        p.markers(x[sel], np.maximum(mx[sel], 1e-3), colour[c], 3)
    fig.add(p)
    fig.grow(p.y + p.h + 42)
    return fig.svg()


def heatmap(name: str, per: np.ndarray, rows: list[record.PeriodLine], lo: int, hi: int) -> str:
    """Each period's histogram as a column of log counts over the latency bins."""
    img = np.log10(per.T[lo:hi] + 1)
    scaled = img / max(float(img.max(initial=0)), 1e-9)
    fig = Figure(WIDTH)
    top = fig.title(f"{name}: each period's histogram (colour: log count)", 8, 18) + 6
    ticks = [i for i in range(lo, hi + 1) if i % 8 == 0] or [lo]
    labels = [format_ns(EDGES[i]) for i in ticks]
    timed = len(rows) == len(per)
    if timed:
        starts, ends, unit = span(rows)
        xd, xlabel = (0.0, float(ends.max()) or 1.0), f"{unit} since the first period began (blank: not measured, between periods)"
    else:
        starts, ends = np.arange(len(per)) + 0.5, np.arange(len(per)) + 1.5
        xd, xlabel = (0.5, len(per) + 0.5), "period"
    p = _panel(fig, top, xd, (float(lo), float(hi)), False, False, labels)
    # a pixel column per screen pixel: each shows the period covering its middle, or nothing
    cols = int(p.w)
    mid = xd[0] + (np.arange(cols) + 0.5) / cols * (xd[1] - xd[0])
    k = np.searchsorted(starts, mid, side="right") - 1
    inside = (k >= 0) & (mid <= ends[np.clip(k, 0, len(ends) - 1)])
    grid = np.where(inside[None, :], scaled[:, np.clip(k, 0, len(per) - 1)], np.nan)
    p.image(heat(grid[::-1]))  # the image's first row is the panel's top: the highest bin
    p.axes(xlabel, "latency", yticks=list(zip([float(i) for i in ticks], labels)))
    fig.add(p)
    fig.grow(p.y + p.h + 42)
    return fig.svg()


def probe_charts(name: str, hs: list[Any], periods: list[record.PeriodLine], outl: list[record.OutlierLine], thr_ns: int | None) -> list[str]:
    """The three charts of one probe (two when it has no periods)."""
    rows = [r for r in periods if r["probe"] == name]
    per = np.array([counts(h) for h in hs]) if hs else np.zeros((0, len(EDGES) - 1))
    whole = per.sum(axis=0) if len(per) else np.zeros(len(EDGES) - 1)
    # the bins that hold values, and a little either side
    nz = np.nonzero(whole)[0]
    lo, hi = (max(0, int(nz[0]) - 2), min(len(whole), int(nz[-1]) + 3)) if len(nz) else (0, len(whole))
    out = [histogram(name, whole, lo, hi, thr_ns)]
    if rows:
        out.append(maxima(name, rows, outl, thr_ns))
    if len(per):
        out.append(heatmap(name, per, rows, lo, hi))
    return out
