"""``loopscope compare``'s two ends: reading runs for the comparison, and
its page.

``load`` reads a run the way its report does (each trace once, its kinds'
measures of the steady state, their missed deadlines); the comparison itself
is ``analysis/runcompare.py``. ``render`` writes one self-contained HTML
page in the report's style: what differs between the runs, each probe's
distributions from every run on one chart (a CCDF per probe and phase), and
the table of ratios against the baseline run.
"""

from __future__ import annotations

import math
from pathlib import Path

from typing_extensions import TypedDict

from loopscope.report import templates
import polars as pl

from loopscope.analysis.runcompare import CriterionResult, Differences, Row, RunData
from loopscope.stats import MIN_EFFECT
from loopscope.report import charts
from loopscope.report.sections import ns, ratio
from loopscope.rundir import RunDir
from loopscope.analysis.registry import Registry
from loopscope.report.tables import load_run
from loopscope.trace import reader


def load(path: str | Path, kinds: Registry) -> RunData:
    from loopscope.report import steady_state

    rd = RunDir.open(path)
    with reader.shared():
        tables = load_run(rd.path, kinds)
    steady, _ = steady_state(tables, kinds)
    measures = [m for k in kinds for m in k.measures(steady)]
    missed: dict[tuple[str, str], list[tuple[int, int]]] = {}
    for probe, kind in {p.get("name"): p.get("kind") for p in tables.spec.get("probes") or []}.items():
        k = kinds.get(kind)
        if k is not None:
            missed.update({(probe, ph): v for ph, v in k.missed(tables, probe).items()})
    spec_yaml = rd.path / "spec.yaml"
    return RunData(
        label=rd.path.name,
        path=str(rd.path),
        reps=int(tables.spec.get("repetitions") or 1),
        measures=measures,
        missed=missed,
        provenance=tables.provenance,
        spec_text=spec_yaml.read_text() if spec_yaml.exists() else "",
    )


class CompareRow(TypedDict):
    """One row of a measure's table on the compare page."""

    run: str
    phase: str
    metric: str
    baseline: str
    value: str
    ratio: str
    ci: str
    sig: bool
    up: bool
    p: str


class CompareBlock(TypedDict):
    probe: str
    measure: str
    charts: list[str]
    rows: list[CompareRow]


def _cell(r: Row) -> CompareRow:
    is_rate = r.metric == "missed"

    def v(x: float | None) -> str:
        if x is None or not math.isfinite(x):
            return "n/a"
        return f"{x * 100:.3g} %" if is_rate else ns(x)

    return {
        "run": r.run,
        "phase": r.phase,
        "metric": r.metric,
        "baseline": v(r.baseline),
        "value": v(r.value),
        "ratio": ratio(r.ratio),
        "ci": f"[{ratio(r.ci95[0])}, {ratio(r.ci95[1])}]" if r.ci95 else ("no interval for a maximum" if r.metric == "max" else "too few samples"),
        "sig": r.significant,
        "up": r.significant and (r.ratio or 0) > 1,
        "p": "" if r.p_value is None else (f"{r.p_value:.1e}" if r.p_value < 1e-3 else f"{r.p_value:.3f}"),
    }


def render(
    runs: list[RunData], rows: list[Row], diff: Differences, criteria: list[CriterionResult], labels: dict[str, str], min_effect: float = MIN_EFFECT
) -> str:
    base = runs[0]
    probes: list[CompareBlock] = []
    seen: set[tuple[str, str]] = set()
    for m in base.measures:
        if (m.probe, m.name) in seen:
            continue
        seen.add((m.probe, m.name))
        mine = [r for r in rows if r.probe == m.probe and r.measure == m.name]
        if not mine:
            continue
        charts_ = []
        phases = list(dict.fromkeys(m.frame["phase"].to_list()))
        # one chart per phase of the probe's first measure: every run's distribution on it
        if not any(p["probe"] == m.probe for p in probes):
            for ph in phases[:4]:
                frames = []
                for run in runs:
                    other = next((x for x in run.measures if x.probe == m.probe and x.name == m.name), None)
                    if other is None:
                        continue
                    f = other.frame.filter(pl.col("phase") == ph).select(pl.lit(run.label).alias("phase"), "value")
                    frames.append(f.with_columns(pl.lit(0, dtype=pl.Int64).alias("t_ns"), pl.lit(1, dtype=pl.Int64).alias("rep")))
                if frames:
                    frame = pl.concat(frames, how="diagonal_relaxed")
                    label = labels.get(m.name, m.name)
                    charts_.append(charts.ecdf(frame, [r.label for r in runs], f"{m.probe}: {label} in {ph}, every run", label))
        table = [_cell(r) for r in mine]
        probes.append({"probe": m.probe, "measure": labels.get(m.name, m.name), "charts": charts_, "rows": table})
    for probe, ph in base.missed:
        mine = [r for r in rows if r.probe == probe and r.metric == "missed" and r.phase == ph]
        if mine:
            probes.append({"probe": probe, "measure": f"missed deadlines in {ph}", "charts": [], "rows": [_cell(r) for r in mine]})
    return templates.template("compare.html.j2").render(
        css=templates.css(),
        runs=runs,
        base=base,
        probes=probes,
        diff=diff,
        criteria=criteria,
        n_sig=sum(r.significant for r in rows),
        n_rows=len(rows),
        within=any(r.within_run for r in rows),
        min_effect=f"{min_effect * 100:g} %",
    )
