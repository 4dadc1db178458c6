"""Charts for the report, as inline SVG (matplotlib, no JavaScript).

Scatter plots of many points are rasterised inside the SVG (an embedded
image), so a report of a long run stays a few hundred kilobytes and opens
fast; axes, labels and lines stay vector.
"""

from __future__ import annotations

import io
import math
import re
from typing import Any

import matplotlib

matplotlib.use("Agg")
import matplotlib.pyplot as plt  # noqa: E402
from matplotlib.figure import Figure  # noqa: E402

from loopscope.analysis.sweeps import Fit  # noqa: E402
from loopscope.analysis.explained import Group  # noqa: E402
import numpy as np  # noqa: E402
import polars as pl  # noqa: E402
from matplotlib.ticker import FuncFormatter, LogFormatterSciNotation

# Up to 20 causes in one chart, each its own colour (matplotlib's tab20).
MANY = [matplotlib.colormaps["tab20"](i) for i in range(20)]
PALETTE = ["#1f5fa8", "#d9480f", "#2b8a3e", "#862e9c", "#e67700", "#0b7285", "#c2255c", "#5c940d", "#495057", "#364fc7"]

plt.rcParams.update(
    {
        # Sizes in points at the figure's own size; every chart is at most
        # about 9.5 in wide, so the page shows it unscaled and no text is
        # under 11 px on screen (the report tests measure it: 12 px here).
        "font.size": 10,
        "legend.fontsize": 9,
        "xtick.labelsize": 9,
        "ytick.labelsize": 9,
        "axes.spines.top": False,
        "axes.spines.right": False,
        "axes.grid": True,
        "grid.alpha": 0.25,
        "svg.fonttype": "none",
        "figure.dpi": 100,
    }
)


def _svg(fig: Figure) -> str:
    buf = io.StringIO()
    fig.savefig(buf, format="svg", bbox_inches="tight")
    plt.close(fig)
    s = buf.getvalue()
    s = s[s.index("<svg") :]
    # Unique ids per chart so several inline SVGs do not clash.
    tag = f"c{id(buf) & 0xFFFFFF:x}"
    s = re.sub(r'id="([^"]+)"', lambda m: f'id="{tag}{m.group(1)}"', s)
    s = re.sub(r"url\(#([^)]+)\)", lambda m: f"url(#{tag}{m.group(1)})", s)
    s = re.sub(r'xlink:href="#([^"]+)"', lambda m: f'xlink:href="#{tag}{m.group(1)}"', s)
    return s


class _PlainMinor(LogFormatterSciNotation):
    """A log axis's minor ticks labelled where matplotlib would label them
    (an axis under a decade or two), as plain numbers: its own labels are
    mathtext, whose parsing took a third of a small report's charts."""

    def __call__(self, x: float, pos: int | None = None) -> str:
        return f"{x:g}" if super().__call__(x, pos) else ""


def _plain(axis: Any) -> None:
    """Log-axis ticks as plain numbers (0.1, 1, 10), not powers of ten."""

    axis.set_major_formatter(FuncFormatter(lambda v, _: f"{v:g}"))
    axis.set_minor_formatter(_PlainMinor(labelOnlyBase=False))


def _scale(values: np.ndarray) -> tuple[float, str]:
    m = float(np.nanmax(values)) if len(values) else 1.0
    if m >= 1e6:
        return 1e6, "ms"
    if m >= 1e3:
        return 1e3, "µs"
    return 1.0, "ns"


def ecdf(frame: pl.DataFrame, phases: list[str], title: str, xlabel: str) -> str:
    """Empirical CDF per phase (log x), tail emphasised by a log-scaled
    survival axis: where the curves separate above p99 is what loads do."""
    fig, ax = plt.subplots(figsize=(6.4, 3.4))
    allv = frame["value"].to_numpy()
    pos = allv[allv > 0]
    f, unit = _scale(pos if len(pos) else np.array([1.0]))
    for i, ph in enumerate(phases):
        v = np.sort(frame.filter(pl.col("phase") == ph)["value"].to_numpy().astype(np.float64))
        v = v[v > 0]
        if not len(v):
            continue
        surv = 1.0 - (np.arange(1, len(v) + 1) - 0.5) / len(v)
        ax.step(v / f, surv, where="post", color=PALETTE[i % len(PALETTE)], lw=1.4, label=ph)
    ax.set_xscale("log")
    ax.set_yscale("log")
    _plain(ax.xaxis)
    _plain(ax.yaxis)
    ax.set_xlabel(f"{xlabel} ({unit})")
    ax.set_ylabel("fraction of samples above")
    ax.set_title(title, loc="left")
    for q, lbl in ((0.5, "p50"), (0.01, "p99"), (0.001, "p99.9")):
        ax.axhline(q, color="#888", lw=0.6, ls=":")
        ax.text(1.0, q, f" {lbl}", transform=ax.get_yaxis_transform(), va="center", fontsize=9, color="#666")
    ax.legend(fontsize=9, frameon=False, ncol=2)
    return _svg(fig)


