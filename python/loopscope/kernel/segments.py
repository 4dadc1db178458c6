"""The index of a capture (``segments.jsonl``): its lines' types, and the
loss windows a decoded batch reports, without the table libraries: the
importer writes an index through these alone, so ``loopscope import``
starts without loading polars (``kernel.store`` reads the index and the
segment files, and re-exports these)."""

from __future__ import annotations

from typing import TYPE_CHECKING

from typing_extensions import NotRequired, TypedDict

if TYPE_CHECKING:
    from loopscope._native import _Batch as Batch
    from loopscope._native import _Decoded as Decoded


class LostWindow(TypedDict):
    """Events the kernel lost on one CPU between two times (``events`` -1: count unknown)."""

    cpu: int
    start_ns: int
    end_ns: int
    events: int
    why: NotRequired[str]


class Segment(TypedDict, total=False):
    """One line of a capture's segments.jsonl: one read of the buffers, the
    file its events went to, what it lost and what it cost."""

    seg: int | None
    reason: str
    label: str
    read_start_mono_ns: int
    read_ns: int
    bytes_read: int
    decode_ns: int
    frame_ns: int
    write_ns: int
    events: int
    t_first_ns: int | None
    t_last_ns: int | None
    lost: list[LostWindow]
    file: str | None
    counts: dict[str, int]
    strings: list[str]
    event_names: list[str]
    groups: list[list[int]]
    bytes: int
    write_error: str
    readable: bool
    lost_unknown: bool
    #: (an import's) each thread the segment's switches name, [tid, its latest name's code into the strings]: a
    #: reader finds threads by name from these lines instead of reading every switch (absent: a run's capture, or
    #: an import written before they were kept)
    names: list[list[int]]


def switch_code(event_names: list[str]) -> int:
    """``sched_switch``'s code among a capture's event names, for the writer to keep the names its switches give
    (-1, no event's, while none is named: the batch has no switch, and its segment names no thread)."""
    return event_names.index("sched_switch") if "sched_switch" in event_names else -1


def lost_list(got: Decoded | Batch) -> list[LostWindow]:
    lo = got["lost"]
    return [
        {"cpu": int(c), "start_ns": int(a), "end_ns": int(b), "events": int(n), "why": w}
        for c, a, b, n, w in zip(lo["cpu"], lo["start_ns"], lo["end_ns"], lo["events"], lo["why"])
    ]
