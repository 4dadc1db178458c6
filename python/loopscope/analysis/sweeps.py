"""A swept parameter against the latency it causes: which model fits.

Boie & Niehaus 2007 (Fig. 4.4.7) found the control loop's variance growing faster
than linearly with the link delay. When an experiment sweeps a parameter
(``sweep:`` load kinds × levels, each level a phase, the baseline at 0; or
phases that change a link's delay, ``phases[].links``),
``fit`` takes, per probe and load kind, the mean, standard deviation and p99
of the probe's main series at every level and fits a line and a parabola
by least squares. The quadratic term is kept when an F-test on it gives
p < 0.05 (needs four levels or more); the statement says which fits, with
both R².
"""

from __future__ import annotations

from dataclasses import dataclass
from collections.abc import Mapping
from typing import Any, Protocol

from typing_extensions import TypedDict

import numpy as np
import polars as pl
from loopscope import lazy

from loopscope.analysis.registry import Tables
from loopscope.units import format_ns


class SweepKinds(Protocol):
    """The kinds by name; each says what a sweep fits (``kinds.base.ProbeKind.sweep_values``)."""

    def get(self, name: str) -> Any: ...


def _values(kinds: SweepKinds, probe: Mapping[str, object], tables: Tables) -> list[tuple[str, pl.DataFrame]]:
    """What ``probe`` (the experiment file's entry) sweeps, through its kind."""
    kind = kinds.get(str(probe.get("kind")))
    return list(kind.sweep_values(tables, str(probe.get("name")))) if kind is not None else []


@dataclass
class Fit:
    stat: str
    x: list[float]
    y: list[float]
    linear: tuple[float, ...]
    quadratic: tuple[float, ...] | None
    r2_linear: float
    r2_quadratic: float | None
    p_quadratic: float | None

    @property
    def best(self) -> str:
        return "quadratic" if self.p_quadratic is not None and self.p_quadratic < 0.05 and (self.quadratic or (0,))[0] != 0 else "linear"


class SweepFit(TypedDict):
    """One probe's series against a swept level (a load's, or a link's delay): mean, SD and p99, each fitted."""

    probe: str
    kind: str
    unit: str
    fits: list[Fit]


def _r2(y: np.ndarray, yhat: np.ndarray) -> float:
    ss = float(((y - y.mean()) ** 2).sum())
    return 1 - float(((y - yhat) ** 2).sum()) / ss if ss > 0 else 1.0


def fit_xy(stat: str, x: np.ndarray, y: np.ndarray) -> Fit:
    lin = np.polyfit(x, y, 1)
    r2l = _r2(y, np.polyval(lin, x))
    quad, r2q, p = None, None, None
    if len(x) >= 3:
        quad = np.polyfit(x, y, 2)
        r2q = _r2(y, np.polyval(quad, x))
    if len(x) >= 4 and quad is not None:
        rss1 = float(((y - np.polyval(lin, x)) ** 2).sum())
        rss2 = float(((y - np.polyval(quad, x)) ** 2).sum())
        df2 = len(x) - 3
        if rss2 > 0 and df2 > 0:
            f = (rss1 - rss2) / (rss2 / df2)
            p = float(lazy.special().fdtrc(1, df2, f))  # the F distribution's survival function
        elif rss2 == 0 and rss1 > 0:
            p = 0.0
    return Fit(stat, x.tolist(), y.tolist(), tuple(lin.tolist()), tuple(quad.tolist()) if quad is not None else None, r2l, r2q, p)


def level_value(label: str) -> float | None:
    """A sweep phase's level from its name (``cpu-2`` → 2, ``cpu-50pct`` → 50)."""
    tail = label.rsplit("-", 1)[-1].removesuffix("pct")
    try:
        return float(tail)
    except ValueError:
        return None


def _points(v_by_phase: dict[str, np.ndarray], x_of: dict[str, float]) -> list[tuple[float, float, float, float]]:
    pts = []
    for phase, v in v_by_phase.items():
        if phase in x_of and len(v) >= 10:
            pts.append((x_of[phase], float(v.mean()), float(v.std(ddof=1)), float(np.percentile(v, 99))))
    return sorted(pts)


