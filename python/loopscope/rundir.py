"""A run directory: its paths and its typed run record, read and written here.

``RunDir.open`` is the one place that decides whether a path is a run
directory (it holds the ``run.json`` that ``loopscope run`` writes first)
and says so in one message, exit code 2, naming the path.

``run.json`` is the run record (``RunRecord``): what ran, on which hosts,
every step (repetition × phase × probe) with its files, how the run ended.
The controller keeps it as a ``RunRecord`` and writes it only through
``RunDir.write_record``; every reader gets the object from ``RunDir.record``,
checked against the model. The record
carries its format version (``format``); a record without one is from
before versions were written (format 1, which this version reads), and a
record of a newer format is refused, naming it. Fields the model does not
name (a kind's own step fields: a pipeline's stages, an rr probe's server)
are kept as they are.
"""

from __future__ import annotations

import contextlib
import json
import os
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Callable, Iterator, TypeVar

from pydantic import BaseModel, ConfigDict, Field, TypeAdapter, ValidationError
from typing_extensions import TypedDict

from loopscope.errors import InputError

T = TypeVar("T")

#: the run record's format: 2 added ``format`` itself; 1 is every run before it
RUN_FORMAT = 2


class _Open(BaseModel):
    model_config = ConfigDict(extra="allow")


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
    result: dict[str, Any] | None = None
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
LinkCounts = TypedDict("LinkCounts", {
    "name": str, "from": str, "to": str, "configured": bool, "kernel": bool,
    "packets_in": int, "bytes_in": int, "forwarded": int, "lost": int, "duplicated": int, "reordered": int,
    "queue_drops": int, "send_errors": int, "pending_at_stop": int,
    "applied_ns": HistQuantiles, "late_ns": HistQuantiles, "queued_ns": HistQuantiles,
})


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


class VirtualClock(_Open):
    """A test-only skew of a host's clocks (``virtual_clock:`` of a host)."""

    offset_ns: float = 0.0
    drift_ppm: float = 0.0
    epoch_realtime_ns: int | None = None


class LabHost(_Open):
    """How the lab set a host up: its kind, address, and what it did to its clocks."""

    kind: str
    address: str | None = None
    clock_offset_ns: int = 0
    virtual_clock: VirtualClock | None = None
    ssh: str | None = None
    #: exec: the launcher's command the agent was started through
    launcher: list[str] | None = None


class LabProvenance(_Open):
    """The lab's side of provenance.json: hosts, network, links."""

    hosts: dict[str, LabHost] = Field(default_factory=dict)
    network: dict[str, Any] | None = None
    links: dict[str, Any] | None = None


class MachineCpu(_Open):
    model: str | None = None
    cpus: int | None = None
    usable_cpus: list[int] = Field(default_factory=list)
    isolated: str | None = None
    smt: str | None = None


class MachineKernel(_Open):
    release: str | None = None
    version: str | None = None
    machine: str | None = None
    cmdline: str | None = None


class KernelClock(_Open):
    """The kernel's NTP state (adjtimex, read only)."""

    state: str
    synchronised: bool
    frequency_ppm: float
    offset_ns: int
    max_error_us: int
    est_error_us: int
    tai_offset_s: int


class Chrony(_Open):
    """chrony's tracking report (or why there is none: ``note``)."""

    reference: str | None = None
    stratum: int | None = None
    system_time_offset_s: float | None = None
    last_offset_s: float | None = None
    rms_offset_s: float | None = None
    frequency_ppm: float | None = None
    skew_ppm: float | None = None
    leap: str | None = None
    note: str | None = None


class ClockDiscipline(_Open):
    """What disciplines a host's CLOCK_REALTIME: the kernel, chrony, the time daemons running."""

    kernel: KernelClock | None = None
    chrony: Chrony | None = None
    daemons: list[str] = Field(default_factory=list)


class CpuFreq(_Open):
    governors: dict[str, str] | None = None
    note: str | None = None


class Privileges(_Open):
    euid: int | None = None
    capabilities: dict[str, bool] = Field(default_factory=dict)


class GitInfo(_Open):
    sha: str | None = None
    dirty: bool | None = None
    note: str | None = None


