"""The agent protocol: every request the controller sends an agent, and its reply, as models.

The controller and each host's agent talk JSON lines over the agent's
standard input and output (locally a pipe, remotely SSH or a TCP launcher):
``{"id": 7, "op": "start_probe", ...}`` one way, ``{"id": 7, "ok": true,
...}`` the other. This module is that conversation's contract, imported by
both ends: a request is a ``Request`` subclass naming its ``op`` and its
reply model, so the client (``lab.hosts.AgentClient.ask``) sends a typed
request and gets a typed reply, and the agent (``agent.server``) validates
what arrives before acting on it, answering a malformed request with an
error that names the field instead of a KeyError deep in a handler.

Two parts stay free-form on purpose: a probe's or load's specification
(the experiment file's model dumped as it is; the agent hands it to the
probe's own parameter model, which checks it) and a probe's result (each
kind prints its own JSON; its kind reads it). The wire format is the one
before these models existed: field names and shapes are unchanged.
"""

from __future__ import annotations

from typing import Any, ClassVar, Generic, Literal, TypeVar

from pydantic import BaseModel, ConfigDict, Field

from loopscope.kernel.capture import HalfFull
from loopscope.rundir import CaptureReport, CpuLimit, LoadReport, Machine, TuningChange


class Reply(BaseModel):
    """What an agent answers (fields it adds in a newer version are kept)."""

    model_config = ConfigDict(extra="allow")


R = TypeVar("R", bound=Reply)


class Request(BaseModel, Generic[R]):
    """One request: its ``op`` on the wire and the model of its reply."""

    model_config = ConfigDict(extra="forbid")
    op: ClassVar[str]
    reply: ClassVar[type[Reply]]


# ---- replies --------------------------------------------------------------------------------


class HelloReply(Reply):
    pid: int
    started_mono_ns: int
    cgroup: str | None = None
    cgroup_note: str = ""
    #: the machine as the agent found it (host/provenance.py)
    provenance: Machine = Field(default_factory=Machine)


class LoadStarted(Reply):
    name: str
    pids: list[int]
    cgroup: str | None = None
    command: str | None = None
    #: what placing its threads did (CPUs, scheduling), when the load asked for it
    tuned: dict[str, object] | None = None


class LoadsStarted(Reply):
    loads: list[LoadStarted] = Field(default_factory=list)


class LoadsStopped(Reply):
    loads: list[LoadReport] = Field(default_factory=list)


class ProbeStarted(Reply):
    pid: int
    trace: str
    spawn_mono_ns: int
    command: str


class ProbeDone(Reply):
    """A probe collected: its result (the kind's own JSON), its files and its cost."""

    done: bool = True
    result: dict[str, object] = Field(default_factory=dict)
    trace: str
    spawn_mono_ns: int
    end_mono_ns: int
    cpu_usec: int | None = None
    command: str


class Waited(Reply):
    """``wait_probe`` without collecting: whether the probe ended, and the watched probes that exited cleanly."""

    done: bool
    exited: list[str] = Field(default_factory=list)


class Watched(Reply):
    exited: list[str] = Field(default_factory=list)


class Done(Reply):
    done: bool = True


class Packed(Reply):
    """The host's run directory packed for the way home (``host/packing.py``)."""

    bytes: int
    files: int
    sha256: str


class Chunk(Reply):
    #: base64 of the packed file's bytes from the request's offset
    data: str
    eof: bool


class Status(Reply):
    #: each running probe: whether it is still alive
    probes: dict[str, bool] = Field(default_factory=dict)


class Drained(Reply):
    """A read of the capture's buffers between windows (its counts kept as they come), or why there was none;
    and the kernel's groups with a CPU limit at that time."""

    error: str | None = None
    cpu_limits: list[CpuLimit] = Field(default_factory=list)


class TuningsChecked(Reply):
    """What of the phases' tunings this host's kernel cannot make (empty: all of it)."""

    problems: list[str] = Field(default_factory=list)


class TuningsMade(Reply):
    """What the phase's tunings changed on this host's kernel, and why they stopped short, if they did."""

    changes: list[TuningChange] = Field(default_factory=list)
    error: str | None = None


class TuningsGivenBack(Reply):
    """What could not be given back (empty: everything was)."""

    problems: list[str] = Field(default_factory=list)


class CaptureMeta(CaptureReport, Reply):
    """What the kernel capture said on starting or stopping (its fields are
    ``rundir.CaptureReport``'s, which the run keeps)."""

    #: the reads the reader made when a CPU's buffer was half full (kernel_ns, read_ns)
    half_full: list[HalfFull] = Field(default_factory=list)


# ---- requests -------------------------------------------------------------------------------


class Hello(Request[HelloReply]):
    op = "hello"
    reply = HelloReply
    run_id: str
    run_dir: str
    cgroup_name: str | None = None
    cgroups: bool = True
    #: test only: a virtual clock every child of the agent skews its timestamps by
    vclock: str | None = None
    #: the controller's loopscope version: an agent of another version refuses, naming both
    controller_version: str | None = None
    #: what every probe of the session starts with in its environment, on every
    #: host (a monitor's: its probes' trace flush period and writer policy, the
    #: file a threads probe adds its threads to for the flight recorder)
    probe_env: dict[str, str] = Field(default_factory=dict)


class StartLoads(Request[LoadsStarted]):
    op = "start_loads"
    reply = LoadsStarted
    step_dir: str
    scratch_dir: str
    #: each load as the experiment file's model dumps it, with its name, CPUs and scheduling
    loads: list[dict[str, Any]]
    settle_s: float = 0.3


