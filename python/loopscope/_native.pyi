# Declarations of loopscope._native (crates/py/src/lib.rs).
# tests/test_native_stub.py checks that this file and the module agree.

import numpy as np
import numpy.typing as npt
from collections.abc import Iterable, Mapping
from typing import Any, NotRequired, TypedDict

# netem.json keeps the emulator's interfaces as the binding gives them: one declaration
from loopscope.rundir import PortCounts
from loopscope.nativetypes import RecvFlow as _RecvFlow, SyncProbeCounts as _SyncProbe, SyncServeCounts as _SyncServe

# The probes' results as the binding builds them (crates/py/src/probes.rs
# from crates/probes' result structs): private names, not in the module.

class _TimerThread(TypedDict):
    index: int
    tid: int
    cpu: int | None
    wakeups: int
    missed: int
    min_ns: int
    max_ns: int
    sum_ns: int
    sched: str
    sched_ok: bool
    affinity_ok: bool
    error: str | None
    latencies: npt.NDArray[np.int64]

class _TimerRun(TypedDict):
    threads: list[_TimerThread]
    mlock: str
    mlock_ok: bool
    dma_latency: str
    dma_latency_ok: bool
    overhead_ns: float
    interrupted: bool
    elapsed_ns: int

class _SchedRun(TypedDict):
    work_iters: int
    alone_ns: int
    alone_samples: npt.NDArray[np.int64]
    wake_delay_ns: npt.NDArray[np.int64]
    extra_ns: npt.NDArray[np.int64]
    busy_ops: list[int]
    elapsed_ns: int
    interrupted: bool

class _SyscallCall(TypedDict):
    name: str
    mean_ns: float
    ci_half_ns: float
    converged: bool
    error: str | None
    batch_ns: npt.NDArray[np.float64]

class _SyscallRun(TypedDict):
    calls: list[_SyscallCall]
    clock_read_ns: float
    interrupted: bool

class _Hist(TypedDict):
    """A histogram snapshot: occupied buckets (index, count), out-of-range counts, exact sum/min/max."""

    idx: npt.NDArray[np.uint32]
    count: npt.NDArray[np.uint64]
    under: int
    over: int
    sum: int
    min: int
    max: int

class _SendWorker(TypedDict):
    sent: int
    unsent: int
    errors: int
    first_error: str | None
    batches: int
    largest_batch: int
    tx_sched: int
    tx_sw: int
    dep_err_ns: npt.NDArray[np.int32]

class _SendRun(TypedDict):
    workers: list[_SendWorker]
    scheduled_ns: int
    elapsed_ns: int
    realtime_offset_ns: int
    interrupted: bool

class _PipeSource(TypedDict):
    sent: int
    send_errors: int
    late: _Hist
    hist_scale: str
    elapsed_ns: int
    interrupted: bool

class _PipeNode(TypedDict):
    received: int
    forwarded: int
    malformed: int
    full: int
    send_errors: int
    no_kernel_ts: int
    residence: _Hist
    hist_scale: str
    elapsed_ns: int
    interrupted: bool

class _PipeSink(TypedDict):
    received: int
    unique: int
    lost: int
    duplicates: int
    reordered: int
    malformed: int
    truncated: int
    no_kernel_ts: int
    first_seq: int
    max_seq: int
    hops_seen: list[int]
    end_to_end: _Hist
    hist_scale: str
    elapsed_ns: int
    interrupted: bool

FORMAT_VERSION: tuple[int, int]
MAX_PAYLOAD: int

class Entity:
    @property
    def id(self) -> int: ...
    @property
    def group(self) -> str: ...
    @property
    def name(self) -> str: ...
    @property
    def kind(self) -> str: ...
    @property
    def desc(self) -> str: ...
    @property
    def enabled(self) -> bool: ...
    @property
    def value(self) -> int: ...
    def event(self, tag: int = 0, value: int | None = None, payload: bytes | None = None) -> None: ...
    def __call__(self, tag: int = 0) -> None: ...
    def interval(self, start: int, tag: int = 0) -> None: ...
    def interval_ns(self, start_ns: int, dur_ns: int, tag: int = 0) -> None: ...
    def add(self, v: int) -> None: ...
    def log(self) -> None: ...
    def reset(self) -> None: ...

