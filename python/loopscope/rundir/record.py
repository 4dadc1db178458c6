"""``run.json``, the run record (``RunRecord``): what ran, on which hosts,
every step (repetition × phase × probe) with its files, how the run ended,
as pydantic models. Fields a model does not name (a kind's own step fields:
a pipeline's stages, an rr probe's server) are kept as they are (``_Open``).
``RunDir`` (the package's ``__init__``) reads and writes it.
"""

from __future__ import annotations

from pathlib import Path

from pydantic import BaseModel, ConfigDict, Field, TypeAdapter, ValidationError
from typing_extensions import TypedDict

from loopscope.errors import InputError


#: the run record's format: 2 added ``format`` itself; 1 is every run before it
RUN_FORMAT = 2


class _Open(BaseModel):
    model_config = ConfigDict(extra="allow", defer_build=True)


class StageStep(_Open):
    """One stage of a pipeline step (source, node, sink), each on its host."""

    role: str
    host: str
    name: str
    trace: str
    json_: str = Field(alias="json")
    command: str | None = None
    cpu_usec: float | None = None


class ProcessStep(_Open):
    """One process of an app step."""

    name: str
    host: str
    trace: str
    json_: str = Field(alias="json")
    command: str | None = None
    cpu_usec: float | None = None
    channel_stats: str | None = None


class ServerStep(_Open):
    """The echo server of an rr step (``host`` None: one the user runs)."""

    host: str | None = None
    address: str
    name: str | None = None
    json_: str | None = Field(None, alias="json")
    answered: int | None = None
    cpu_usec: float | None = None
    tids: list[int] | None = None


class HubStep(_Open):
    """A channel hub beside a program or app step (``hub-HOST``)."""

    name: str
    host: str
    trace: str
    json_: str = Field(alias="json")
    stats: str | None = None
    command: str | None = None
    cpu_usec: float | None = None
    hub: bool = True


class Step(_Open):
    """One repetition × phase × probe, with its files (relative to the run directory)."""

    rep: int
    phase: str
    loads: list[str] = Field(default_factory=list)
    probe: str
    kind: str
    host: str | None = None
    trace: str
    json_: str = Field(alias="json")
    command: str | None = None
    cpu_usec: float | None = None
    spawn_mono_ns: int
    end_mono_ns: int
    #: a pipeline's stages and its flow id
    stages: list[StageStep] | None = None
    flow: int | None = None
    #: an app's processes
    processes: list[ProcessStep] | None = None
    #: an rr probe's echo server
    server: ServerStep | None = None
    #: the channel hubs beside a program or app, and where its channel statistics went
    hubs: list[HubStep] | None = None
    channel_stats: str | None = None
    #: the window was cut short (by this signal: SIGINT, SIGTERM); its result is what was measured until then
    interrupted: str | None = None


class LoadReport(_Open):
    """One load at the end of a phase as its agent found it: its threads, where they ran, what it did."""

    name: str
    tids: list[int] = Field(default_factory=list)
    cpus: list[int] | None = None
    workers: int | None = None
    exit: list[str] = Field(default_factory=list)
    cpu_s: float | None = None
    cpu_source: str | None = None
    elapsed_s: float | None = None
    #: operations the load's workers said they did, and their unit
    ops: float | None = None
    unit: str | None = None


class LoadRecord(LoadReport):
    """One load in one repetition × phase: where it ran, its threads, what it did."""

    rep: int
    phase: str
    host: str | None = None


class AgentRecord(_Open):
    """The first host's agent."""

    host: str | None = None
    pid: int
    cgroup: str | None = None
    cgroup_note: str | None = None


class HostAgent(_Open):
    """Each host's agent: how it was reached and where its processes live."""

    kind: str
    pid: int | None = None
    cgroup: str | None = None
    address: str | None = None


class CaptureReport(_Open):
    """What a kernel capture says of itself (the agent's reply to starting
    and stopping it: ``protocol.CaptureMeta``), and so what the run keeps of
    it (``Capture``): one declaration for both."""

    #: the capture's data (segments index or a perf.data file); None when it recorded nothing
    data: str | None = None
    log: str | None = None
    timens_offset_ns: int | None = None
    tool: str | None = None
    read: str | None = None
    format: str | None = None
    events: list[str] | None = None
    missing_events: list[str] | None = None
    instance: str | None = None
    filters: dict[str, str] | None = None
    unfiltered_events: list[str] | None = None
    refused: str | None = None
    clock: str | None = None
    buffer_mb_per_cpu: float | None = None
    buffer_why: str | None = None
    page_size: int | None = None
    #: after the capture stopped: how long it ran, what its reader cost, the reader's threads and its counts
    seconds: float | None = None
    reader_cpu_s: float | None = None
    #: of ``reader_cpu_s``, what it spent before recording began: its start and its instance (the kernel
    #: zeroing the ring buffers it asked for is most of it: some 0.5 s for 2 x 153 MB on a fresh virtual machine)
    reader_setup_cpu_s: float | None = None
    reader: dict[str, int | float | None] | None = None
    reader_tids: list[int] = Field(default_factory=list)


