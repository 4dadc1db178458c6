"""Charts for the report, as inline SVG (``report/svg.py``, no JavaScript).

Each function takes the values it draws and returns one ``<svg>``. A chart
is a title, a legend flowing under it, and one or more panels; margins are
sized from the labels they hold. Many samples stay light: lines keep one
point per half pixel and dots one per pixel (svg.py), so a report of a long
run stays a few hundred kilobytes and opens fast.
"""

from __future__ import annotations

import math

import numpy as np
import polars as pl

from loopscope.analysis.explained import Group
from loopscope.analysis.sweeps import Fit
from loopscope.report.svg import FONT, MANY, PALETTE, Figure, Panel, Scale, domain, esc, tick_room, width_of

__all__ = ["MANY", "PALETTE"]

WIDE = 640.0  # px: a chart of one panel
FULL = 920.0  # px: a chart of panels side by side, or of many labels
ROW = 16.0  # px: one bar of a bar chart


def _scale(values: np.ndarray) -> tuple[float, str]:
    m = float(np.nanmax(values)) if len(values) else 1.0
    if m >= 1e6:
        return 1e6, "ms"
    if m >= 1e3:
        return 1e3, "µs"
    return 1.0, "ns"


def _left(yd: tuple[float, float], ylog: bool, ylabel: bool) -> float:
    """The left margin for a panel whose y ticks fall in ``yd``."""
    ticks = Scale(yd[0], yd[1], 0, 1000, ylog).ticks()  # the most labels a panel of this domain shows
    return 8 + (22 if ylabel else 0) + tick_room([f"{v:g}" for v in ticks])


def _head(fig: Figure, title: str, items: list[tuple[str, str]], line: bool = False) -> float:
    """The title and the legend; the y where the panels start."""
    y = fig.title(title, 8, 18)
    return fig.legend(items, 8, y + 4, line=line) + 6


def ecdf(frame: pl.DataFrame, phases: list[str], title: str, xlabel: str) -> str:
    """Empirical CDF per phase (log x), tail emphasised by a log-scaled
    survival axis: where the curves separate above p99 is what loads do."""
    allv = frame["value"].to_numpy()
    pos = allv[allv > 0]
    f, unit = _scale(pos if len(pos) else np.array([1.0]))
    curves = []
    for i, ph in enumerate(phases):
        v = np.sort(frame.filter(pl.col("phase") == ph)["value"].to_numpy().astype(np.float64))
        v = v[v > 0]
        if len(v):
            curves.append((ph, PALETTE[i % len(PALETTE)], v / f, 1.0 - (np.arange(1, len(v) + 1) - 0.5) / len(v)))
    xs = np.concatenate([c[2] for c in curves]) if curves else np.array([1.0])
    ys = np.concatenate([c[3] for c in curves] + [np.array([1.0])])
    xd, yd = domain(xs, log=True), (float(ys.min()) / 1.3, 1.0)
    fig = Figure(WIDE)
    top = _head(fig, title, [(c[0], c[1]) for c in curves], line=True)
    left = _left(yd, True, True)
    p = Panel.at(left, top, fig.w - left - 48, 230, xd, yd, xlog=True, ylog=True)
    p.axes(f"{xlabel} ({unit})", "fraction of samples above")
    for q, lbl in ((0.5, "p50"), (0.01, "p99"), (0.001, "p99.9")):
        p.hline(q, label=lbl)
    for _, colour, v, surv in curves:
        p.step(v, surv, colour)
    fig.add(p)
    fig.grow(p.y + p.h + 40)
    return fig.svg()


