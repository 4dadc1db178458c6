"""Reports: ``RUN/report.html``, ``RUN/tables/*.parquet`` and a terminal summary.

``build(run_dir)`` reads the run (its traces and probe results), writes the
measurement tables and the phase comparisons as Parquet, and renders one
self-contained HTML page: charts inline as SVG, styles inline, no script and
no network access, so it opens anywhere, offline, years later.
"""

from __future__ import annotations

import contextlib
import json
import math
import time
from dataclasses import dataclass, field
from pathlib import Path
from typing import TYPE_CHECKING

from typing_extensions import TypedDict

import polars as pl

from loopscope import progress
from loopscope import rundir
from loopscope.rundir import RunDir, RunRecord
from loopscope.trace.files import Files
from loopscope.units import format_ns
from loopscope.analysis.registry import Registry
from loopscope.report.derived import Documents, derive

if TYPE_CHECKING:
    from loopscope.report.tables import RunTables
from loopscope.analysis.breakdown import breakdown, by_size
from loopscope.analysis.chanstats import channel_stats
from loopscope.analysis.items import items
from loopscope.trace import reader
from loopscope.stats import MIN_EFFECT
from loopscope.analysis.phases import compare_phases


class ReportJson(TypedDict):
    """What ``loopscope report --json`` prints (and report.json holds): the comparisons, as the comparisons table's rows."""

    run_dir: str
    report: str
    status: str
    build_seconds: float
    traces_read: int
    comparisons: list[dict[str, object]]
    notes: list[str]


@dataclass
class Report:
    run_dir: Path
    html: Path
    comparisons: pl.DataFrame
    run: RunRecord
    seconds: float
    notes: list[str] = field(default_factory=list)
    #: trace files read to build it (each once)
    traces_read: int = 0
    #: the probe kinds it was built with (what each shows in the summary)
    kinds: Registry | None = None

    def to_json(self) -> ReportJson:
        return {
            "run_dir": str(self.run_dir),
            "report": str(self.html),
            "status": self.run.status,
            "build_seconds": round(self.seconds, 3),
            "traces_read": self.traces_read,
            "comparisons": self.comparisons.to_dicts(),
            "notes": self.notes,
        }

    def summary_lines(self) -> list[str]:
        """A few lines for the terminal: per measure, the p99 (or mean) of
        every phase against the baseline."""
        out = [f"{self.run.name}: {self.run.status}, {len(self.run.steps)} probe runs"]
        for lh in self.run.lost_hosts:
            out.append(f"  LOST HOST {lh.host} at {lh.at_utc} during {lh.during}: {lh.why}; {len(lh.steps)} of its steps not run or cut short")
        c = self.comparisons
        if c.is_empty():
            return out + ["  no measurements to compare"] + [f"  note: {n}" for n in self.notes][:28]
        for (probe, measure), g in c.group_by(["probe", "measure"], maintain_order=True):
            kind = self.kinds.get(str(g["kind"][0])) if self.kinds is not None else None
            shown = getattr(kind, "summary", None)
            if shown is not None and measure not in shown:
                continue  # the kind's other figures (a pipeline's hops) are in the report
            metric = "p99" if "p99" in g["metric"].to_list() else "mean"
            whole = g
            g = g.filter(pl.col("metric") == metric)
            parts = []
            for r in g.iter_rows(named=True):
                if r["phase"] == r["baseline_phase"]:
                    parts.append(f"{r['phase']} {format_ns(r['value_ns'])}")
                else:
                    mark = "*" if r["significant"] else ""
                    parts.append(f"{r['phase']} {_ratio(r['ratio'])}{mark} [{_ratio(r['ratio_lo'])}, {_ratio(r['ratio_hi'])}]")
            if len(parts) > 1 or measure in ("latency", "wake_delay", "burst") or len(out) < 12:
                out.append(f"  {probe} {measure} {metric}: " + " · ".join(parts))
                tail = []
                mx = whole.filter(pl.col("metric") == "max")
                if len(mx):
                    tail.append("max " + " · ".join(f"{r['phase']} {format_ns(r['value_ns'])}" for r in mx.iter_rows(named=True)))
                ms = whole.filter(pl.col("metric") == "missed")
                if len(ms):
                    tail.append("missed deadlines " + " · ".join(f"{r['phase']} {int(r['value_ns']):,}" for r in ms.iter_rows(named=True)))
                if tail:
                    out.append("    " + "; ".join(tail))
        from loopscope.report.sections import min_effect_of

        out.append(f"  (ratios to the first phase shown, the baseline, with 95% CI; * = significant: the interval outside 1 ± {min_effect_of(c)})")
        for n in self.notes:
            out.append(f"  note: {n}")
        return out[:30]