class Machine(_Open):
    """One host's machine as its agent found it (``host/provenance.py``)."""

    host: str | None = None
    time_utc: str | None = None
    kernel: MachineKernel | None = None
    cpu: MachineCpu | None = None
    memory_kib: int | None = None
    clocksource: str | None = None
    #: what disciplines the host's CLOCK_REALTIME (kernel state, chrony, daemons)
    clock_discipline: ClockDiscipline | None = None
    cpufreq: CpuFreq | None = None
    cpuidle_driver: str | None = None
    preempt: str | None = None
    loadavg_at_start: list[float] | None = None
    privileges: Privileges | None = None
    cgroup: str | None = None
    tracefs: str | None = None
    software: dict[str, str | None] = Field(default_factory=dict)
    loopscope_git: GitInfo | None = None
    executable: str | None = None
    #: the kernel's boot id: hosts that share it share one kernel (one kernel capture covers them)
    boot_id: str | None = None
    #: the inode of the agent's PID namespace (hosts of one kernel with the same one see the same process ids)
    pid_ns: int | None = None
    loopscope_version: str | None = None


class Provenance(_Open):
    """What ``provenance.json`` holds: the controller, the lab, each host's machine, and the tunings the phases applied."""

    controller: dict[str, Any] = Field(default_factory=dict)
    lab: LabProvenance = Field(default_factory=LabProvenance)
    hosts: dict[str, Machine] = Field(default_factory=dict)
    tunings: list[dict[str, Any]] | None = None

    def offsets(self) -> dict[str, int]:
        """Each host's CLOCK_MONOTONIC offset (its time namespace), ns."""
        return {h: v.clock_offset_ns for h, v in self.lab.hosts.items()}


@dataclass
class Derived:
    """What an analysis step made of a run, for the run directory to write:
    JSON documents and tables by their path in the run directory."""

    documents: dict[str, Any] = field(default_factory=dict)
    #: path → polars DataFrame (typed Any: this module sits below polars' users)
    tables: dict[str, Any] = field(default_factory=dict)


#: the columns that identify a run, beside every row of every table it writes (docs/tables.md)
IDENTITY = ("run_id", "experiment", "host", "kernel", "loopscope_version", "started_utc")


@dataclass(frozen=True)
class Identity:
    """What identifies a run's rows when many runs are read as one dataset:
    the run (its directory's name), the experiment, when it started, the
    loopscope that recorded it, and per row the host and its kernel."""

    run_id: str
    experiment: str
    started_utc: str | None
    loopscope_version: str | None
    kernels: dict[str, str | None]
    first_host: str
    probe_hosts: dict[str, str]

    @classmethod
    def of(cls, run: RunRecord, prov: Provenance) -> Identity:
        kernels = {h: (m.kernel.release if m.kernel else None) for h, m in prov.hosts.items()}
        probe_hosts: dict[str, str] = {}
        for st in run.steps:
            probe_hosts.setdefault(st.probe, run.host_of(st))
        version = next((m.software.get("loopscope") for m in prov.hosts.values() if m.software.get("loopscope")), None)
        return cls(run.run_id, run.name, run.started_utc, version, kernels, run.first_host, probe_hosts)

    def tag(self, frame: Any) -> Any:
        """``frame`` (a polars DataFrame) with the identifying columns at its
        end: a row's host is its own ``host`` column where it has one, else its
        probe's host, else the run's first; the kernel is that host's."""
        import polars as pl

        if "host" in frame.columns:
            host = pl.col("host")
        elif "probe" in frame.columns:
            host = pl.col("probe").replace_strict(self.probe_hosts, default=self.first_host, return_dtype=pl.String)
        else:
            host = pl.lit(self.first_host)
        started = pl.lit(self.started_utc).str.to_datetime(time_zone="UTC", time_unit="us") if self.started_utc else pl.lit(None, dtype=pl.Datetime("us", "UTC"))
        out = frame.drop([c for c in IDENTITY if c in frame.columns and c != "host"]).with_columns(
            pl.lit(self.run_id).alias("run_id"), pl.lit(self.experiment).alias("experiment"), host.cast(pl.String).alias("host"),
        )
        return out.with_columns(
            pl.col("host").replace_strict(self.kernels, default=None, return_dtype=pl.String).alias("kernel"),
            pl.lit(self.loopscope_version, dtype=pl.String).alias("loopscope_version"), started.alias("started_utc"),
        )


#: within ``read_once()``: each run document parsed once, keyed by path, size and mtime
_read: dict[tuple[str, int, int], Any] | None = None


@contextlib.contextmanager
def read_once() -> Iterator[None]:
    """Within: run.json, spec.json and provenance.json are each parsed once and
    shared (the report's load, its timeline and explain read the same run).
    What they return is shared, so it is read-only there; a file that
    changes is read again."""
    global _read
    outer = _read
    if outer is None:
        _read = {}
    try:
        yield
    finally:
        if outer is None:
            _read = None