class ReadDuring(TypedDict):
    """A read the kernel forced on the capture's reader, and the probe window it fell in (if any)."""

    kernel_ns: int
    step: str | None
    at_s: float
    read_ms: float


class CpuLimit(_Open):
    """A cgroup with a CPU limit on a captured kernel (``host.cpulimit``): its
    limit, its throttle counters and the threads seen in it, as of the last
    look (the capture looks after every probe step)."""

    path: str
    #: the hierarchy (cgroup v1 ``cpu``'s id in /proc/cgroups; 0 for cgroup v2), as ``cgroup_attach_task`` says it
    hierarchy: int = 0
    quota_us: int
    period_us: int
    nr_throttled: int = 0
    throttled_ns: int = 0
    tids: list[int] = Field(default_factory=list)


class Capture(CaptureReport):
    """One kernel capture of a run: the host it ran on, the hosts it covers
    (one kernel), where its files are (``data``, ``log``: relative to the run)."""

    host: str
    covers: list[str] = Field(default_factory=list)
    dir: str | None = None
    #: the reads the reader made during a probe's window (each: kernel_ns, step, at_s, read_ms)
    reader_ran_during: list[ReadDuring] = Field(default_factory=list)
    #: an imported perf.data's perf CPU time
    perf_cpu_s: float | None = None
    #: the groups with a CPU limit on this kernel during the run (their threads gathered over its looks)
    cpu_limits: list[CpuLimit] = Field(default_factory=list)


class KernelRecord(_Open):
    captures: list[Capture] = Field(default_factory=list)


class SyncPart(_Open):
    """A clock-sync responder or initiator: its files and its result."""

    host: str | None = None
    trace: str
    json_: str = Field(alias="json")
    result: dict[str, object] | None = None
    #: an initiator's flow id, the network it crossed (``sync`` or ``experiment``) and the address it probed
    flow: int | None = None
    network: str | None = None
    dest: str | None = None


class ClockSyncRecord(_Open):
    """The run's clock-sync probes: the reference host, the responder there, an initiator on every other host."""

    reference: str
    port: int | None = None
    rate: float | None = None
    gap_ns: int | None = None
    network: str | None = None
    asked_network: str | None = None
    responder: SyncPart | None = None
    initiators: dict[str, SyncPart] = Field(default_factory=dict)


class HistQuantiles(TypedDict, total=False):
    """A histogram's summary (ns): each quantile is the middle of the bucket
    that holds it, ``*_bucket`` that bucket's bounds (its error), None when it
    fell under or over the histogram's range; min, max and mean are exact."""

    n: int
    under: int
    over: int
    p50: int | None
    p50_bucket: list[int]
    p99: int | None
    p99_bucket: list[int]
    p999: int | None
    p999_bucket: list[int]
    min: int
    max: int
    mean: float
    std: float
    cv: float | None


class EmulatorRecord(_Open):
    json_: str = Field(alias="json")
    trace: str


#: one emulated link's counts and the delays it applied (netem.json ``links``)
LinkCounts = TypedDict(
    "LinkCounts",
    {
        "name": str,
        "from": str,
        "to": str,
        "configured": bool,
        "kernel": bool,
        "packets_in": int,
        "bytes_in": int,
        "forwarded": int,
        "lost": int,
        "duplicated": int,
        "reordered": int,
        "queue_drops": int,
        "send_errors": int,
        "pending_at_stop": int,
        "applied_ns": HistQuantiles,
        "late_ns": HistQuantiles,
        "queued_ns": HistQuantiles,
    },
)


class PortCounts(TypedDict):
    """One of the emulator's interfaces: what it saw and dropped (netem.json ``ports``)."""

    host: str
    ifname: str
    frames: int
    not_for_router: int
    not_ipv4: int
    to_router: int
    unrouted: int
    ttl_expired: int
    no_kernel_ts: int
    kernel_path: int
    socket_drops: int
    truncated: int
    tx_refused: int
    io: str