def link_sweep(tables: Tables, kinds: SweepKinds) -> list[SweepFit]:
    """When phases change a link's delay (``phases[].links``): every probe's
    main series, and every interval a program or app logged, against that
    delay (the first link whose delay differs between phases)."""
    pl_ = tables.run.phase_links
    if len(pl_) < 3:
        return []
    names = [c.name for c in next(iter(pl_.values()))]
    varying = [n for n in names if len({next((c.delay_ns for c in cs if c.name == n), None) for cs in pl_.values()}) > 1]
    if not varying:
        return []
    link = varying[0]
    # phases that hold loads are other experiments: only the unloaded ones sweep the delay
    loaded = {p["name"] for p in tables.spec.get("phases") or [] if p.get("loads")}
    x_of = {ph: next(c.delay_ns for c in cs if c.name == link) / 1e6 for ph, cs in pl_.items() if ph not in loaded}
    series: list[tuple[str, dict[str, np.ndarray]]] = []
    for probe in tables.spec.get("probes") or []:
        for name, d in _values(kinds, probe, tables):
            series.append((name, {str(ph): g["value"].drop_nulls().to_numpy().astype(np.float64) for (ph,), g in d.group_by(["phase"])}))
    out: list[SweepFit] = []
    for name, by_phase in series:
        pts = _points(by_phase, x_of)
        if len({p[0] for p in pts}) < 3:
            continue
        a = np.array(pts)
        fits = [fit_xy(s, a[:, 0], a[:, i]) for i, s in ((1, "mean"), (2, "standard deviation"), (3, "p99"))]
        out.append({"probe": name, "kind": f"link {link} delay", "unit": "ms", "fits": fits})
    return out


def fit(tables: Tables, kinds: SweepKinds) -> list[SweepFit]:
    """Per probe and swept load kind: mean, SD and p99 against the level, with
    both fits; and against a link delay the phases change."""
    sweep = tables.spec.get("sweep")
    if not sweep:
        return link_sweep(tables, kinds)
    out = link_sweep(tables, kinds)
    swept = sweep.get("kind") or []
    for probe in tables.spec.get("probes") or []:
        # the probe's main measure (the series named after it), not a program's intervals
        main = [d for name, d in _values(kinds, probe, tables) if name == probe.get("name")]
        if not main:
            continue
        df = main[0]
        for k in swept:
            pts = []
            for (phase,), g in df.group_by(["phase"], maintain_order=True):
                if phase == "baseline":
                    x = 0.0
                elif str(phase).startswith(f"{k}-"):
                    x = level_value(str(phase))  # type: ignore[assignment]
                else:
                    continue
                if x is None:
                    continue
                v = g["value"].drop_nulls().to_numpy().astype(np.float64)
                if len(v) < 10:
                    continue
                pts.append((x, float(v.mean()), float(v.std(ddof=1)), float(np.percentile(v, 99))))
            if len(pts) < 3:
                continue
            pts.sort()
            a = np.array(pts)
            fits = [fit_xy(s, a[:, 0], a[:, i]) for i, s in ((1, "mean"), (2, "standard deviation"), (3, "p99"))]
            out.append(
                {
                    "probe": str(probe.get("name")),
                    "kind": k,
                    "unit": "processes" if "pct" not in "".join(str(p) for p in df["phase"].unique().to_list()) else "%",
                    "fits": fits,
                }
            )
    return out


def statement(f: Fit, per: str = "level") -> str:

    lin = f"linear R² {f.r2_linear:.3f}"
    if f.r2_quadratic is None:
        return f"{f.stat}: {lin} (three levels or more are needed for a quadratic)"
    q = f"quadratic R² {f.r2_quadratic:.3f}"
    if f.p_quadratic is None:
        return f"{f.stat}: {lin}, {q} (four levels or more are needed to test the quadratic term)"
    slope = f.linear[0]
    if f.best == "quadratic":
        curv = "faster" if (f.quadratic or (0,))[0] > 0 else "slower"
        return f"{f.stat}: grows {curv} than linearly (quadratic term F-test p = {f.p_quadratic:.3g}; {lin}, {q})"
    return (
        f"{f.stat}: linear is enough, {format_ns(abs(slope))} {'more' if slope >= 0 else 'less'} per {per} (quadratic term p = {f.p_quadratic:.3g}; {lin}, {q})"
    )
