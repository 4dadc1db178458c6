"""What explain.json holds, as types its readers are checked against.

explain writes one document per run (``analysis.explain``); advise, the
report, ``loopscope explain``, compare and the benches read it. Its
parts are TypedDicts rather than models: the document stays the JSON it
always was (a reader indexes it by key), and the type checker holds every
reader to the keys the writer sets. ``read`` validates a file against the
same types, so a stale or hand-edited explain.json is named, not half
read.

A capture either opened (``CaptureSummary``: its counts, what it lost and
where, its size and its reader's cost) or did not (``CaptureFailed``: the
record's own fields and the error); ``Group`` is one probe × phase with its
causes and the shares of the lab, the loads and the system.
"""

from __future__ import annotations

from pathlib import Path

from typing_extensions import NotRequired, TypedDict

from pydantic import TypeAdapter, ValidationError

from loopscope.analysis.recorded import Unseen
from loopscope.errors import InputError
from loopscope.rundir import ReadDuring


class LostStretch(TypedDict):
    cpu: int
    start_ns: int
    end_ns: int
    events: int


class CaptureSummary(TypedDict):
    host: str
    covers: list[str]
    format: str
    events: int
    lost_events: int
    lost_counted: bool
    by_event: dict[str, int]
    t_first_ns: int | None
    t_last_ns: int | None
    seconds: float | None
    bytes_on_disk: int
    bytes_per_s: float | None
    events_per_s: float | None
    reader_cpu_s: float | None
    reader_cpu_share: float | None
    #: of reader_cpu_s, its start and set-up (before recording began: the ring buffers' allocation is most of it)
    reader_setup_cpu_s: NotRequired[float | None]
    perf_cpu_s: float | None
    perf_cpu_share: float | None
    reads_between_windows: int | None
    reads_during_windows: int | None
    reader_ran_during: list[ReadDuring]
    buffer_mb_per_cpu: float | None
    missing_events: list[str]
    not_recorded: list[Unseen]
    lost_placed: bool
    lost_unplaced: list[str]
    problems: list[str]
    lost_windows: int
    lost_where: list[LostStretch]


class CaptureFailed(TypedDict, total=False):
    """A capture explain could not open: the run record's fields for it
    (whatever the capture set) and why."""

    host: str
    covers: list[str]
    error: str


class Cause(TypedDict):
    cause: str
    ns: int
    share: float | None
    role: NotRequired[str | None]


class Parts(TypedDict):
    """The outliers' time before and after the thread's wake-up, each with its causes."""

    before_wakeup_share: float
    headline: str
    before: list[Cause]
    after: list[Cause]


class Slowed(TypedDict):
    """The reference of ``slowed: no kernel event`` in a group, and its candidates."""

    reference_phase: str
    reference_ns: int
    candidates: list[str]


class Group(TypedDict):
    probe: str
    phase: str
    host_kernel: str
    records: int
    threshold_ns: float
    outliers: int
    outlier_ns: int
    above_threshold: int
    complete: bool
    incomplete_outliers: int
    incomplete_why: list[str]
    lab_share: float
    lab: dict[str, float]
    load_share: float
    system_share: float
    causes: list[Cause]
    all_causes: NotRequired[list[Cause]]
    #: the outliers split as rtla splits a timerlat sample: the part before the thread's wake-up (its
    #: timer's expiry to the wake-up: the interrupt late, the CPU or vCPU not running) and after it (to
    #: user space); shares of the outliers whose wake-up was recorded; which part holds most of the time
    parts: NotRequired[Parts]
    #: when spans ran slower than the same work in the phase compared with: that phase, its median
    #: length of the span, and what could have slowed it that no kernel event shows
    slowed: NotRequired[Slowed]
    #: the CPUs the outliers ran on (what a remedy takes as the probe's when it does not pin it)
    cpus: NotRequired[list[int]]


class ExplainDoc(TypedDict):
    captures: list[CaptureSummary | CaptureFailed]
    groups: list[Group]
    threshold: str
    max_outliers: int
    seconds: NotRequired[float]
    not_explained: NotRequired[list[str]]


class Outlier(TypedDict):
    """One outlier with its causes, for the report (``SectionInputs.worst``)."""

    id: int
    rep: int
    t_ns: int
    latency_ns: int
    cpu: int | None
    span: bool
    migrations: int
    page_faults: int
    complete: bool
    causes: list[tuple[str, int]]


class Found(TypedDict):
    """What explain found in an anomaly's windows (``explain.causes_in``)."""

    cause: str | None
    share: float
    windows_with: int
    windows: int
    outliers: int


def opened(c: CaptureSummary | CaptureFailed) -> CaptureSummary | None:
    """The capture's summary, or None for one explain could not open."""
    return None if "error" in c else c  # type: ignore[return-value]


_DOC = TypeAdapter(ExplainDoc)


class ExplainFileError(InputError):
    """An explain.json that is not what explain writes (exit code 2)."""


def read(path: Path) -> ExplainDoc:
    """An explain.json checked against the document's types."""
    try:
        return _DOC.validate_json(path.read_bytes())
    except ValidationError as e:
        err = e.errors()[0]
        where = ".".join(str(p) for p in err["loc"])
        raise ExplainFileError(f"{path}: {where}: {err['msg']} (`loopscope explain {path.parent}` writes it again)") from None
