"""What every probe front end shares: its trace session and its JSON envelope."""

from __future__ import annotations

import json
import os
from contextlib import contextmanager
from dataclasses import dataclass
from typing import Iterator

from typing_extensions import TypedDict

from loopscope import _native
from loopscope.trace import api as trace_api


@dataclass
class TraceOutcome:
    path: str | None = None
    records: int | None = None
    lost: int | None = None


# A lab probe's trace writer wakes this seldom when its threads log little
# (a few kB a second against rings of 8 MiB): every wake-up of it is the lab
# inside some probe's window (it was up to 17 % of a pipeline stage's outlier
# time at the default 10 ms, and up to 2.1 % at 200 ms). Nothing reads a
# probe's trace before it closes; a writer that finds more than a block
# waiting goes back to 1 ms cycles, so a busy probe's rings do not fill.
# It also runs at SCHED_IDLE: a thread woken on its CPU takes the CPU from it
# at once (each flush is ~0.1 ms of writing, and under a flood it still was
# up to 1.1 % of a pipeline stage's outlier time at 1 s).
LAB_FLUSH_MS = 1000
# A monitor reads a probe's trace while it runs and needs it sooner, and its
# probes' writers run off the measured CPUs beside loads that would starve an
# idle one: it sets these for its probes (``LOOPSCOPE_FLUSH_MS``,
# ``LOOPSCOPE_WRITER_IDLE=0``).


def _writer() -> tuple[int, bool]:
    """(flush_ms, writer at SCHED_IDLE) for a probe's trace: the lab's, unless the environment says."""
    try:
        ms = int(os.environ.get("LOOPSCOPE_FLUSH_MS") or LAB_FLUSH_MS)
    except ValueError:
        ms = LAB_FLUSH_MS
    return max(1, min(ms, 10_000)), os.environ.get("LOOPSCOPE_WRITER_IDLE", "1") != "0"


@contextmanager
def traced(path: str | os.PathLike[str] | None, groups: list[str], away_from: list[int] | None = None) -> Iterator[TraceOutcome]:
    """Open a trace logging ``groups`` (plus ``loopscope``) around a probe run;
    afterwards the outcome holds the records written and lost.

    ``away_from``: the CPUs the probe measures on. The trace writer keeps
    off them for the run, so it never wakes inside a window there: it is
    started (and inherits its affinity) while the calling thread is off
    them, and the calling thread goes back to every CPU at once. The calling
    thread itself must not stay off them: on a machine of two CPUs with a
    hog on the other one, everything it does before and after the window
    (the set-up, the results) ran at the hog's leftovers, about 1 % of a
    CPU, and a 0.5 s probe took 4 s. It sleeps through the window (the
    measuring threads pin themselves, and the native probes wait in
    ``ppoll`` without a timer). When the measured CPUs are every CPU the
    probe may use, nothing changes."""
    out = TraceOutcome(path=os.fspath(path) if path is not None else None)
    before = os.sched_getaffinity(0)
    rest = before - set(away_from or [])
    moved = bool(away_from) and bool(rest) and rest != before
    flush_ms, idle = _writer()
    session = None
    if path is not None:
        if moved:
            os.sched_setaffinity(0, rest)
        try:
            session = trace_api.open(path, groups=[*groups, "loopscope"], flush_ms=flush_ms, writer_idle=idle)
        finally:
            if moved:
                os.sched_setaffinity(0, before)
    try:
        yield out
    finally:
        if session is not None:
            session.close()
    if path is not None:
        # Count what reached the file (no table is built: polars stays unloaded).
        _, meta = _native.read_trace(os.fspath(path), False, True)
        stats = json.loads(meta)["stats"]
        out.records, out.lost = stats["records"], stats["lost_records"]


class TraceInfo(TypedDict):
    """Where a helper's trace went and how many records it kept and lost."""

    path: str | None
    records: int | None
    lost: int | None


class Envelope(TypedDict):
    """The version stamp every probe's JSON carries."""

    probe: str
    loopscope: str
    json_format: int


class TracedRunJson(TypedDict):
    """What every traced probe's JSON ends with: how long it ran, whether
    it was stopped early, its trace with the records kept and lost, and its
    version stamp (the probes' own JSON types add their measures)."""

    elapsed_ns: int
    interrupted: bool
    trace: str | None
    trace_records: int | None
    trace_lost_records: int | None
    version: Envelope


def envelope(kind: str) -> Envelope:
    """Version stamp every probe's JSON carries."""
    from loopscope import __version__

    return {"probe": kind, "loopscope": __version__, "json_format": 1}