def over_time(frame: pl.DataFrame, phases: list[str], title: str, ylabel: str) -> str:
    """Each sample against the time since its step began, one panel per
    phase, repetitions in shades: drift, warm-up and periodic disturbances show."""
    n = len(phases)
    fig, axes = plt.subplots(n, 1, figsize=(6.4, 1.25 * n + 0.6), sharex=True, sharey=True, squeeze=False)
    allv = frame["value"].to_numpy()
    f, unit = _scale(allv[allv > 0] if (allv > 0).any() else np.array([1.0]))
    for i, ph in enumerate(phases):
        ax = axes[i][0]
        g = frame.filter(pl.col("phase") == ph)
        for j, (_, r) in enumerate(g.group_by("rep", maintain_order=True)):
            t = r["t_ns"].to_numpy()
            v = r["value"].to_numpy().astype(np.float64)
            if not len(t):
                continue
            ax.scatter((t - t.min()) / 1e9, np.maximum(v, 1) / f, s=2, alpha=0.5, color=PALETTE[i % len(PALETTE)], lw=0, rasterized=True)
            del j
        ax.set_yscale("log")
        _plain(ax.yaxis)
        ax.set_ylabel(ph, rotation=0, ha="right", va="center", fontsize=9)
    axes[-1][0].set_xlabel("seconds since the probe started (all repetitions overlaid)")
    axes[0][0].set_title(f"{title} ({ylabel}, {unit})", loc="left")
    return _svg(fig)


def syscall_bars(comp: pl.DataFrame, phases: list[str], title: str, xlabel: str = "per call", labels: dict[str, str] | None = None) -> str:
    """One bar per measure and phase with its 95 % CI (the syscall probe's
    mean per call; a pipeline's p50 or p99 per component), on a linear axis
    in one unit (ns, µs or ms, from the largest interval end)."""
    calls = comp["measure"].unique(maintain_order=True).to_list()
    fig, ax = plt.subplots(figsize=(7.0, 0.3 * len(calls) * max(1, len(phases)) / 2 + 1.4))
    h = 0.8 / max(1, len(phases))
    top = comp.select(pl.max_horizontal("value_ns", "value_hi_ns")).to_series().drop_nans().drop_nulls().to_numpy()
    sc, unit = _scale(top if len(top) else np.array([1.0]))
    for i, ph in enumerate(phases):
        c = comp.filter(pl.col("phase") == ph)
        y, x, lo, hi = [], [], [], []
        for k, call in enumerate(calls):
            r = c.filter(pl.col("measure") == call)
            if r.is_empty():
                continue
            v, vlo, vhi = (float(r[col][0]) for col in ("value_ns", "value_lo_ns", "value_hi_ns"))
            y.append(k + i * h)
            x.append(v / sc)
            # A percentile-bootstrap interval of a skewed sample may sit beside
            # its point estimate; the bar then shows the interval's near side at 0.
            lo.append(max(0.0, v - vlo) / sc if np.isfinite(vlo) else 0.0)
            hi.append(max(0.0, vhi - v) / sc if np.isfinite(vhi) else 0.0)
        ax.barh(y, x, height=h, color=PALETTE[i % len(PALETTE)], label=ph, xerr=[lo, hi], error_kw={"lw": 0.8, "capsize": 1.5})
    ax.set_yticks([k + 0.4 - h / 2 for k in range(len(calls))], [(labels or {}).get(c, c) for c in calls])
    ax.invert_yaxis()
    ax.set_xlim(left=0)
    ax.set_xlabel(f"{xlabel} ({unit}, bars: 95% CI)")
    ax.set_title(title, loc="left")
    ax.legend(frameon=False)
    return _svg(fig)


def load_bars(loads: pl.DataFrame) -> str:
    """CPU the loads used, in cores, per phase and repetition."""
    fig, ax = plt.subplots(figsize=(6.4, 0.3 * len(loads) + 1.0))
    labels = [f"{r['phase']} · rep {r['rep']} · {r['name']}" for r in loads.iter_rows(named=True)]
    ax.barh(range(len(loads)), loads["cpu_util"].to_list(), color=PALETTE[0])
    ax.set_yticks(range(len(loads)), labels, fontsize=9)
    ax.invert_yaxis()
    ax.set_xlabel("CPU used by the load (cores, from its cgroup)")
    return _svg(fig)


CLOCK_POINTS = 400


