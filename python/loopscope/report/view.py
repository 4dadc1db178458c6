"""The rows the report page's template reads, one type per table.

``html.py`` turns a run's tables and documents into these; the template
(``report.html.j2``) only lays them out. Every value is already text for
the page (a duration with its unit, a count with separators) except where
the template decides on it (a flag, a count it compares). Keeping them as
types lets the checker hold ``html.py`` to what the template names.
"""

from __future__ import annotations

from typing_extensions import TypedDict


class HostRow(TypedDict):
    name: str
    kind: str
    address: str | None
    offset: str
    ssh: str


class ClockRow(TypedDict, total=False):
    """One host of the Clocks section (the reference's row leaves most empty)."""

    host: str
    mono: str
    real: str
    drift: str
    bound: str
    windows: str
    probes: str
    lost: str
    rtt: str
    pure: str
    placed: str
    discipline: str


class WhyRow(TypedDict):
    """One phase of a probe in the Why section: its outliers' top causes and shares."""

    phase: str
    outliers: int
    records: str
    threshold: str
    top: str
    note: str
    split: str
    lab: str


class OutlierRow(TypedDict):
    rep: int
    latency: str
    cpu: int | None
    complete: bool
    extra: str
    causes: str


class PhaseOutliers(TypedDict):
    phase: str
    worst: list[OutlierRow]


class WhyProbe(TypedDict):
    probe: str
    rows: list[WhyRow]
    chart: str
    outliers: list[PhaseOutliers]


class Why(TypedDict):
    """The Why section: each capture's line, each probe's causes, the lab's own share."""

    captures: list[str]
    probes: list[WhyProbe]
    threshold: str
    seconds: float | None
    roles: list[tuple[str, str]]
    self_warning: str | None


class ShareRow(TypedDict):
    label: str
    total: str
    cells: list[str]


class ItemRow(TypedDict):
    """One channel, path, item size and phase: put, network and delivery (p50 / p99)."""

    channel: str
    path: str
    size: str
    phase: str
    n: int
    put: str
    net: str
    bound: str
    raw: str
    deliver: str
    total: str


class CallSizeRow(TypedDict):
    label: str
    size: str
    phase: str
    calls: int
    mean: str
    cells: list[str]


class ChannelCountRow(TypedDict):
    phase: str
    channel: str
    side: str
    role: str
    moved: str
    lost: str


class Breakdown(TypedDict):
    """One program or app probe: where each thread's time went, and its channels."""

    probe: str
    categories: list[str]
    rows: list[ShareRow]
    per_item: list[ItemRow]
    per_size: list[CallSizeRow]
    size_categories: list[str]
    channels: list[ChannelCountRow]
    chart: str


class SweepBlock(TypedDict):
    title: str
    chart: str
    statements: list[str]


class LoadRow(TypedDict):
    phase: str
    rep: int
    name: str
    workers: int
    cpu: str
    cpu_s: str
    work: str
    source: str


#: one path the emulator carried, with its counts ("in" is a keyword)
EmulatorRow = TypedDict(
    "EmulatorRow",
    {
        "name": str,
        "carried": str,
        "configured": str,
        "in": str,
        "forwarded": str,
        "lost": int,
        "duplicated": int,
        "reordered": int,
        "queue_drops": int,
        "pending": int,
        "applied": str,
        "late": str,
        "queueing": str,
    },
)


class FilesInfo(TypedDict, total=False):
    """What the run directory holds, for the Files section."""

    tables: list[str]
    hosts: bool
    kernel: bool
    netem: bool
