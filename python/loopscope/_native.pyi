# Declarations of loopscope._native (crates/py/src/lib.rs).
# tests/test_native_stub.py checks that this file and the module agree.

import numpy as np
import numpy.typing as npt

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
def open(
    path: str,
    config: str | None = None,
    groups: list[str] | None = None,
    ring_groups: list[str] | None = None,
    fsync: bool = False,
) -> None: ...
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
def timer_probe(
    interval_ns: int,
    duration_ns: int,
    threads: int = 1,
    cpus: list[int] = ...,
    priority: int | None = None,
    mlock: bool = True,
    max_samples: int = 16000000,
    dma_latency_us: int | None = None,
) -> dict[str, object]: ...
def sched_probe(
    duration_ns: int,
    busy_threads: int = 2,
    sleep_ns: int = 1000000,
    work_ns: int = 1000000,
    cpus: list[int] = ...,
    work_iters: int | None = None,
    alone_ns: int | None = None,
    calibrate_only: bool = False,
) -> dict[str, object]: ...
def syscall_probe(
    calls: list[str],
    dir: str,
    batch: int = 200,
    min_batches: int = 10,
    max_batches: int = 2000,
    target_rel: float = 0.05,
    max_seconds: float = 5.0,
) -> dict[str, object]: ...
def syscall_names() -> list[str]: ...
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
) -> dict[str, object]: ...
def net_recv(
    bind: str,
    duration_ns: int | None = None,
    idle_ns: int | None = None,
    count: int | None = None,
    records: bool = True,
    rcvbuf: int = 33554432,
    max_size: int = 65536,
) -> dict[str, object]: ...
def net_echo(bind: str, duration_ns: int | None = None) -> dict[str, object]: ...
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
) -> dict[str, object]: ...
def net_bulk_tcp(dest: str, duration_ns: int, rate_bps: float | None = None, size: int = 65536) -> tuple[int, int, str | None]: ...
def net_sink_tcp(bind: str, duration_ns: int | None = None) -> tuple[int, int]: ...
def netem_run(config: str, ready_fd: int | None = None) -> dict[str, object]: ...
def pipe_source(dest: str, flow: int, pps_num: int, pps_den: int, size: int, count: int | None = None, duration_ns: int | None = None) -> dict[str, object]: ...
def pipe_node(bind: str, next: str, work_ns: int = 0, ready_fd: int | None = None) -> dict[str, object]: ...
def pipe_sink(bind: str, flow: int, ready_fd: int | None = None) -> dict[str, object]: ...
def bench_floor(n: int, reps: int) -> list[float]: ...
def bench_events(n: int, reps: int, threads: int = 1) -> list[float]: ...
def bench_sustained(rate: float, seconds: float) -> tuple[int, float]: ...