def clock_chart(series: pl.DataFrame) -> str:
    """Each host's clock against the reference over the run: the offset's
    change since the start (its drift, and any step) and the bound of the
    estimate, which is the error budget of every cross-host figure."""
    fig, (ax1, ax2) = plt.subplots(1, 2, figsize=(9.0, 2.8))
    t0 = float(series["t_global_ns"].min() or 0)  # type: ignore[arg-type]
    for i, host in enumerate(series["host"].unique(maintain_order=True).to_list()):
        g = series.filter(pl.col("host") == host).sort("t_global_ns")
        if len(g) > CLOCK_POINTS:
            # a piecewise-linear estimate: a few hundred points draw it, thousands only weigh the page
            g = g.gather(np.unique(np.linspace(0, len(g) - 1, CLOCK_POINTS).astype(np.int64)))
        t = (g["t_global_ns"].to_numpy() - t0) / 1e9
        th = g["offset_ns"].to_numpy()
        b = g["bound_ns"].to_numpy()
        c = PALETTE[i % len(PALETTE)]
        ax1.plot(t, (th - th[0]) / 1e3, color=c, lw=1.2, label=host)
        ax1.fill_between(t, (th - th[0] - b) / 1e3, (th - th[0] + b) / 1e3, color=c, alpha=0.15, lw=0, rasterized=True)
        ax2.plot(t, b / 1e3, color=c, lw=1.2, label=host)
    ax1.set_title("offset vs reference, change since start (band: bound)")
    ax1.set_xlabel("s")
    ax1.set_ylabel("µs")
    ax2.set_title("bound of the estimate")
    ax2.set_xlabel("s")
    ax2.set_ylabel("µs")
    ax2.set_ylim(bottom=0)
    ax1.legend(fontsize=9, frameon=False)
    return _svg(fig)


def _legend_outside(ax: Any) -> None:
    """One legend entry per label, right of the axes."""
    handles, labels = ax.get_legend_handles_labels()
    seen: dict[str, object] = {}
    for h, l in zip(handles, labels):
        seen.setdefault(l, h)
    ax.legend(list(seen.values()), list(seen.keys()), fontsize=9, frameon=False, loc="upper left", bbox_to_anchor=(1.01, 1.0))


def cause_bars(groups: list[Group], title: str) -> str:
    """One stacked bar per phase: the outliers' time split by cause (shares)."""
    causes: list[str] = []
    for g in groups:
        for c in g["causes"]:
            if c["cause"] not in causes:
                causes.append(c["cause"])
    fig, ax = plt.subplots(figsize=(6.6, 0.45 * len(groups) + 1.3))
    for i, g in enumerate(groups):
        left = 0.0
        share = {c["cause"]: c["share"] or 0.0 for c in g["causes"]}
        for k, cause in enumerate(causes):
            w = share.get(cause, 0.0) * 100
            if w > 0:
                ax.barh(i, w, left=left, color=MANY[k % len(MANY)], label=cause if i == 0 or cause not in [c["cause"] for c in groups[0]["causes"]] else None)
                left += w
    ax.set_yticks(range(len(groups)))
    ax.set_yticklabels([f"{g['phase']} ({g['outliers']})" for g in groups])
    ax.invert_yaxis()
    ax.set_xlim(0, 100)
    ax.set_xlabel("% of the outliers' time")
    ax.set_title(title)
    _legend_outside(ax)
    return _svg(fig)


def share_bars(rows: list[tuple[str, dict[str, float]]], order: list[str], title: str, xlabel: str) -> str:
    """One stacked horizontal bar per row: shares (0..1) of named parts, in ``order``."""
    fig, ax = plt.subplots(figsize=(6.6, 0.4 * len(rows) + 1.3))
    for i, (_, parts) in enumerate(rows):
        left = 0.0
        for k, name in enumerate(order):
            w = (parts.get(name) or 0.0) * 100
            if w > 0:
                ax.barh(i, w, left=left, color=PALETTE[k % len(PALETTE)], label=name)
                left += w
    ax.set_yticks(range(len(rows)))
    ax.set_yticklabels([label for label, _ in rows], fontsize=9)
    ax.invert_yaxis()
    ax.set_xlim(0, 100)
    ax.set_xlabel(xlabel)
    ax.set_title(title)
    _legend_outside(ax)
    return _svg(fig)