def over_time(frame: pl.DataFrame, phases: list[str], title: str, ylabel: str) -> str:
    """Each sample against the time since its step began, one panel per
    phase, repetitions overlaid: drift, warm-up and periodic disturbances show."""
    allv = frame["value"].to_numpy()
    f, unit = _scale(allv[allv > 0] if (allv > 0).any() else np.array([1.0]))
    series: list[tuple[int, np.ndarray, np.ndarray]] = []
    for i, ph in enumerate(phases):
        for r in frame.filter(pl.col("phase") == ph).partition_by("rep", maintain_order=True):
            t = r["t_ns"].to_numpy()
            if len(t):
                series.append((i, (t - t.min()) / 1e9, np.maximum(r["value"].to_numpy().astype(np.float64), 1) / f))
    xd = (0.0, max([float(s[1].max()) for s in series] + [1e-3]) * 1.02)
    yd = domain(np.concatenate([s[2] for s in series]) if series else np.array([1.0]), log=True)
    fig = Figure(WIDE)
    top = fig.title(f"{title} ({ylabel}, {unit})", 8, 18) + 4
    left = _left(yd, True, False) + max((width_of(ph) for ph in phases), default=0) + 6
    h, gap = 78.0, 10.0
    for i, ph in enumerate(phases):
        p = Panel.at(left, top + i * (h + gap), fig.w - left - 16, h, xd, yd, ylog=True)
        last = i == len(phases) - 1
        p.axes("seconds since the probe started (all repetitions overlaid)" if last else "", xticks=None if last else [])
        p.parts.append(f'<text x="8" y="{p.y + h / 2 + 4:.1f}">{esc(ph)}</text>')
        for k, t, v in series:
            if k == i:
                p.dots(t, v, PALETTE[i % len(PALETTE)])
        fig.add(p)
    fig.grow(top + len(phases) * (h + gap) + 30)
    return fig.svg()


def _rows(fig: Figure, top: float, labels: list[str], xd: tuple[float, float], rows: float, right: float = 16) -> Panel:
    """A panel of ``len(labels)`` rows from the top, each ``rows`` px high, labelled at the left."""
    n = max(1, len(labels))
    left = 8 + tick_room(labels)
    p = Panel(left, top, fig.w - left - right, n * rows, Scale(xd[0], xd[1], left, fig.w - right), Scale(0, n, top, top + n * rows))
    return p


def syscall_bars(comp: pl.DataFrame, phases: list[str], title: str, xlabel: str = "per call", labels: dict[str, str] | None = None) -> str:
    """One bar per measure and phase with its 95 % CI (the syscall probe's
    mean per call; a pipeline's p50 or p99 per component), on a linear axis
    in one unit (ns, µs or ms, from the largest interval end)."""
    calls = comp["measure"].unique(maintain_order=True).to_list()
    top_v = comp.select(pl.max_horizontal("value_ns", "value_hi_ns")).to_series().drop_nans().drop_nulls().to_numpy()
    sc, unit = _scale(top_v if len(top_v) else np.array([1.0]))
    k = max(1, len(phases))
    fig = Figure(WIDE + 60)
    top = _head(fig, title, [(ph, PALETTE[i % len(PALETTE)]) for i, ph in enumerate(phases)])
    names = [(labels or {}).get(c, c) for c in calls]
    p = _rows(fig, top, names, (0.0, (float(top_v.max()) / sc if len(top_v) else 1.0) * 1.05), k * ROW + 8)
    p.axes(f"{xlabel} ({unit}, bars: 95% CI)", yticks=[(j + 0.5, s) for j, s in enumerate(names)])
    h = 0.8 / k
    by: dict[tuple[str, str], tuple[float, float, float]] = {}
    nan = math.nan
    for ph_, call_, v, lo, hi in comp.select("phase", "measure", "value_ns", "value_lo_ns", "value_hi_ns").iter_rows():
        # the first row of a measure and phase, as ever
        by.setdefault((ph_, call_), (nan if v is None else float(v), nan if lo is None else float(lo), nan if hi is None else float(hi)))
    for i, ph in enumerate(phases):
        for j, call in enumerate(calls):
            got = by.get((ph, call))
            if got is None:
                continue
            v, lo, hi = got
            if not math.isfinite(v):
                continue
            y0 = j + 0.1 + i * h
            p.rect(0, v / sc, y0, y0 + h * 0.92, PALETTE[i % len(PALETTE)])
            # a percentile-bootstrap interval of a skewed sample may sit beside its point estimate: the bar shows its near side at the value
            lo, hi = (min(lo, v) if math.isfinite(lo) else v), (max(hi, v) if math.isfinite(hi) else v)
            if hi > lo:
                p.whisker(lo / sc, y0 + h * 0.46, hi / sc, y0 + h * 0.46, "#333", cap=2)
    fig.add(p)
    fig.grow(p.y + p.h + 42)
    return fig.svg()