def register_entity(group: str, name: str, kind: str, desc: str = "", scale: str | None = None) -> Entity: ...
def open(path: str, config: str | None = None, groups: list[str] | None = None, ring_groups: list[str] | None = None, fsync: bool = False) -> None: ...
def close() -> str: ...
def flush() -> None: ...
def is_open() -> bool: ...
def prepare_thread() -> bool: ...
def enable_group(stream: str, group: str, on: bool) -> None: ...
def trigger(stream: str, tag: int = 0) -> None: ...
def now() -> int: ...
def mono_ns() -> int: ...
def clock_info() -> tuple[str, str]: ...
def read_trace(path: str, sort: bool = True, count_only: bool = False) -> tuple[dict[str, npt.NDArray[np.generic]], str]: ...
def hist_bounds(scale: str, idx: npt.NDArray[np.uint32]) -> tuple[npt.NDArray[np.int64], npt.NDArray[np.int64]]: ...
def timer_probe(params: Any, duration_ns: int, max_samples: int = 16000000) -> _TimerRun:
    """``params``: a ``TimerParams`` model (probes/params.py), read by attribute."""

def timer_params(p: Any) -> dict[str, object]:
    """The fields the binding read of a ``TimerParams`` model."""

def sched_probe(params: Any, duration_ns: int, work_iters: int | None = None, alone_ns: int | None = None, calibrate_only: bool = False) -> _SchedRun:
    """``params``: a ``SchedParams`` model, read by attribute."""

def sched_params(p: Any) -> dict[str, object]:
    """The fields the binding read of a ``SchedParams`` model."""

def syscall_probe(params: Any, dir: str, min_batches: int = 10) -> _SyscallRun:
    """``params``: a ``SyscallParams`` model, read by attribute; ``dir`` unless it names one."""

def syscall_params(p: Any) -> dict[str, object]:
    """The fields the binding read of a ``SyscallParams`` model."""

def syscall_names() -> list[str]: ...
def syscall_parse(spec: str) -> tuple[str, int | None]: ...
def syscall_sized() -> list[tuple[str, int]]: ...
def load_worker(
    kind: str,
    duty: float | None = None,
    seconds: float | None = None,
    dir: str | None = None,
    fsync: bool = False,
    count: int = 10000000,
    rate_bps: float | None = None,
    size: int = 1400,
    protocol: str = "udp",
    dest: str | None = None,
) -> dict[str, object]: ...
def net_schedule(
    pattern_name: str,
    pps_num: int,
    pps_den: int = 1,
    count: int | None = None,
    duration_ns: int | None = None,
    seed: int = 1,
    on_ns: int = 0,
    off_ns: int = 0,
    replay: str | None = None,
) -> npt.NDArray[np.uint64]: ...
def net_send(
    dest: str,
    size: int,
    pps_num: int,
    pps_den: int = 1,
    pattern_name: str = "cbr",
    count: int | None = None,
    duration_ns: int | None = None,
    workers: int = 1,
    flow: int = 1,
    tx_timestamps: bool = True,
    records: bool = True,
    seed: int = 1,
    on_ns: int = 0,
    off_ns: int = 0,
    replay: str | None = None,
    cpus: list[int] = ...,
) -> _SendRun: ...
def net_recv(
    bind: str,
    duration_ns: int | None = None,
    idle_ns: int | None = None,
    count: int | None = None,
    records: bool = True,
    rcvbuf: int = 33554432,
    max_size: int = 65536,
) -> _RecvRun: ...