def erlang_fit(samples: list[tuple[str, np.ndarray, object]], title: str) -> str:
    """Empirical densities (histograms) with the fitted M/Er/1 Erlang curve
    on each, two panels a row; the bins span the body (up to p99), where
    the fit is judged, so a long tail does not squash them into one."""
    n = len(samples)
    cols = min(2, n)
    rows = (n + cols - 1) // cols
    fig, axes = plt.subplots(rows, cols, figsize=(4.4 * cols + 0.4, 2.6 * rows + 0.5), squeeze=False, layout="constrained")
    for ax, (label, x, f) in zip(axes.flat, samples):
        x = np.asarray(x, dtype=np.float64)
        lo, hi = float(np.percentile(x, 0.5)), float(np.percentile(x, 99))
        sc, unit = _scale(np.array([hi]))
        body = x[(x >= lo) & (x <= hi)]
        ax.hist(body / sc, bins=40, range=(lo / sc, hi / sc), density=True, color="#adb5bd", label="measured (p0.5–p99)")
        xs = np.linspace(lo, hi, 300)
        ax.plot(xs / sc, f.pdf(xs) * sc, color=PALETTE[1], lw=1.4, label=f"Erlang k={f.stages}")  # type: ignore[attr-defined]
        ax.set_title(f"{label}, KS D = {f.ks_d:.3f}", fontsize=9)  # type: ignore[attr-defined]
        ax.set_xlabel(unit)
        ax.set_yticks([])
        ax.legend(frameon=False)
    for ax in list(axes.flat)[n:]:
        ax.set_visible(False)
    fig.suptitle(title, fontsize=10)
    return _svg(fig)


def sweep_fits(fits: list[Fit], title: str, xlabel: str) -> str:
    """Mean, SD and p99 against the swept level, with the linear and quadratic fits."""
    fig, axes = plt.subplots(1, len(fits), figsize=(2.9 * len(fits) + 0.5, 2.6), squeeze=False, layout="constrained")
    for ax, f in zip(axes[0], fits):
        x, y = np.array(f.x), np.array(f.y)
        sc, unit = _scale(y)
        xs = np.linspace(x.min(), x.max(), 100)
        ax.plot(x, y / sc, "o", color=PALETTE[0], ms=4)
        ax.plot(xs, np.polyval(f.linear, xs) / sc, color=PALETTE[2], lw=1.2, label=f"linear R² {f.r2_linear:.2f}")
        if f.quadratic is not None:
            ax.plot(xs, np.polyval(f.quadratic, xs) / sc, color=PALETTE[1], lw=1.2, ls="--", label=f"quadratic R² {f.r2_quadratic:.2f}")
        ax.set_title(f"{f.stat} ({f.best} fits)", fontsize=9)
        ax.set_xlabel(xlabel)
        ax.set_ylabel(unit)
        ax.legend(fontsize=9, frameon=False)
    fig.suptitle(title, fontsize=9)
    return _svg(fig)


def trend(series: dict[str, list[tuple[int, float, float | None, float | None]]], labels: list[str], title: str, ylabel: str) -> str:
    """A metric over runs: per series (a host, a kernel) each run's value at
    its place in time order (x: the run's index, labelled below), with its
    95 % interval as a bar where it has one."""
    allv = np.array([v for pts in series.values() for _, v, _, _ in pts], dtype=np.float64)
    div, unit = _scale(allv) if len(allv) else (1.0, "ns")
    fig, ax = plt.subplots(figsize=(9.4, 3.8))
    k = max(1, len(series))
    for i, (name, pts) in enumerate(series.items()):
        if not pts:
            continue
        shift = (i - (k - 1) / 2) * min(0.12, 0.6 / k)  # runs of several series side by side, not on top of each other
        x = np.array([p[0] for p in pts], dtype=np.float64) + shift
        y = np.array([p[1] for p in pts], dtype=np.float64) / div
        lo = np.array([np.nan if p[2] is None else p[2] for p in pts], dtype=np.float64) / div
        hi = np.array([np.nan if p[3] is None else p[3] for p in pts], dtype=np.float64) / div
        colour = PALETTE[i % len(PALETTE)]
        ax.plot(x, y, "-", color=colour, alpha=0.35, linewidth=1)
        ok = np.isfinite(lo) & np.isfinite(hi)
        if ok.any():
            ax.errorbar(x[ok], y[ok], yerr=[y[ok] - lo[ok], hi[ok] - y[ok]], fmt="none", ecolor=colour, elinewidth=1.2, capsize=2.5)
        ax.plot(x, y, "o", color=colour, markersize=4, label=name)
    his = [p[3] for pts in series.values() for p in pts if p[3] is not None]
    los = [p[2] for pts in series.values() for p in pts if p[2] is not None and p[2] > 0]
    if his and los and max(his) / min(los) > 20:  # intervals reaching far up (short runs' tails) would flatten every value: log scale
        ax.set_yscale("log")
        _plain(ax.yaxis)
    n = len(labels)
    step = max(1, math.ceil(n / 24))
    ax.set_xticks(range(0, n, step))
    ax.set_xticklabels([labels[j] for j in range(0, n, step)], rotation=40, ha="right")
    ax.set_xlim(-0.6, n - 0.4)
    ax.set_ylabel(f"{ylabel} ({unit})")
    ax.set_title(title, loc="left")
    if k > 1:
        _legend_outside(ax)
    return _svg(fig)