def load_bars(loads: pl.DataFrame) -> str:
    """CPU the loads used, in cores, per phase and repetition."""
    labels = [f"{r['phase']} · rep {r['rep']} · {r['name']}" for r in loads.iter_rows(named=True)]
    util = [float(u or 0.0) for u in loads["cpu_util"].to_list()]
    fig = Figure(WIDE)
    p = _rows(fig, 10, labels, (0.0, max(util + [0.01]) * 1.05), ROW + 6)
    p.axes("CPU used by the load (cores, from its cgroup)", yticks=[(j + 0.5, s) for j, s in enumerate(labels)])
    for j, u in enumerate(util):
        p.rect(0, u, j + 0.15, j + 0.85, PALETTE[0])
    fig.add(p)
    fig.grow(p.y + p.h + 42)
    return fig.svg()


CLOCK_POINTS = 400


def clock_chart(series: pl.DataFrame) -> str:
    """Each host's clock against the reference over the run: the offset's
    change since the start (its drift, and any step) and the bound of the
    estimate, which is the error budget of every cross-host figure."""
    t0 = float(series["t_global_ns"].min() or 0)  # type: ignore[arg-type]
    hosts = []
    for i, host in enumerate(series["host"].unique(maintain_order=True).to_list()):
        g = series.filter(pl.col("host") == host).sort("t_global_ns")
        if len(g) > CLOCK_POINTS:
            # a piecewise-linear estimate: a few hundred points draw it, thousands only weigh the page
            g = g.gather(np.unique(np.linspace(0, len(g) - 1, CLOCK_POINTS).astype(np.int64)))
        th = g["offset_ns"].to_numpy().astype(np.float64)
        hosts.append((host, PALETTE[i % len(PALETTE)], (g["t_global_ns"].to_numpy() - t0) / 1e9, (th - th[0]) / 1e3, g["bound_ns"].to_numpy() / 1e3))
    t = np.concatenate([h[2] for h in hosts])
    fig = Figure(FULL)
    top = fig.legend([(h[0], h[1]) for h in hosts], 8, 16, line=True) + 4
    d1 = domain(np.concatenate([np.concatenate([h[3] - h[4], h[3] + h[4]]) for h in hosts]))
    d2 = domain(np.concatenate([h[4] for h in hosts]), zero=True)
    half = fig.w / 2
    for k, (name, yd) in enumerate((("offset vs reference, change since start (band: bound)", d1), ("bound of the estimate", d2))):
        left = k * half + _left(yd, False, True)
        fig.title(name, left, top + 2, size=FONT, w=half - 24)
        p = Panel.at(left, top + 14, half - (left - k * half) - 16, 170, domain(t), yd)
        p.axes("s", "µs")
        for _, colour, tt, off, b in hosts:
            if k == 0:
                p.band(tt, off - b, off + b, colour)
                p.line(tt, off, colour, 1.2)
            else:
                p.line(tt, b, colour, 1.2)
        fig.add(p)
    fig.grow(top + 14 + 170 + 40)
    return fig.svg()


