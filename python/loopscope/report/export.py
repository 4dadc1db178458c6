"""The report's summary tables outside the page: CSV for spreadsheets,
Markdown for pull requests (``loopscope report --csv DIR``, ``--markdown``).

The rows are the phase comparisons (``tables/comparisons.parquet``): per
probe, measure and phase each metric's value with its 95 % interval, and
its ratio to the baseline phase with its interval and significance. The
CSV has one row per probe × measure × phase, a column per metric (value,
low, high, ratio, ratio low, ratio high, significant), in nanoseconds
(``missed``: a count of deadlines, ``missed_of`` how many there were); the
Markdown has one table per probe and measure, values in µs or ms.
"""

from __future__ import annotations

import math
from pathlib import Path
from typing import Any

import polars as pl

from loopscope.report.sections import heading, min_effect_of, ns, ratio


def summary(comp: pl.DataFrame) -> pl.DataFrame:
    """One row per probe, measure and phase; the metrics side by side."""
    if comp.is_empty():
        return pl.DataFrame()
    keys = ["probe", "kind", "measure", "phase", "loads", "baseline_phase"]
    wide = None
    for m in comp["metric"].unique(maintain_order=True).to_list():
        u = "" if m == "missed" else "_ns"
        part = comp.filter(pl.col("metric") == m).select(
            *keys,
            "n",
            pl.col("value_ns").alias(f"{m}{u}"),
            pl.col("value_lo_ns").alias(f"{m}_lo{u}"),
            pl.col("value_hi_ns").alias(f"{m}_hi{u}"),
            pl.col("ratio").alias(f"{m}_ratio"),
            pl.col("ratio_lo").alias(f"{m}_ratio_lo"),
            pl.col("ratio_hi").alias(f"{m}_ratio_hi"),
            pl.col("significant").alias(f"{m}_significant"),
        )
        if m == "missed":
            part = part.drop(f"{m}_lo", f"{m}_hi").with_columns(pl.col("n").alias("missed_of"))
        wide = part if wide is None else wide.join(part.drop("n"), on=keys, how="full", coalesce=True)
    return wide if wide is not None else pl.DataFrame()


def write_csv(comp: pl.DataFrame, out: Path) -> list[Path]:
    out.mkdir(parents=True, exist_ok=True)
    paths = [out / "summary.csv", out / "comparisons.csv"]
    summary(comp).write_csv(paths[0])
    comp.write_csv(paths[1])
    return paths


def markdown(comp: pl.DataFrame, title: str, labels: dict[str, str]) -> str:
    """Tables for a pull request: per probe and measure, each phase's metrics with the ratio to the baseline."""
    out = [
        f"### {title}",
        "",
        "Each phase's value, and in brackets its ratio to the baseline phase (✱: the ratio's 95 % interval lies outside 1 ± "
        + min_effect_of(comp)
        + "; tables/comparisons.parquet has every interval).",
    ]
    for (probe, measure), g in comp.group_by(["probe", "measure"], maintain_order=True):
        metrics = g["metric"].unique(maintain_order=True).to_list()
        out += [
            "",
            f"**{probe}: {labels.get(str(measure), str(measure))}**",
            "",
            "| phase | " + " | ".join(heading(m) for m in metrics) + " |",
            "|---|" + "---:|" * len(metrics),
        ]
        for ph in g["phase"].unique(maintain_order=True).to_list():
            cells = []
            for m in metrics:
                r = g.filter((pl.col("phase") == ph) & (pl.col("metric") == m))
                if r.is_empty():
                    cells.append("")
                    continue
                x: dict[str, Any] = r.row(0, named=True)
                v = f"{int(x['value_ns']):,} of {int(x['n']):,}" if m == "missed" else ns(x["value_ns"])
                if x["phase"] != x["baseline_phase"] and x["ratio"] is not None and math.isfinite(x["ratio"]):
                    mark = " ✱" if x["significant"] else ""
                    v += f" ({ratio(x['ratio'])}{mark})"
                cells.append(v)
            out.append(f"| {ph} | " + " | ".join(cells) + " |")
    return "\n".join(out) + "\n"