class _RecvRun(TypedDict):
    """A receive run: counts, flows, per-second totals and the delay histograms."""

    bound: str
    packets: int
    bytes: int
    malformed: int
    truncated: int
    no_kernel_ts: int
    hw_ts: int
    batches: int
    sockbuf_drops: int
    flows: list[_RecvFlow]
    per_second_packets: npt.NDArray[np.uint64]
    per_second_bytes: npt.NDArray[np.uint64]
    first_krx: int
    last_krx: int
    first_urx: int
    last_urx: int
    owd: _Hist
    stack_net: _Hist
    end_host: _Hist
    interarrival: _Hist
    hist_scale: str
    interarrival_n: int
    interarrival_sum: float
    interarrival_sumsq: float
    elapsed_ns: int
    interrupted: bool

class _EchoRun(TypedDict):
    """The echo server's counts when it stops."""

    requests: int
    malformed: int
    send_errors: int
    elapsed_ns: int
    tids: list[int]
    interrupted: bool

def net_echo(bind: str, duration_ns: int | None = None, tcp: bool = False, ready_fd: int | None = None) -> _EchoRun: ...

class _RrRun(TypedDict):
    """A request-response run: counts, then one column per exchange (ns stamps)."""

    sent: int
    send_errors: int
    malformed: int
    duplicates: int
    elapsed_ns: int
    interrupted: bool
    seq: npt.NDArray[np.int64]
    sent_ns: npt.NDArray[np.int64]
    srv_krx_ns: npt.NDArray[np.int64]
    srv_urx_ns: npt.NDArray[np.int64]
    srv_utx_ns: npt.NDArray[np.int64]
    krx_ns: npt.NDArray[np.int64]
    urx_ns: npt.NDArray[np.int64]

def net_rr(
    dest: str,
    pps_num: int,
    duration_ns: int,
    pps_den: int = 1,
    pattern_name: str = "cbr",
    size: int = 64,
    flow: int = 1,
    grace_ns: int = 200000000,
    records: bool = True,
    seed: int = 1,
    on_ns: int = 0,
    off_ns: int = 0,
    tcp: bool = False,
) -> _RrRun: ...
def net_bulk_tcp(dest: str, duration_ns: int, rate_bps: float | None = None, size: int = 65536) -> tuple[int, int, str | None]: ...
def net_sink_tcp(bind: str, duration_ns: int | None = None) -> tuple[int, int]: ...

_NetemLink = TypedDict(
    "_NetemLink",
    {
        "name": str,
        "from": str,
        "to": str,
        "configured": bool,
        "packets_in": int,
        "bytes_in": int,
        "forwarded": int,
        "lost": int,
        "duplicated": int,
        "reordered": int,
        "queue_drops": int,
        "send_errors": int,
        "pending_at_stop": int,
        "kernel": bool,
        "applied": _Hist,
        "late": _Hist,
        "queued": _Hist,
    },
)

class _NetemRun(TypedDict):
    """The emulator's counts when it stops."""

    links: list[_NetemLink]
    ports: list[PortCounts]
    hist_scale: str
    elapsed_ns: int
    interrupted: bool
    final_margin_ns: int
    sleeps: int
    priority: int
    policy: str
    reload_errors: list[str]
    unfiltered: list[str]
    wait: str
    cpu_note: str
    cpu_ns: int

def netem_run(config: str, ready_fd: int | None = None, reload_path: str | None = None) -> _NetemRun: ...
def pipe_source(
    dest: str, flow: int, pps_num: int, pps_den: int, size: int, count: int | None = None, duration_ns: int | None = None, linger_ns: int = 0
) -> _PipeSource: ...
def pipe_node(bind: str, next: str, work_ns: int = 0, ready_fd: int | None = None) -> _PipeNode: ...
def pipe_sink(bind: str, flow: int, ready_fd: int | None = None) -> _PipeSink: ...
def sync_serve(bind: str, ready_fd: int | None = None) -> _SyncServe: ...
def sync_probe(dest: str, flow: int, rate: float, gap_ns: int, duration_ns: int | None = None, grace_ns: int = 200_000_000) -> _SyncProbe: ...
def bench_floor(n: int, reps: int) -> list[float]: ...
def env_compiled(ops: int, batches: int) -> list[float]: ...
def bench_events(n: int, reps: int, threads: int = 1) -> list[float]: ...
def bench_sustained(rate: float, seconds: float) -> tuple[int, float]: ...