def _silent(tables: RunTables, comp: pl.DataFrame, kinds: Registry) -> list[str]:
    """A line for each probe of the run with nothing to compare: what its kind says it did instead."""
    compared = set(comp["probe"].unique().to_list()) if len(comp) else set()
    out = []
    for p in tables.spec.get("probes") or []:
        name, kind = str(p.get("name")), kinds.get(str(p.get("kind")))
        if name in compared or kind is None:
            continue
        results = [res for (_, _, probe), res in sorted(tables.results.items()) if probe == name]
        lost = [lh.host for lh in tables.run.lost_hosts if any(s.endswith(f"/{name}") for s in lh.steps)]
        why = f" (host {', '.join(lost)} lost: its steps did not run)" if lost else ""
        out.append(f"probe {name} ({kind.name}) {kind.silent(results)}{why}")
    return out


def _ratio(x: float) -> str:
    if x is None or not math.isfinite(x):
        return "n/a"
    return f"{x:.3f}x" if abs(x - 1) < 0.01 else f"{x:.2f}x"


def steady_state(tables: RunTables, kinds: Registry) -> tuple[RunTables, list[str]]:
    """The tables with a warm-up the detector finds at the start of a series
    left out (each kind says which series), and a note for each."""
    from loopscope.analysis.detectors import trim_warmup

    notes: list[str] = []
    steady = tables
    for kind in kinds:
        for name, col, by in kind.steady:
            df = getattr(tables, name)
            if len(df) and "t_ns" in df.columns and col in df.columns:
                df2, n2 = trim_warmup(df, col, by)
                if n2:
                    steady = steady.replace(**{name: df2})
                    notes += n2
    return steady, notes


def _channel_tables(run: RunRecord, files: Files, kinds: Registry) -> dict[str, pl.DataFrame]:
    """For programs that used channels: each thread's time split by layer,
    each item's way through, calls by item size, and the declared channels'
    counts (analysis; the page shows them, ``tables/`` keeps them)."""

    b = breakdown(run, files, kinds)
    if not len(b):
        return {}
    out = {"breakdown": b, "items": items(run, files, kinds), "breakdown_size": by_size(run, files, kinds)}
    c = channel_stats(run, files)
    if len(c):
        out["channels"] = c
    return out


def build(run_dir: Path, kinds: Registry, share_reads: bool = True, min_effect: float | None = None) -> Report:
    """Load the run, analyse it, write its tables, render its page.

    ``kinds`` is the probe-kind registry (``loopscope.kinds.KINDS``): each
    step's rows, measures and report section come from its kind. Each trace
    is read once (``reader.shared``) and shared by everything that needs it;
    rendering writes nothing. ``share_reads=False`` lets every part open the
    files itself (how reports were built before: ``loopscope bench report``
    compares the two). A change is marked significant when its interval
    lies outside 1 ± ``min_effect`` (``analysis.compare.MIN_EFFECT`` unless given)."""

    t0 = time.perf_counter()
    run_dir = RunDir.open(run_dir).path
    opened = reader.opened
    with reader.shared() if share_reads else contextlib.nullcontext(), rundir.read_once() if share_reads else contextlib.nullcontext():
        rep = _build(run_dir, kinds, Files(run_dir), t0, min_effect)
    rep.traces_read = reader.opened - opened
    (run_dir / "report.json").write_text(json.dumps(rep.to_json(), indent=1, default=str) + "\n")
    return rep


