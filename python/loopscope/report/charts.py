"""Charts for the report, as inline SVG (matplotlib, no JavaScript).

Scatter plots of many points are rasterised inside the SVG (an embedded
image), so a report of a long run stays a few hundred kilobytes and opens
fast; axes, labels and lines stay vector.
"""

from __future__ import annotations

import io
import re
from typing import Any

import matplotlib

matplotlib.use("Agg")
import matplotlib.pyplot as plt  # noqa: E402
import numpy as np  # noqa: E402
import polars as pl  # noqa: E402

PALETTE = ["#1f5fa8", "#d9480f", "#2b8a3e", "#862e9c", "#e67700", "#0b7285", "#c2255c", "#5c940d", "#495057", "#364fc7"]

plt.rcParams.update(
    {
        "font.size": 9,
        "axes.spines.top": False,
        "axes.spines.right": False,
        "axes.grid": True,
        "grid.alpha": 0.25,
        "svg.fonttype": "none",
        "figure.dpi": 100,
    }
)


def _svg(fig: plt.Figure) -> str:
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
    ax.set_xlabel(f"{xlabel} ({unit})")
    ax.set_ylabel("fraction of samples above")
    ax.set_title(title, loc="left")
    for q, lbl in ((0.5, "p50"), (0.01, "p99"), (0.001, "p99.9")):
        ax.axhline(q, color="#888", lw=0.6, ls=":")
        ax.text(1.0, q, f" {lbl}", transform=ax.get_yaxis_transform(), va="center", fontsize=7, color="#666")
    ax.legend(fontsize=7, frameon=False, ncol=2)
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
        ax.set_ylabel(ph, rotation=0, ha="right", va="center", fontsize=8)
    axes[-1][0].set_xlabel("seconds since the probe started (all repetitions overlaid)")
    axes[0][0].set_title(f"{title} ({ylabel}, {unit})", loc="left")
    return _svg(fig)


def syscall_bars(comp: pl.DataFrame, phases: list[str], title: str, xlabel: str = "ns per call (95% CI)", labels: dict[str, str] | None = None) -> str:
    """One figure per measure and phase with its 95 % CI (the syscall
    probe's mean per call; a pipeline's p50 or p99 per component)."""
    calls = comp["measure"].unique(maintain_order=True).to_list()
    fig, ax = plt.subplots(figsize=(6.4, 0.28 * len(calls) * max(1, len(phases)) / 2 + 1.2))
    h = 0.8 / max(1, len(phases))
    for i, ph in enumerate(phases):
        c = comp.filter(pl.col("phase") == ph)
        y, x, lo, hi = [], [], [], []
        for k, call in enumerate(calls):
            r = c.filter(pl.col("measure") == call)
            if r.is_empty():
                continue
            y.append(k + i * h)
            x.append(r["value_ns"][0])
            # A percentile-bootstrap interval of a skewed sample may sit beside
            # its point estimate; the bar then shows the interval's near side at 0.
            lo.append(max(0.0, r["value_ns"][0] - r["value_lo_ns"][0]))
            hi.append(max(0.0, r["value_hi_ns"][0] - r["value_ns"][0]))
        ax.barh(y, x, height=h, color=PALETTE[i % len(PALETTE)], label=ph, xerr=[lo, hi], error_kw={"lw": 0.8, "capsize": 1.5})
    ax.set_yticks([k + 0.4 - h / 2 for k in range(len(calls))], [(labels or {}).get(c, c) for c in calls])
    ax.invert_yaxis()
    ax.set_xscale("log")
    ax.set_xlabel(xlabel)
    ax.set_title(title, loc="left")
    ax.legend(fontsize=7, frameon=False)
    return _svg(fig)


def load_bars(loads: pl.DataFrame) -> str:
    """CPU the loads used, in cores, per phase and repetition."""
    fig, ax = plt.subplots(figsize=(6.4, 0.3 * len(loads) + 1.0))
    labels = [f"{r['phase']} · rep {r['rep']} · {r['name']}" for r in loads.iter_rows(named=True)]
    ax.barh(range(len(loads)), loads["cpu_util"].to_list(), color=PALETTE[0])
    ax.set_yticks(range(len(loads)), labels, fontsize=7)
    ax.invert_yaxis()
    ax.set_xlabel("CPU used by the load (cores, from its cgroup)")
    return _svg(fig)


def clock_chart(series: pl.DataFrame) -> str:
    """Each host's clock against the reference over the run: the offset's
    change since the start (its drift, and any step) and the bound of the
    estimate, which is the error budget of every cross-host figure."""
    fig, (ax1, ax2) = plt.subplots(1, 2, figsize=(9.0, 2.8))
    t0 = float(series["t_global_ns"].min())
    for i, host in enumerate(series["host"].unique(maintain_order=True).to_list()):
        g = series.filter(pl.col("host") == host).sort("t_global_ns")
        t = (g["t_global_ns"].to_numpy() - t0) / 1e9
        th = g["offset_ns"].to_numpy()
        b = g["bound_ns"].to_numpy()
        c = PALETTE[i % len(PALETTE)]
        ax1.plot(t, (th - th[0]) / 1e3, color=c, lw=1.2, label=host)
        ax1.fill_between(t, (th - th[0] - b) / 1e3, (th - th[0] + b) / 1e3, color=c, alpha=0.15, lw=0)
        ax2.plot(t, b / 1e3, color=c, lw=1.2, label=host)
    ax1.set_title("offset vs reference, change since start (band: bound)")
    ax1.set_xlabel("s")
    ax1.set_ylabel("µs")
    ax2.set_title("bound of the estimate")
    ax2.set_xlabel("s")
    ax2.set_ylabel("µs")
    ax2.set_ylim(bottom=0)
    ax1.legend(fontsize=8, frameon=False)
    return _svg(fig)