class ChannelTimeout(TimeoutError): ...

class ChannelCore:
    @property
    def name(self) -> str: ...
    @property
    def capacity(self) -> int: ...
    def attach(self, oldest: bool = False) -> int: ...
    def detach(self, consumer: int) -> None: ...
    def put(self, ts: int, data: bytes, timeout: float = 5.0) -> None: ...
    def get(self, consumer: int, which: str = "next", ts: int | None = None, consume: bool = False, timeout: float = 5.0) -> tuple[int, bytes]: ...
    def consume(self, consumer: int, ts: int) -> bool: ...
    def stats(self) -> dict[str, int]: ...

class HubCore:
    def __init__(self, frag: int = 1400) -> None: ...
    def listen(self, bind: str) -> str: ...
    def create(self, name: str, capacity: int = 64, full: str = "block", max_item: int = 16777216) -> ChannelCore: ...
    def pump(self, timeout: float) -> bool: ...
    def net_stats(self) -> dict[str, int]: ...
    def close(self) -> None: ...

class RemoteProducerCore:
    def __init__(self, hub: str, name: str, transport: str = "tcp", frag: int = 1400, timeout: float = 5.0) -> None: ...
    def put(self, ts: int, data: bytes, timeout: float = 5.0) -> None: ...
    def stats(self) -> dict[str, int]: ...

class RemoteConsumerCore:
    def __init__(
        self, hub: str, name: str, transport: str = "tcp", capacity: int = 64, max_item: int = 16777216, frag: int = 1400, timeout: float = 5.0
    ) -> None: ...
    def get(self, which: str = "next", ts: int | None = None, consume: bool = False, timeout: float = 5.0) -> tuple[int, bytes]: ...
    def consume(self, ts: int) -> bool: ...
    def stats(self) -> dict[str, int]: ...

def chan_bench_serve(raw_bind: str, chan_bind: str, reply_to: str, transport: str, frag: int = 1400) -> tuple[int, int]: ...

class _ChanBenchRow(TypedDict):
    """One block of the channel benchmark's client: raw or channel, its item size and each round trip."""

    mode: str
    block: int
    size: int
    elapsed_ns: int
    timeouts: int
    rtt_ns: npt.NDArray[np.int64]

def chan_bench_client(
    raw_dest: str, chan_dest: str, bind: str, transport: str, sizes: list[int], rounds: list[int], blocks: int, warmup: int = 20, frag: int = 1400
) -> list[_ChanBenchRow]: ...

# The kernel trace decoder (crates/ktrace) and the page reader.
def ktrace_read(fd: int, page_size: int, max_bytes: int) -> bytes: ...

class KtraceActivations:
    def __init__(
        self, tids: list[int], lost_start: list[int], lost_end: list[int], top_k: int | None = None, window: tuple[int, int] | None = None
    ) -> None: ...
    def finish_summary(self) -> dict[str, Any]: ...
    def feed(
        self,
        t: npt.NDArray[np.int64],
        cpu: npt.NDArray[np.int64],
        kind: npt.NDArray[np.int64],
        pid: npt.NDArray[np.int64],
        target: npt.NDArray[np.int64],
        next_pid: npt.NDArray[np.int64],
        asleep: npt.NDArray[np.int64],
        value: npt.NDArray[np.int64],
    ) -> None: ...
    def feed_files(
        self, runs: list[list[tuple[str, int, int]]], kinds: list[int], sleep_code: int, offsets: tuple[list[int], list[int]] | None = None
    ) -> None: ...
    def finish(self) -> dict[str, npt.NDArray[np.int64] | npt.NDArray[np.bool_]]: ...

