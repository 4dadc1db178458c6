"""The report's second load: what analysis derived from the run, read once.

``report.build`` runs load → analyse → render. The first load reads the run
into tables (``tables.load_run``); analysis compares the phases and writes
the tables. The derived documents (the global timeline, explain's outliers
and their causes) are each computed by its own pass when missing or older
than the run, then read here with the clock series, the attribution rows,
the programs' images and the listing of the run's files into one
``Derived``. Rendering takes that value and reads no file.

The derived documents need the run's own files and none of the tables, so
``Documents`` builds them on a thread of their own while the tables are loaded
and compared, and ``derive`` waits for them: a fresh report keeps both CPUs
busy (explain's attribution and the clock estimate run natively or in
polars, outside the interpreter lock, while the phases are compared). The
thread is a daemon: Ctrl-C ends the command without waiting for a long
explain (explain.json is written last and atomically, so a pass cut short
is done again by the next report).
"""

from __future__ import annotations

import threading
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


class Documents:
    """The timeline and explain's document of a run, built (or read, when
    fresh) on a thread started at once; ``result`` waits for them."""

    def __init__(self, run_dir: Path, run: RunRecord, kinds: Registry) -> None:
        self.timeline: TimelineDoc | None = None
        self.explain: ExplainDoc | None = None
        #: failures, said as notes of the report
        self.notes: list[str] = []
        self._error: BaseException | None = None
        self._thread = threading.Thread(target=self._build, args=(run_dir, run, kinds), name="ls-report-derive", daemon=True)
        self._thread.start()

    def _build(self, run_dir: Path, run: RunRecord, kinds: Registry) -> None:
        try:
            if run.clocksync:
                progress.step("report: the global timeline")
                self.timeline = _timeline(run_dir, self.notes)
            self.explain = _explain(run_dir, run, self.notes, kinds)
        except BaseException as e:  # raised again by ``result``, on the caller's thread
            self._error = e

    def result(self) -> tuple[TimelineDoc | None, ExplainDoc | None, list[str]]:
        self._thread.join()
        if self._error is not None:
            raise self._error
        return self.timeline, self.explain, self.notes


def derive(run_dir: Path, run: RunRecord, kinds: Registry, notes: list[str], docs: Documents | None = None) -> Derived:
    """The derived documents of a run whose tables are written (those
    ``docs`` was building, else built now): each built when missing or
    stale, then read with the rest; a failure is a note."""
    tl, ex, failed = (docs or Documents(run_dir, run, kinds)).result()
    notes += failed
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
