"""What the network probes print with ``--json`` (``send``, ``recv``, ``rr``,
``echo``), as declared types."""

from __future__ import annotations

from typing_extensions import NotRequired, TypedDict

from loopscope.nativetypes import RecvFlow
from loopscope.rundir import HistQuantiles
from loopscope.probes.common import TracedRunJson


class Spread(TypedDict, total=False):
    """A summary of ns values (only ``n`` when there was none), with the CIs of p50 and p99."""

    n: int
    min: int
    p50: int
    p99: int
    p999: int
    max: int
    mean: float
    ci95: dict[str, list[float | None]]


class SendJson(TracedRunJson):
    """What ``loopscope probe send --json`` prints."""

    sent: int
    unsent: int
    send_errors: int
    first_error: str | None
    requested_bps: float
    requested_pps: float
    sent_bps: float
    kept_up: bool
    shortfall: str | None
    departure_err_ns: Spread
    batches: int
    largest_batch: int
    tx_timestamps: dict[str, int]
    dest: str
    size: int
    pattern: str
    workers: int
    scheduled_ns: int


class Throughput(TypedDict):
    bps: float | None
    per_second_bps: list[float]
    cv_per_second: float | None


class RecvJson(TracedRunJson):
    """What ``loopscope probe recv --json`` prints: counts, flows, throughput and the delays' histograms."""

    packets: int
    bytes: int
    lost: int
    duplicates: int
    reordered: int
    malformed: int
    truncated: int
    socket_buffer_drops: int
    kernel_timestamps: int
    hardware_timestamps: int
    flows: list[RecvFlow]
    throughput: Throughput
    interarrival_ns: HistQuantiles
    delay_ns: dict[str, HistQuantiles]
    bound: str
    receiving_ns: int


class RrJson(TracedRunJson):
    """What ``loopscope probe rr --json`` prints: the round trip and, on one clock, both legs."""

    sent: int
    answered: int
    lost: int
    duplicates: int
    malformed: int
    send_errors: int
    rtt_ns: Spread
    client_end_host_ns: Spread
    server_end_host_ns: Spread
    server_turnaround_ns: Spread
    same_clock: bool
    forward_ns: Spread | None
    return_ns: Spread | None
    requested_pps: float
    dest: str
    transport: str
    note: NotRequired[str]


class EchoJson(TypedDict):
    """What the echo server says when it stops."""

    requests: int
    malformed: int
    send_errors: int
    elapsed_ns: int
    tids: list[int]
    interrupted: bool


class BulkJson(TypedDict):
    """What ``loopscope probe bulk --json`` prints: bytes sent, for how long, at what rate."""

    bytes: int
    elapsed_ns: int
    bps: float
    protocol: str
    #: UDP at a requested rate: whether the sender kept up with it (None: no rate asked, or TCP)
    kept_up: NotRequired[bool | None]


class RecvTcpJson(TypedDict):
    """What ``loopscope probe recv --tcp --json`` prints: bytes received over how many connections."""

    bytes: int
    connections: int
    bind: str