class StringTable:
    """A capture's string table made native once: attribution borrows it for
    every cluster instead of copying a list of strings at each call."""

    def __init__(self, strings: list[str]) -> None: ...
    def __len__(self) -> int: ...

class FreedKept:
    """A context manager: while any is held, glibc keeps freed memory for the
    next allocations (no page handed back and faulted in again); on the last
    exit, what is free is handed back."""

    def __init__(self) -> None: ...
    def __enter__(self) -> FreedKept: ...
    def __exit__(self, *args: object) -> bool: ...

_AttrCols = Mapping[str, npt.NDArray[np.int64] | npt.NDArray[np.int32] | list[npt.NDArray[np.int64] | npt.NDArray[np.int32]]]

def ktrace_attribute(
    cols: _AttrCols | Iterable[_AttrCols] | tuple[int, int, list[list[tuple[str, int, int]]]],
    event_names: list[str],
    comms: list[str] | StringTable,
    states: list[str] | StringTable,
    names: list[str] | StringTable,
    role_tids: list[int],
    role_labels: list[str],
    perf_is_lab: bool,
    lost: int,
    lost_at: tuple[list[int], list[int], list[int], list[int]] | None,
    t_first: int,
    t_last: int,
    w_id: npt.NDArray[np.int64],
    w_tid: npt.NDArray[np.int64],
    w_a: npt.NDArray[np.int64],
    w_b: npt.NDArray[np.int64],
    w_span: npt.NDArray[np.bool_],
    group_tids: list[int] | None = None,
    group_paths: list[str] | None = None,
) -> _Split: ...

class _Split(TypedDict):
    """Windows split into causes: one entry per (window, cause) (``id``,
    ``cause`` an index into ``causes``, ``ns``), and one per window (``w_id``, …)."""

    id: npt.NDArray[np.int64]
    cause: npt.NDArray[np.int64]
    ns: npt.NDArray[np.integer[Any]]
    before_ns: npt.NDArray[np.int64]
    causes: list[str]
    w_id: npt.NDArray[np.int64]
    cpu: npt.NDArray[np.integer[Any]]
    migrations: npt.NDArray[np.integer[Any]]
    page_faults: npt.NDArray[np.integer[Any]]
    complete: npt.NDArray[np.bool_]
    missing: list[str | None]
    rule: list[str | None]

def ktrace_task_label(comm: str, pid: int, perf_is_lab: bool = False) -> str: ...
def ktrace_cpu_pictures(
    cols: _AttrCols,
    event_names: list[str],
    comms: list[str] | StringTable,
    states: list[str] | StringTable,
    names: list[str] | StringTable,
    role_tids: list[int],
    role_labels: list[str],
    perf_is_lab: bool,
    t_first: int,
    t_last: int,
) -> dict[
    int, tuple[npt.NDArray[np.int64], npt.NDArray[np.int64], npt.NDArray[np.int64], list[str], npt.NDArray[np.int64], npt.NDArray[np.int64], list[str]]
]: ...
def boot_select(
    values: npt.NDArray[np.float64], lengths: list[int], starts: list[npt.NDArray[np.int64]], block: int, ks: list[int], mean: bool
) -> tuple[npt.NDArray[np.float64], npt.NDArray[np.float64]]:
    """Per block-bootstrap replicate (a row of every series' starts): its ``ks``-th smallest samples
    (replicate-major, ``len(ks)`` a replicate) and its mean (empty unless ``mean``)."""

class _DecodedLost(TypedDict):
    """Where the pages said events were lost: per loss, its CPU, span and count (-1: unknown), and why."""

    cpu: npt.NDArray[np.int64]
    start_ns: npt.NDArray[np.int64]
    end_ns: npt.NDArray[np.int64]
    events: npt.NDArray[np.int64]
    why: list[str]