def _legend_outside(ax: Any) -> None:
    """One legend entry per label, right of the axes."""
    handles, labels = ax.get_legend_handles_labels()
    seen: dict[str, object] = {}
    for h, l in zip(handles, labels):
        seen.setdefault(l, h)
    ax.legend(list(seen.values()), list(seen.keys()), fontsize=7, frameon=False, loc="upper left", bbox_to_anchor=(1.01, 1.0))


def cause_bars(groups: list[dict], title: str) -> str:
    """One stacked bar per phase: the outliers' time split by cause (shares)."""
    causes: list[str] = []
    for g in groups:
        for c in g["causes"]:
            if c["cause"] not in causes:
                causes.append(c["cause"])
    fig, ax = plt.subplots(figsize=(7.5, 0.45 * len(groups) + 1.3))
    for i, g in enumerate(groups):
        left = 0.0
        share = {c["cause"]: c["share"] or 0.0 for c in g["causes"]}
        for k, cause in enumerate(causes):
            w = share.get(cause, 0.0) * 100
            if w > 0:
                ax.barh(i, w, left=left, color=PALETTE[k % len(PALETTE)], label=cause if i == 0 or cause not in [c["cause"] for c in groups[0]["causes"]] else None)
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
    fig, ax = plt.subplots(figsize=(7.5, 0.4 * len(rows) + 1.3))
    for i, (_, parts) in enumerate(rows):
        left = 0.0
        for k, name in enumerate(order):
            w = (parts.get(name) or 0.0) * 100
            if w > 0:
                ax.barh(i, w, left=left, color=PALETTE[k % len(PALETTE)], label=name)
                left += w
    ax.set_yticks(range(len(rows)))
    ax.set_yticklabels([label for label, _ in rows], fontsize=8)
    ax.invert_yaxis()
    ax.set_xlim(0, 100)
    ax.set_xlabel(xlabel)
    ax.set_title(title)
    _legend_outside(ax)
    return _svg(fig)


def erlang_fit(samples: list[tuple[str, np.ndarray, object]], title: str) -> str:
    """Empirical densities (histograms) with the fitted M/Er/1 Erlang curve on each."""
    n = len(samples)
    fig, axes = plt.subplots(1, n, figsize=(3.2 * n + 0.6, 2.6), squeeze=False)
    for ax, (label, x, f) in zip(axes[0], samples):
        x = np.asarray(x, dtype=np.float64)
        hi = float(np.percentile(x, 99.5))
        sc, unit = _scale(np.array([hi]))
        ax.hist(x[x <= hi] / sc, bins=60, density=True, color="#adb5bd", label="measured")
        xs = np.linspace(float(x.min()), hi, 300)
        ax.plot(xs / sc, f.pdf(xs) * sc, color=PALETTE[1], lw=1.4, label=f"Erlang k={f.stages}")  # type: ignore[attr-defined]
        ax.set_title(f"{label}\nKS D = {f.ks_d:.3f}", fontsize=8)  # type: ignore[attr-defined]
        ax.set_xlabel(unit)
        ax.set_yticks([])
        ax.legend(fontsize=7, frameon=False)
    fig.suptitle(title, fontsize=9)
    return _svg(fig)


def sweep_fits(fits: list, title: str, xlabel: str) -> str:
    """Mean, SD and p99 against the swept level, with the linear and quadratic fits."""
    fig, axes = plt.subplots(1, len(fits), figsize=(3.1 * len(fits) + 0.5, 2.6), squeeze=False)
    for ax, f in zip(axes[0], fits):
        x, y = np.array(f.x), np.array(f.y)
        sc, unit = _scale(y)
        xs = np.linspace(x.min(), x.max(), 100)
        ax.plot(x, y / sc, "o", color=PALETTE[0], ms=4)
        ax.plot(xs, np.polyval(f.linear, xs) / sc, color=PALETTE[2], lw=1.2, label=f"linear R² {f.r2_linear:.2f}")
        if f.quadratic is not None:
            ax.plot(xs, np.polyval(f.quadratic, xs) / sc, color=PALETTE[1], lw=1.2, ls="--", label=f"quadratic R² {f.r2_quadratic:.2f}")
        ax.set_title(f"{f.stat} ({f.best} fits)", fontsize=8)
        ax.set_xlabel(xlabel)
        ax.set_ylabel(unit)
        ax.legend(fontsize=7, frameon=False)
    fig.suptitle(title, fontsize=9)
    return _svg(fig)