class EmulatorResult(TypedDict, total=False):
    """netem.json: what the link emulator did over the run (``loopscope netem --json``)."""

    probe: str
    loopscope: str
    json_format: int
    mechanism: str
    links: list[LinkCounts]
    ports: list[PortCounts]
    elapsed_ns: int
    interrupted: bool
    final_margin_ns: int
    sleeps: int
    priority: int
    policy: str
    reload_errors: list[str]
    unfiltered: list[str]
    wait: str | None
    cpu_note: str
    cpu_ns: int | None
    cpu_share: float | None
    trace: dict[str, str | int | None]


EMULATOR_RESULT = TypeAdapter(EmulatorResult)


def read_emulator_result(path: Path) -> EmulatorResult:
    """A netem.json checked against its type (InputError naming the field)."""
    try:
        return EMULATOR_RESULT.validate_json(path.read_bytes())
    except ValidationError as e:
        err = e.errors()[0]
        raise InputError(f"{path}: {'.'.join(str(p) for p in err['loc'])}: {err['msg']}") from None


class PathRecord(_Open):
    """How the packets from one host to another were carried, and why."""

    from_: str = Field(alias="from")
    to: str
    mechanism: str
    why: str | None = None


class LinkSetting(_Open):
    """A link as a phase set it."""

    name: str
    delay_ns: int = 0
    jitter_ns: int = 0
    loss: float = 0.0
    rate_bps: float | None = None


class TuningChange(_Open):
    tuning: str
    path: str | None = None
    old: str | None = None
    new: str | None = None


class TuningsApplied(_Open):
    """What one repetition × phase changed on the machine (and gave back after)."""

    rep: int
    phase: str
    #: the host whose kernel was tuned through its agent (absent: the controller's machine)
    host: str | None = None
    changes: list[TuningChange] = Field(default_factory=list)


class Failed(_Open):
    """The component that failed a run, and on which host, when and why."""

    host: str | None = None
    component: str | None = None
    at_utc: str | None = None
    #: the step or stage of the run it failed in
    during: str | None = None
    #: the first line of what went wrong (``error`` has all of it)
    why: str | None = None


class LostHost(_Open):
    """A host lost mid-run under ``on_host_failure: continue``: the run went on without it."""

    host: str
    at_utc: str
    during: str
    why: str
    #: the steps it was part of that did not run, or were cut short by its loss (``r01-baseline/timer``)
    steps: list[str] = Field(default_factory=list)
    #: when its agent was started again (a monitor retries a lost host before each period)
    back_utc: str | None = None


class RunRecord(_Open):
    """What ``run.json`` holds (docs/tables.md lists the rest of a run directory).
    Every field the controller writes is declared here; a field this version
    does not know (a newer minor addition) is kept as it is."""

    format: int = 1
    run_id: str
    name: str
    status: str
    started_utc: str | None = None
    ended_utc: str | None = None
    controller_pid: int | None = None
    command: list[str] = Field(default_factory=list)
    notes: list[str] = Field(default_factory=list)
    error: str | None = None
    hosts: dict[str, str] = Field(default_factory=dict)
    steps: list[Step] = Field(default_factory=list)
    loads: list[LoadRecord] = Field(default_factory=list)
    timings: dict[str, int | float | None] = Field(default_factory=dict)
    agent: AgentRecord | None = None
    agents: dict[str, HostAgent] = Field(default_factory=dict)
    #: per probe, what its calibration step found (the sched probe's burst)
    calibration: dict[str, dict[str, int]] = Field(default_factory=dict)
    kernel: KernelRecord | None = None
    #: per phase, the links as it set them
    phase_links: dict[str, list[LinkSetting]] = Field(default_factory=dict)
    #: the lab's own threads by component (``lab: agent`` → tids), for attribution
    lab_tids: dict[str, list[int]] = Field(default_factory=dict)
    tunings: list[TuningsApplied] | None = None
    clocksync: ClockSyncRecord | None = None
    emulator: EmulatorRecord | None = None
    paths: dict[str, PathRecord] | None = None
    #: the router namespace's forwarding counters
    router_kernel: dict[str, int] | None = None
    failed: Failed | None = None
    #: hosts lost mid-run under ``on_host_failure: continue``
    lost_hosts: list[LostHost] = Field(default_factory=list)

    @property
    def first_host(self) -> str:
        """The run's first host (the controller's), ``localhost`` for a record without hosts."""
        return next(iter(self.hosts), "localhost")

    def host_of(self, step: Step) -> str:
        """The host a step ran on (its ``host``, else the run's first)."""
        return step.host or self.first_host

    @property
    def captures(self) -> list[Capture]:
        """The kernel captures (none without a ``kernel`` record)."""
        return self.kernel.captures if self.kernel else []