def _stacked(rows: list[tuple[str, dict[str, float]]], order: list[str], colours: list[str], title: str, xlabel: str) -> str:
    """One stacked horizontal bar per row: shares (0..1) of named parts, in ``order``."""
    fig = Figure(WIDE + 60)
    used = [n for n in order if any((parts.get(n) or 0.0) > 0 for _, parts in rows)]
    top = _head(fig, title, [(n, colours[order.index(n) % len(colours)]) for n in used])
    labels = [label for label, _ in rows]
    p = _rows(fig, top, labels, (0.0, 100.0), ROW + 8)
    p.axes(xlabel, yticks=[(j + 0.5, s) for j, s in enumerate(labels)])
    for j, (_, parts) in enumerate(rows):
        left = 0.0
        for k, name in enumerate(order):
            w = (parts.get(name) or 0.0) * 100
            if w > 0:
                p.rect(left, left + w, j + 0.15, j + 0.85, colours[k % len(colours)])
                left += w
    fig.add(p)
    fig.grow(p.y + p.h + 42)
    return fig.svg()


def cause_bars(groups: list[Group], title: str) -> str:
    """One stacked bar per phase: the outliers' time split by cause (shares)."""
    causes: list[str] = []
    for g in groups:
        for c in g["causes"]:
            if c["cause"] not in causes:
                causes.append(c["cause"])
    rows = [(f"{g['phase']} ({g['outliers']})", {c["cause"]: c["share"] or 0.0 for c in g["causes"]}) for g in groups]
    return _stacked(rows, causes, MANY, title, "% of the outliers' time")


def share_bars(rows: list[tuple[str, dict[str, float]]], order: list[str], title: str, xlabel: str) -> str:
    """One stacked horizontal bar per row: shares (0..1) of named parts, in ``order``."""
    return _stacked(rows, order, PALETTE, title, xlabel)


