"""The report's second load: what analysis derived from the run, read once.

``report.build`` runs load → analyse → render. The first load reads the run
into tables (``tables.load_run``); analysis compares the phases and writes
the tables. The derived documents come next, each computed by its own pass
when missing or older than the run (the global timeline, explain's outliers
and their causes), then read here with the clock series, the attribution
rows, the programs' images and the listing of the run's files into one
``Derived``. Rendering takes that value and reads no file.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from pathlib import Path

import polars as pl

from loopscope import progress, timeline
from loopscope.analysis import explain
from loopscope.analysis.explained import ExplainDoc
from loopscope.analysis.inputs import SectionInputs
from loopscope.analysis.registry import Registry
from loopscope.errors import InputError
from loopscope.report.view import FilesInfo
from loopscope.rundir import RunRecord
from loopscope.timeline import TimelineDoc


@dataclass(frozen=True)
class Derived:
    """Everything the page shows beyond the tables and the comparisons."""

    #: the global timeline (a run with clock sync), None otherwise or when it failed (a note says why)
    timeline: TimelineDoc | None = None
    #: explain's document (a run with a kernel capture)
    explain: ExplainDoc | None = None
    #: each host's clock offset series (``tables/clock.parquet``)
    clock: pl.DataFrame | None = None
    #: attribution rows and images, for the probes' sections and the Why section
    inputs: SectionInputs = field(default_factory=SectionInputs)
    #: what the run directory holds, for the Files section
    files: FilesInfo = field(default_factory=lambda: FilesInfo(tables=[], hosts=False))


def derive(run_dir: Path, run: RunRecord, kinds: Registry, notes: list[str]) -> Derived:
    """The derived documents of a run whose tables are written: each built
    when missing or stale, then read with the rest; a failure is a note."""
    tl = None
    if run.clocksync:
        progress.step("report: the global timeline")
        tl = _timeline(run_dir, notes)
    ex = _explain(run_dir, run, notes, kinds)
    path = run_dir / "tables" / "clock.parquet"
    clock = pl.read_parquet(path) if path.exists() else None
    files: FilesInfo = {
        "tables": sorted(p.name for p in (run_dir / "tables").glob("*.parquet")),
        "hosts": (run_dir / "hosts").is_dir(),
        "kernel": any(run_dir.glob("hosts/*/kernel")),
        "netem": (run_dir / "netem").is_dir(),
    }
    return Derived(tl, ex, clock, SectionInputs.read(run_dir, run, kinds), files)


def _timeline(run_dir: Path, notes: list[str]) -> TimelineDoc | None:
    """The global timeline, built when missing or older than the run."""
    try:
        return timeline.cached(run_dir)
    except (OSError, ValueError, InputError, timeline.TimelineError) as e:
        notes.append(f"the global timeline could not be built: {e}")
        return None


def _explain(run_dir: Path, run: RunRecord, notes: list[str], kinds: Registry) -> ExplainDoc | None:
    """The outliers' causes, computed when missing or older than the run."""
    if not any(c.data for c in run.captures):
        return None
    try:
        return explain.cached(run_dir, kinds)
    except (OSError, ValueError, InputError) as e:
        notes.append(f"the outliers could not be explained: {e}")
        return None
