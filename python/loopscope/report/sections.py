"""The building blocks of a probe's report section, for the probe kinds.

A kind (``loopscope.kinds``) fills its section with these: the generic
``series_section`` (a distribution and a time series chart per measure and
a table of its metrics by phase, against the baseline with their CIs),
``cell`` for one comparison, ``detected`` for what the anomaly detectors
find in its series. ``probe_sections`` walks the comparisons and asks each
probe's kind for its section: the report is handed the kinds, it never
imports them.
"""

from __future__ import annotations

import math
from typing import Any

import polars as pl

from loopscope.report import charts
from loopscope.units import format_ns
from loopscope.analysis.registry import MetricCell, MetricsRow, MetricsTable, Registry, Section, Tables
from loopscope.analysis.detectors import detect
from loopscope.analysis.explain import causes_in
from loopscope.analysis.inputs import SectionInputs
from loopscope.stats import MIN_EFFECT


def ns(x: float | None) -> str:
    return "n/a" if x is None or not math.isfinite(x) else format_ns(x)


def ratio(x: float | None) -> str:
    if x is None or not math.isfinite(x):
        return "n/a"
    # Near 1 two decimals would hide a small but significant change.
    return f"{x:.3f}×" if abs(x - 1) < 0.01 else f"{x:.2f}×"


LABELS = {"p999": "p99.9"}


def heading(metric: str) -> str:
    """A metric's column heading (``p999`` reads p99.9)."""
    return LABELS.get(metric, metric)


def _interval(lo: float | None, hi: float | None, fmt: Any) -> str:
    ok = lo is not None and hi is not None and math.isfinite(lo) and math.isfinite(hi)
    return f"[{fmt(lo)}, {fmt(hi)}]" if ok else ""


def cell(r: dict[str, Any]) -> MetricCell:
    """One comparison row as a table cell: value with CI, ratio to the
    baseline with CI. A missed-deadline row's value is a count of its
    deadlines; a maximum has no interval; a quantile short of samples neither."""
    base = r["phase"] == r["baseline_phase"]
    if r.get("metric") == "missed":
        k, n = int(r["value_ns"]), int(r["n"] or 0)
        value, ci = f"{k:,}", f"of {n:,} ({k / n * 100:.2g} %)" if n else ""
    else:
        value, ci = ns(r["value_ns"]), _interval(r["value_lo_ns"], r["value_hi_ns"], ns)
    rv = r["ratio"]
    return {
        "value": value,
        "ci": ci,
        "ratio": "baseline" if base else ("–" if rv is None or (isinstance(rv, float) and math.isnan(rv)) else ratio(rv)),
        "ratio_ci": "" if base else _interval(r["ratio_lo"], r["ratio_hi"], ratio),
        "sig": (not base) and bool(r["significant"]),
        "up": (not base) and bool(r["significant"]) and r["ratio"] > 1,
        "p": "" if base or r["p_value"] is None else (f"{r['p_value']:.1e}" if r["p_value"] < 1e-3 else f"{r['p_value']:.3f}"),
    }


def series_section(sec: Section, c: pl.DataFrame, present: list[str], series: list[Any]) -> None:
    """Per measure: its distribution and its course by phase, and its metrics
    by phase against the baseline."""
    for s in series:
        measure, label, frame = s.measure, s.label, s.frame
        # a program's interval may be missing from a phase (nothing happened there)
        here = [ph for ph in present if not c.filter((pl.col("measure") == measure) & (pl.col("phase") == ph)).is_empty()]
        if not here:
            continue
        if s.charts:
            sec.charts.append(charts.ecdf(frame, here, f"{sec.name}: {label}, distribution by phase", label))
            sec.charts.append(charts.over_time(frame, here, f"{sec.name}: {label} over time", label))
        sec.tables.append(metrics_table(c, measure, label, here))


def metrics_table(c: pl.DataFrame, measure: str, title: str, phases: list[str]) -> MetricsTable:
    """One measure's summary table: a row per phase, a column per metric
    (p50, p99, p99.9, max, mean, missed: each value with its interval and its
    ratio to the baseline with that one's)."""
    mc = c.filter(pl.col("measure") == measure)
    metrics = mc["metric"].unique(maintain_order=True).to_list()
    rows: list[MetricsRow] = []
    for ph in phases:
        here = mc.filter(pl.col("phase") == ph)
        if here.is_empty():
            continue
        cells = {r["metric"]: cell(r) for r in here.iter_rows(named=True)}
        first = here.row(0, named=True)
        rows.append({"phase": ph, "loads": first["loads"], "n": first["n"], "reps": first["reps"], "cells": cells})
    return {"title": title, "metrics": metrics, "heads": [heading(m) for m in metrics], "rows": rows}


def detected(series: list[Any], att: pl.DataFrame | None = None) -> list[str]:
    """What the anomaly detectors found in these series, per phase and
    repetition, each with what explain found in its windows (``att``: the
    probe's attribution rows, when the run was explained)."""

    out = []
    for s in series:
        df = s.frame
        if not len(df) or "t_ns" not in df.columns:
            continue
        prefix = getattr(s, "prefix", "")
        for (phase, rep), g in df.group_by(["phase", "rep"], maintain_order=True):
            here = att.filter((pl.col("phase") == phase) & (pl.col("rep") == rep)) if att is not None and len(att) else None
            for f in detect(g["t_ns"].to_numpy(), g["value"].to_numpy()):
                line = f"{prefix}{phase}, rep {rep}: {f.text}"
                c = causes_in(here, f.windows) if here is not None and f.kind != "drift" else None
                if c and c["cause"]:
                    where = f"in {c['windows_with']} of its {c['windows']} windows" if f.windows else "in its outliers"
                    line += f"; explain finds {c['cause']} {where} ({100 * c['share']:.0f} % of their outliers' time)"
                out.append(line)
    return out


def probe_sections(tables: Tables, comp: pl.DataFrame, phases: list[str], inputs: SectionInputs, kinds: Registry) -> list[Section]:
    """One section per compared probe, each filled by its kind."""
    out = []
    for probe in comp["probe"].unique(maintain_order=True).to_list():
        c = comp.filter(pl.col("probe") == probe)
        kind = kinds.get(str(c["kind"][0]))
        if kind is None:  # an app's intervals carry the kind "app", a known kind
            continue
        sec = Section(name=probe, kind=kind.name, describe=kind.describe)
        sec.detected = detected([s for s in kind.series(tables, probe) if s.scan], inputs.attribution_of(probe))
        present = [p for p in phases if p in set(c["phase"].to_list())]
        kind.section(sec, tables, c, present, inputs)
        out.append(sec)
    return out


def labels(kinds: Registry) -> dict[str, str]:
    """Every kind's names for its measures (``wake_delay`` → ``wake-up delay``)."""
    out: dict[str, str] = {}
    for k in kinds:
        out.update(getattr(k, "labels", {}) or {})
    return out


def min_effect_of(comp: pl.DataFrame) -> str:
    """The practical threshold a comparisons table was marked with, as pages state it (``2 %``)."""

    me = comp["min_effect"].drop_nulls() if "min_effect" in comp.columns else None
    return f"{(float(me[0]) if me is not None and len(me) else MIN_EFFECT) * 100:g} %"