def analyse(run_dir: Path, kinds: Registry, min_effect: float | None = None) -> pl.DataFrame:
    """The run's tables and phase comparisons written (``RUN/tables``), and
    the comparisons: ``build`` without the derived documents and the page,
    for a tool that needs only the figures (the cause zoo's follow-ups)."""
    run_dir = RunDir.open(run_dir).path
    with reader.shared(), rundir.read_once():
        _, comp, _, _ = _analysed(run_dir, kinds, Files(run_dir), min_effect)
    return comp


def _build(run_dir: Path, kinds: Registry, traces: Files, t0: float, min_effect: float | None = None) -> Report:
    from loopscope.report.html import render

    # the timeline and explain need the run's own files, not its tables: built beside the analysis
    docs = Documents(run_dir, RunDir(run_dir).record(), kinds)
    tables, comp, notes, phase_order = _analysed(run_dir, kinds, traces, min_effect)
    derived = derive(run_dir, tables.run, kinds, notes, docs)
    # render: from values, no file read
    progress.step("report: rendering")
    html = run_dir / "report.html"
    html.write_text(render(tables, comp, phase_order, notes, kinds, derived))
    return Report(run_dir, html, comp, tables.run, time.perf_counter() - t0, notes, kinds=kinds)


def _analysed(run_dir: Path, kinds: Registry, traces: Files, min_effect: float | None) -> tuple[RunTables, pl.DataFrame, list[str], list[str]]:
    """Load the run, compare its phases, write its tables: the tables, the
    comparisons, the notes so far and the phases in order."""
    from loopscope.report.tables import load_run  # (scipy.special, through the tests it runs: only when a report is built)

    # load
    progress.step("report: reading the run's traces")
    tables = load_run(run_dir, kinds, traces)
    phase_order = [p["name"] for p in tables.spec.get("phases") or []]
    # analyse: the phase comparisons are of the steady state (a warm-up the
    # detector finds at the start of a series is left out of them, and said)
    progress.step("report: comparing phases")
    steady, trimmed_notes = steady_state(tables, kinds)
    order = {p.get("name"): i for i, p in enumerate(tables.spec.get("probes") or [])}
    measures = sorted((m for k in kinds for m in k.measures(steady)), key=lambda m: order.get(m.probe, len(order)))
    missed = {}
    for probe, kind in {p.get("name"): p.get("kind") for p in tables.spec.get("probes") or []}.items():
        k = kinds.get(kind)
        if k is not None and (per := k.missed(tables, probe)):
            missed[probe] = per
    against = {p["name"]: p["compare_with"] for p in tables.spec.get("phases") or [] if p.get("compare_with")}
    comp = compare_phases(measures, phase_order, missed, against, MIN_EFFECT if min_effect is None else min_effect)
    tables = tables.replace(**_channel_tables(tables.run, traces, kinds))
    notes = list(tables.run.notes) + trimmed_notes
    lost = tables.steps.filter(pl.col("lost_records") > 0) if len(tables.steps) else tables.steps
    for r in lost.iter_rows(named=True):
        notes.append(f"rep {r['rep']} {r['phase']} {r['probe']}: {r['lost_records']} trace records lost")
    for key, res in tables.results.items():
        for th in res.get("threads") or []:
            if th.get("sched") and "refused" in th["sched"]:
                notes.append(f"rep {key[0]} {key[1]} {key[2]}: {th['sched']}")
    notes += _silent(tables, comp, kinds)
    for st in tables.run.steps:
        if st.interrupted:
            secs = (st.end_mono_ns - st.spawn_mono_ns) / 1e9
            notes.append(
                f"rep {st.rep} {st.phase} {st.probe}: cut short by {st.interrupted} after {secs:.1f} s of its window; "
                "its figures are what it measured until then"
            )
    if tables.run.status != "completed":
        notes.insert(0, f"the run {tables.run.status}: {tables.run.error}")
    # write the tables (the timeline and explain read them)
    tables.write(run_dir / "tables", {"comparisons": comp})
    return tables, comp, notes, phase_order