class _Decoded(TypedDict):
    """What the decoder holds since the last take: columns (codes into ``strings``/``events``), losses, tables, counts."""

    columns: dict[str, npt.NDArray[np.int64] | npt.NDArray[np.int32]]
    lost: _DecodedLost
    strings: list[str]
    events: list[str]
    counts: dict[str, int]

class KtraceDecoder:
    def __init__(self, header_page: str, formats: list[tuple[str, str]], page_size: int) -> None: ...
    def pages(self, cpu: int, data: bytes) -> None: ...
    def read_pages(self, fd: int, cpu: int, max_bytes: int) -> tuple[int, int]: ...
    def set_last_time(self, cpu: int, t_ns: int) -> None: ...
    def last_times(self) -> list[tuple[int, int]]: ...
    def finish(self, end_ns: int) -> None: ...
    def take(self) -> _Decoded: ...
    def take_batch(self) -> _Batch: ...

class _ImportMeta(TypedDict, total=False):
    format: str
    version: int
    clock: str
    compression: str | None
    buffers: list[str]
    cpus_with_data: int
    bad_formats: list[str]
    hostname: str | None
    os_release: str | None
    perf_version: str | None
    command: str | None
    nr_cpus: int | None
    page_size: int
    uname: str | None
    tool_version: str | None
    cpu_count: int
    cpustats: list[str]
    header_page: str
    formats: list[tuple[str, str]]
    cmdlines: list[tuple[int, str]]

class KtraceImport:
    def __init__(self, path: str, kind: str, sorted_reader: bool = False) -> None: ...
    def meta(self) -> _ImportMeta: ...
    def next(self, records: int) -> bool: ...
    def take(self) -> _Decoded: ...
    def take_batch(self) -> _Batch: ...
    def watermark_ns(self) -> int | None: ...
    def damage(self) -> list[str]: ...
    def perf_counts(self) -> tuple[int, int, int, int, int] | None: ...

class KtraceBatch:
    """A batch's decoded events, kept native until ``KtraceSegments.write`` spends it."""

class _Batch(TypedDict):
    """What ``take_batch`` gives (``KtraceImport``, ``KtraceDecoder``): ``_Decoded`` with the columns left native."""

    batch: KtraceBatch
    n: int
    t_min: int | None
    t_max: int | None
    present: list[int]
    #: per CPU: [cpu, first stamp, last stamp, events]
    by_cpu: list[list[int]]
    lost: _BatchLost
    strings: list[str]
    events: list[str]
    counts: dict[str, int]

class _BatchLost(TypedDict):
    """``_DecodedLost`` as lists (a batch's taker need not load numpy)."""

    cpu: list[int]
    start_ns: list[int]
    end_ns: list[int]
    events: list[int]
    why: list[str]

class _Written(TypedDict):
    """A segment file written natively: its name under the capture (None: nothing written), rows, span, row groups, size."""

    file: str | None
    events: int
    t_first_ns: int | None
    t_last_ns: int | None
    groups: list[list[int]]
    bytes: int
    #: with ``switch``: each thread the segment's switches name, [tid, its latest name's code]
    names: NotRequired[list[list[int]]]

#: events per row group of a segment file the native writer writes (the store's GROUP)
SEGMENT_GROUP: int
#: the columns the native split takes, in its order (the store reads these)
#: the split's name for a timer interrupt that came late while another task ran
LATE_IRQ: str

class KtraceSegments:
    def __init__(self, cap_dir: str, level: int, recycle: bool = False) -> None: ...
    def cut(self, batch: KtraceBatch, watermark_ns: int | None) -> KtraceBatch: ...
    def write(self, batch: KtraceBatch, seg: int, switch: int | None = None) -> _Written: ...
    def held(self) -> int: ...