def erlang_fit(samples: list[tuple[str, np.ndarray, object]], title: str) -> str:
    """Empirical densities (histograms) with the fitted M/Er/1 Erlang curve
    on each, two panels a row; the bins span the body (up to p99), where
    the fit is judged, so a long tail does not squash them into one."""
    cols = min(2, max(1, len(samples)))
    fig = Figure(FULL if cols == 2 else WIDE)
    top = _head(fig, title, [("measured (p0.5–p99)", "#adb5bd"), ("Erlang fit", PALETTE[1])])
    cw, ph = fig.w / cols, 150.0
    for n, (label, x, f) in enumerate(samples):
        x = np.asarray(x, dtype=np.float64)
        lo, hi = float(np.percentile(x, 0.5)), float(np.percentile(x, 99))
        sc, unit = _scale(np.array([hi]))
        dens, edges = np.histogram(x[(x >= lo) & (x <= hi)] / sc, bins=40, range=(lo / sc, hi / sc), density=True)
        xs = np.linspace(lo, hi, 300)
        pdf = f.pdf(xs) * sc  # type: ignore[attr-defined]
        ox, oy = (n % cols) * cw, top + (n // cols) * (ph + 76)
        below = fig.title(f"{label}: Erlang k={f.stages}, KS D = {f.ks_d:.3f}", ox + 16, oy + 2, size=FONT, w=cw - 24)  # type: ignore[attr-defined]
        p = Panel.at(
            ox + 16,
            below - 4,
            cw - 32,
            ph - (below - oy - 16),
            (lo / sc, hi / sc if hi > lo else lo / sc + 1),
            (0.0, float(max(dens.max(initial=0), np.nanmax(pdf, initial=0))) * 1.05 or 1.0),
        )
        p.axes(unit, yticks=[])
        for d, a, b in zip(dens.tolist(), edges[:-1].tolist(), edges[1:].tolist()):
            if d > 0:
                p.rect(a, b, 0, d, "#adb5bd")
        p.line(xs / sc, pdf, PALETTE[1], 1.4)
        fig.add(p)
        fig.grow(p.y + p.h + 40)
    return fig.svg()


def sweep_fits(fits: list[Fit], title: str, xlabel: str) -> str:
    """Mean, SD and p99 against the swept level, with the linear and quadratic fits."""
    fig = Figure(max(WIDE, min(FULL, 300.0 * len(fits))))
    top = _head(fig, title, [("linear fit", PALETTE[2]), ("quadratic fit", PALETTE[1])], line=True)
    cw = fig.w / max(1, len(fits))
    for n, f in enumerate(fits):
        x, y = np.array(f.x, dtype=np.float64), np.array(f.y, dtype=np.float64)
        sc, unit = _scale(y)
        xs = np.linspace(x.min(), x.max(), 100)
        lin = np.polyval(f.linear, xs) / sc
        quad = np.polyval(f.quadratic, xs) / sc if f.quadratic is not None else None
        yd = domain(np.concatenate([y / sc, lin] + ([quad] if quad is not None else [])))
        left = n * cw + _left(yd, False, True)
        r2 = f"linear R² {f.r2_linear:.2f}" + (f", quadratic R² {f.r2_quadratic:.2f}" if f.r2_quadratic is not None else "")
        below = fig.title(f"{f.stat} ({f.best} fits): {r2}", left, top + 2, size=FONT, w=cw - (left - n * cw) - 8)
        p = Panel.at(left, below, cw - (left - n * cw) - 12, 150, domain(x), yd)
        p.axes(xlabel, unit)
        p.line(xs, lin, PALETTE[2], 1.2)
        if quad is not None:
            p.line(xs, quad, PALETTE[1], 1.2, dash="5 3")
        p.markers(x, y / sc, PALETTE[0], 3)
        fig.add(p)
        fig.grow(p.y + p.h + 42)
    return fig.svg()


def trend(series: dict[str, list[tuple[int, float, float | None, float | None]]], labels: list[str], title: str, ylabel: str) -> str:
    """A metric over runs: per series (a host, a kernel) each run's value at
    its place in time order (x: the run's index, labelled below), with its
    95 % interval as a bar where it has one."""
    allv = np.array([v for pts in series.values() for _, v, _, _ in pts], dtype=np.float64)
    div, unit = _scale(allv) if len(allv) else (1.0, "ns")
    his = [p[3] for pts in series.values() for p in pts if p[3] is not None]
    los = [p[2] for pts in series.values() for p in pts if p[2] is not None and p[2] > 0]
    log = bool(his and los and max(his) / min(los) > 20)  # intervals reaching far up (short runs' tails) would flatten every value: log scale
    yd = domain(np.array(list(allv) + his + los, dtype=np.float64) / div, log=log)
    fig = Figure(FULL)
    k = max(1, len(series))
    top = _head(fig, title, [(name, PALETTE[i % len(PALETTE)]) for i, name in enumerate(series)] if k > 1 else [])
    n = len(labels)
    step = max(1, math.ceil(n / 24))
    left = _left(yd, log, True)
    p = Panel.at(left, top, fig.w - left - 16, 220, (-0.6, n - 0.4), yd, ylog=log)
    p.axes("", f"{ylabel} ({unit})", xticks=[(j, labels[j]) for j in range(0, n, step)], rotate=True)
    for i, (_, pts) in enumerate(series.items()):
        if not pts:
            continue
        shift = (i - (k - 1) / 2) * min(0.12, 0.6 / k)  # runs of several series side by side, not on top of each other
        colour = PALETTE[i % len(PALETTE)]
        x = np.array([q[0] for q in pts], dtype=np.float64) + shift
        y = np.array([q[1] for q in pts], dtype=np.float64) / div
        p.line(x, y, colour, 1, opacity=0.35)
        for xi, (_, _, lo, hi) in zip(x.tolist(), pts):
            if lo is not None and hi is not None:
                p.whisker(xi, lo / div, xi, hi / div, colour)
        p.markers(x, y, colour, 3)
    fig.add(p)
    fig.grow(p.y + p.h + max((width_of(s) for s in labels), default=0) * 0.65 + 24)
    return fig.svg()