def _once(path: Path, parse: Callable[[], T]) -> T:
    if _read is None:
        return parse()
    try:
        st = path.stat()
    except OSError:
        return parse()
    key = (os.path.realpath(path), st.st_size, st.st_mtime_ns)
    if key not in _read:
        _read[key] = parse()
    got: T = _read[key]
    return got


@dataclass(frozen=True)
class RunDir:
    path: Path

    @classmethod
    def open(cls, path: str | Path) -> RunDir:
        p = Path(path)
        if not (p / "run.json").is_file():
            raise InputError(f"{path}: not a run directory (no run.json); give a directory `loopscope run` printed")
        return cls(p)

    @property
    def run_json(self) -> Path:
        return self.path / "run.json"

    @property
    def spec_json(self) -> Path:
        return self.path / "spec.json"

    @property
    def provenance_json(self) -> Path:
        return self.path / "provenance.json"

    @property
    def tables(self) -> Path:
        return self.path / "tables"

    def record(self) -> RunRecord:
        """The run record, checked; InputError naming the file when it is damaged or newer than this version reads."""
        return _once(self.run_json, self._record)

    def spec(self) -> dict[str, Any]:
        """The experiment as run (spec.json); {} when the run has none."""
        return _once(self.spec_json, lambda: json.loads(self.spec_json.read_text()) if self.spec_json.exists() else {})

    def _record(self) -> RunRecord:
        try:
            data = json.loads(self.run_json.read_text())
        except (OSError, json.JSONDecodeError) as e:
            raise InputError(f"{self.run_json}: cannot be read ({e}); the run directory is damaged") from None
        fmt = data.get("format", 1) if isinstance(data, dict) else None
        if isinstance(fmt, int) and fmt > RUN_FORMAT:
            raise InputError(f"{self.run_json}: run format {fmt} is newer than this loopscope reads (up to {RUN_FORMAT}); read it with the version that recorded it")
        try:
            return RunRecord.model_validate(data)
        except ValidationError as e:
            first = e.errors()[0]
            where = ".".join(str(x) for x in first["loc"])
            raise InputError(f"{self.run_json}: not a run record of format {fmt}: {where}: {first['msg']}; the run directory is damaged") from None

    def provenance(self) -> Provenance:
        """provenance.json, checked (an empty one when the run has none); InputError naming the file when it is damaged."""
        return _once(self.provenance_json, self._provenance)

    def _provenance(self) -> Provenance:
        try:
            data = json.loads(self.provenance_json.read_text())
        except FileNotFoundError:
            return Provenance()
        except (OSError, json.JSONDecodeError) as e:
            raise InputError(f"{self.provenance_json}: cannot be read ({e}); the run directory is damaged") from None
        try:
            return Provenance.model_validate(data)
        except ValidationError as e:
            first = e.errors()[0]
            raise InputError(f"{self.provenance_json}: {'.'.join(str(x) for x in first['loc'])}: {first['msg']}; the run directory is damaged") from None

    def write_provenance(self, prov: Provenance) -> None:
        """Write provenance.json (what was set, nothing defaulted), atomically."""
        tmp = self.provenance_json.with_name(".provenance.json.tmp")
        tmp.write_text(json.dumps(prov.model_dump(mode="json", exclude_unset=True), indent=1, default=str) + "\n")
        os.replace(tmp, self.provenance_json)

    def identity(self) -> Identity:
        """What identifies the run's rows in a dataset of runs."""
        return Identity.of(self.record(), self.provenance())

    def write_derived(self, d: Derived) -> None:
        """Write what an analysis step made: each document atomically (JSON),
        each table as Parquet, its rows identified (``Identity.tag``)."""
        ident = self.identity() if d.tables else None
        for rel, frame in d.tables.items():
            p = self.path / rel
            p.parent.mkdir(parents=True, exist_ok=True)
            (ident.tag(frame) if ident is not None and rel.startswith("tables/") else frame).write_parquet(p)
        for rel, doc in d.documents.items():
            p = self.path / rel
            tmp = p.with_name(f".{p.name}.tmp")
            tmp.write_text(json.dumps(doc, indent=1, default=float) + "\n")
            os.replace(tmp, p)

    def write_record(self, rec: RunRecord) -> None:
        """Write the run record, in this version's format, atomically."""
        rec.format = RUN_FORMAT
        tmp = self.run_json.with_name(".run.json.tmp")
        tmp.write_text(json.dumps(rec.model_dump(mode="json", by_alias=True, exclude_unset=True), indent=1, default=str) + "\n")
        os.replace(tmp, self.run_json)