class StopLoads(Request[LoadsStopped]):
    op = "stop_loads"
    reply = LoadsStopped


class RunProbe(Request[ProbeDone]):
    """Run a probe to its end (the step's one process, or a calibration)."""

    op = "run_probe"
    reply = ProbeDone
    #: the probe as the experiment file's model dumps it (its kind's parameter model checks it)
    probe: dict[str, Any]
    step_dir: str
    scratch_dir: str
    duration_ns: int
    calibrate: bool = False
    timeout_slack_s: float = 120.0


class StartProbe(Request[ProbeStarted]):
    """Start a probe or helper beside others (collected by ``stop_probe``)."""

    op = "start_probe"
    reply = ProbeStarted
    probe: dict[str, Any]
    step_dir: str
    scratch_dir: str
    duration_ns: int = 0
    #: wait for its ``ready`` line (a server bound, a stage listening)
    wait_ready: bool = False
    ready_timeout_s: float = 15.0


class WaitProbe(Request[Waited]):
    op = "wait_probe"
    reply = Waited
    name: str
    timeout_s: float = 1.0
    collect: bool = True
    #: other probes of the host whose failure ends the wait
    watch: list[str] = Field(default_factory=list)


class Watch(Request[Watched]):
    op = "watch"
    reply = Watched
    names: list[str] = Field(default_factory=list)
    timeout_s: float | None = None


class StopProbe(Request[ProbeDone]):
    op = "stop_probe"
    reply = ProbeDone
    name: str
    timeout_s: float = 15.0


class SignalProbe(Request[Done]):
    op = "signal_probe"
    reply = Done
    name: str
    signal: Literal["stop", "cont"]


class GetStatus(Request[Status]):
    op = "status"
    reply = Status


class StartKcapture(Request[CaptureMeta]):
    op = "start_kcapture"
    reply = CaptureMeta
    out_dir: str
    events: list[str] | None = None
    buffer_mb: int | None = None
    window_s: float | None = None
    read: str = "between-windows"


class DrainKcapture(Request[Drained]):
    op = "drain_kcapture"
    reply = Drained
    label: str = ""


class StopKcapture(Request[CaptureMeta]):
    op = "stop_kcapture"
    reply = CaptureMeta


class CheckTunings(Request[TuningsChecked]):
    """Every phase's tunings checked against this host's kernel, nothing changed."""

    op = "check_tunings"
    reply = TuningsChecked
    #: the experiment's phases, dumped (their ``tunings`` are what is checked)
    phases: list[dict[str, object]]


class MakeTunings(Request[TuningsMade]):
    """A phase's tunings made on this host's kernel, journalled on this host, until ``give_back_tunings``."""

    op = "make_tunings"
    reply = TuningsMade
    #: the phase's tunings, dumped
    tunings: list[dict[str, object]]
    #: their place in the experiment file (``phases.2``), for messages
    where: str


class GiveBackTunings(Request[TuningsGivenBack]):
    op = "give_back_tunings"
    reply = TuningsGivenBack


class MonitorLines(Reply):
    """What a host's own monitor wrote since the last ask: new whole lines of
    its line files, new bytes of its interval logs, where each now ends."""

    #: file (relative to the monitor's directory) -> what was appended since its offset
    appended: dict[str, str] = Field(default_factory=dict)
    #: file -> where the next ask starts
    offsets: dict[str, int] = Field(default_factory=dict)
    #: its ``monitor.json`` as it stands (None: not written yet)
    record: dict[str, object] | None = None
    #: still running; once not, its exit code and its error output's end
    running: bool = True
    exit_code: int | None = None
    said: str = ""


class StartMonitor(Request[MonitorLines]):
    """A monitor of this host's own (the controller's is on another kernel):
    ``loopscope monitor`` started here on ``spec`` (this host as ``local``),
    writing into ``out``; its lines come home through ``monitor_lines``."""

    op = "start_monitor"
    reply = MonitorLines
    #: the monitor's experiment file, as text
    spec: str
    #: its directory on this host
    out: str
    #: go on from what ``out`` holds (``--resume``)
    resume: bool = False


class ReadMonitor(Request[MonitorLines]):
    """What the host's monitor appended since ``offsets``."""

    op = "read_monitor"
    reply = MonitorLines
    offsets: dict[str, int] = Field(default_factory=dict)


class StopMonitor(Request[MonitorLines]):
    """The host's monitor stopped as by Ctrl-C (its open period closed), then what it appended since ``offsets``."""

    op = "stop_monitor"
    reply = MonitorLines
    offsets: dict[str, int] = Field(default_factory=dict)
    timeout_s: float = 10.0


class PackFiles(Request[Packed]):
    op = "pack_files"
    reply = Packed
    #: the host's run directory (the one ``hello`` named)
    path: str


class ReadPacked(Request[Chunk]):
    op = "read_packed"
    reply = Chunk
    offset: int = 0
    size: int = 4 << 20


class DropFiles(Request[Done]):
    op = "drop_files"
    reply = Done
    #: remove the run directory too (its files are home)
    remove: bool = True


#: every request by its op, for the agent to read what arrives
REQUESTS: dict[str, type[Request[Any]]] = {
    r.op: r
    for r in (
        Hello,
        StartLoads,
        StopLoads,
        RunProbe,
        StartProbe,
        WaitProbe,
        Watch,
        StopProbe,
        SignalProbe,
        GetStatus,
        StartKcapture,
        DrainKcapture,
        StopKcapture,
        CheckTunings,
        MakeTunings,
        GiveBackTunings,
        StartMonitor,
        ReadMonitor,
        StopMonitor,
        PackFiles,
        ReadPacked,
        DropFiles,
    )
}
