"""A probe's parameters, declared once, and what a probe process is started with.

Each probe module declares its parameters as one pydantic model (a
subclass of ``Params``): name, type, bounds (``Field(ge=…, le=…)``) and
help (the field's ``description``). Everything else comes from it: the
experiment file's probe model inherits it (``kinds/``), ``loopscope probe
KIND`` builds its options from it (``cli/params.py``), and the agent starts
a probe with a ``Launch``: the kind and the parameters, dumped by the model
and validated by it again in the probe's process. No command line is built
from strings between the controller and a probe, and a bound lives in one
place. Where the hot loop is native, the binding reads the model's fields
by attribute (``crates/py``), and a test ties the two declarations.

What is not a parameter but the step's: how long, where the trace goes,
the scratch directory, and the values an earlier calibration step found
(``calibration``: the sched probe's burst size), kept apart so that a user
cannot set them in an experiment file.
"""

from __future__ import annotations

import re

import os
from typing import Annotated, Literal

from pydantic import model_validator, AfterValidator, BaseModel, BeforeValidator, ConfigDict, Field, WithJsonSchema
from pydantic_core import PydanticCustomError

from loopscope.errors import InputError
from loopscope.fields import Bind, Command, Endpoint, pps


class Params(BaseModel):
    """Base of every probe's parameter model."""

    model_config = ConfigDict(extra="forbid", defer_build=True)

    def check_here(self) -> list[str]:
        """What this machine cannot do of these parameters (checked where the
        probe runs, not where the file is read): one line each."""
        return []

    def notes_here(self) -> list[str]:
        """What will not apply here but the probe reports rather than fails on."""
        return []


class Launch(BaseModel):
    """One probe process: the kind, its parameters and the step's own values."""

    model_config = ConfigDict(extra="forbid")

    kind: str
    params: dict[str, object] = Field(description="the kind's Params, dumped; validated by its model in the probe's process")
    duration_ns: int = Field(ge=0)
    trace: str | None = None
    scratch: str
    calibrate: bool = False
    calibration: dict[str, int] = Field(default_factory=dict)


def cpus_here(cpus: list[int] | None, option: str = "cpu") -> list[str]:
    """CPUs this process may not run on, said with the ones it may."""
    allowed = sorted(os.sched_getaffinity(0))
    return [f"{option}: CPU {c} is not available to this process; use one of {allowed}" for c in cpus or [] if c not in allowed]


def raise_unfit(p: Params) -> None:
    """``check_here`` as an InputError (exit 2) when anything is unfit."""
    bad = p.check_here()
    if bad:
        raise InputError("; ".join(bad))


# ---- the probes' parameters ------------------------------------------------------


class TimerParams(Params):
    """Timer wake-up latency on absolute deadlines (cyclictest's measurement)."""

    interval_us: Annotated[int, Field(ge=1, le=10_000_000, description="wake-up period, µs", json_schema_extra={"x-flags": ["-i"]})] = 1000
    threads: Annotated[int, Field(ge=1, le=1024, description="measuring threads", json_schema_extra={"x-flags": ["-t"]})] = 1
    cpu: list[Annotated[int, Field(ge=0)]] | None = Field(None, description="pin threads to these CPUs, round-robin")
    priority: Annotated[int, Field(ge=1, le=99)] | None = Field(
        None, description="SCHED_FIFO priority (needs CAP_SYS_NICE; default: SCHED_OTHER)", json_schema_extra={"x-flags": ["-p"]}
    )
    dma_latency_us: Annotated[int, Field(ge=0, le=2_000_000_000)] | None = Field(
        None,
        description="hold /dev/cpu_dma_latency at this many µs during the run, as cyclictest does with 0 by default (default: leave idle states alone)",
        json_schema_extra={"x-flags": ["--dma-latency"]},
    )
    mlock: bool = Field(True, description="lock the probe's memory (mlockall), as cyclictest -m does; off lets page faults into its wake-ups")

    def check_here(self) -> list[str]:
        return cpus_here(self.cpu)

    def notes_here(self) -> list[str]:
        if self.dma_latency_us is not None and not os.access("/dev/cpu_dma_latency", os.W_OK):
            return ["dma_latency_us: /dev/cpu_dma_latency is not writable; the probe will report it"]
        return []

    def peer_note(self) -> str | None:
        """One line for the summary when a default changes the number against cyclictest."""
        if self.dma_latency_us is None:
            return (
                "idle states left alone: cyclictest holds /dev/cpu_dma_latency at 0 by default, which keeps CPUs out of deep idle; "
                "compare with it under the same setting (dma_latency_us: 0 in a file, --dma-latency-us 0 on the command line)"
            )
        return None


#: What cyclictest does unless told otherwise (-m, and /dev/cpu_dma_latency held at 0).
AS_CYCLICTEST = TimerParams(mlock=True, dma_latency_us=0)


class SchedParams(Params):
    """Scheduler responsiveness: a thread alternating sleep and work next to busy threads (Paul et al. 2003)."""

    busy_threads: Annotated[int, Field(ge=0, le=64, description="threads spinning next to the measured one")] = 2
    sleep_us: Annotated[int, Field(ge=1, le=10_000_000, description="how long the measured thread sleeps each cycle, µs")] = 1000
    work_us: Annotated[int, Field(ge=1, le=10_000_000, description="how long its burst of work takes alone, µs")] = 1000
    cpu: list[Annotated[int, Field(ge=0)]] | None = Field(None, description="pin the threads to these CPUs (measured thread first)")

    def check_here(self) -> list[str]:
        return cpus_here(self.cpu)


#: every call the syscall probe times (crates/probes/src/syscall.rs names the same; a test ties them)
SYSCALLS = ["getpid", "clock_gettime", "open", "close", "read", "write", "stat", "link", "unlink", "socket", "sendto", "recvfrom", "mmap", "munmap"]


def _syscall(v: object) -> str:
    from loopscope import _native

    try:
        _native.syscall_parse(str(v))
    except ValueError as e:
        raise PydanticCustomError("syscall", "{why}", {"why": str(e)}) from None
    return str(v)


SyscallName = Annotated[
    str,
    BeforeValidator(_syscall),
    WithJsonSchema(
        {
            "type": "string",
            "pattern": "^(" + "|".join(SYSCALLS) + ")(:[0-9]+)?$",
            "description": "a call, with a size in bytes for read, write, sendto, recvfrom (read:4096)",
        }
    ),
]


class SyscallParams(Params):
    """Per-call cost of system calls, in batches until the 95 % CI is within ``target_pct`` (Carlinet et al. 2000)."""

    calls: Annotated[list[SyscallName], Field(min_length=1)] = Field(
        default_factory=lambda: list(SYSCALLS), description="the calls to time; read, write, sendto and recvfrom take a size in bytes (read:4096)"
    )
    batch: Annotated[int, Field(ge=1, le=500, description="calls per timed batch")] = 200
    target_pct: Annotated[
        float,
        Field(gt=0, lt=100, description="stop a call when its 95% CI half-width is within this % of the mean", json_schema_extra={"x-flags": ["--target"]}),
    ] = 5.0
    max_batches: Annotated[int, Field(ge=2, le=1_000_000, description="cap on batches per call")] = 2000
    max_seconds_per_call: Annotated[float, Field(gt=0, le=3600, description="cap on time per call, s", json_schema_extra={"x-flags": ["--max-seconds"]})] = 5.0
    dir: str | None = Field(None, description="where the probe's scratch files go (default: the run's scratch directory, or the system's temporary one)")


#: the loopscope packet header every request carries (crates/probes/src/net/packet.rs)
RR_HEADER = 48


class RrParams(Params):
    """Request/response exchanges with an echo server: round trip, both one-way legs, IPDV."""

    dest: Endpoint = Field(description="HOST:PORT of the echo server (loopscope probe echo)")
    rate: pps("an rr probe's") = Field("1000pps", description="requests per second")  # type: ignore[valid-type]  # an Annotated type a function makes
    transport: Literal["udp", "tcp"] = Field("udp", description="udp: one datagram each way; tcp: one connection, length-framed messages, Nagle off")
    size: Annotated[int, Field(ge=RR_HEADER, le=65000)] = Field(64, description="request bytes (the answer is 72)")


#: an environment variable's name
EnvName = Annotated[str, Field(pattern=r"^[A-Za-z_][A-Za-z0-9_]*$")]


class ProgramParams(Params):
    """Your own program, instrumented with loopscope's trace API (it takes its trace file from LOOPSCOPE_TRACE)."""

    command: Command
    until: Literal["duration", "exit"] = Field(
        "duration", description="duration: stop it (SIGINT) when the probe's time is up; exit: wait until it exits (failing after `timeout`)"
    )
    env: dict[EnvName, str] = Field(default_factory=dict, description="extra environment variables")
    cpu: list[Annotated[int, Field(ge=0)]] | None = Field(None, description="pin it to these CPUs")
    cwd: str | None = Field(None, description="its working directory (default: the experiment file's directory; on ssh hosts the login directory)")
    mlock: bool = Field(
        False, description="lock its memory (mlockall) when it opens its trace, done by loopscope's library; a phase's mlock tuning sets it for that phase"
    )

    def check_here(self) -> list[str]:
        return cpus_here(self.cpu)


def _pattern(v: str) -> str:
    try:
        re.compile(v)
    except re.error as e:
        raise ValueError(f"{v!r} is not a regular expression ({e})") from None
    return v


#: a regular expression, checked when the file is read
Pattern = Annotated[str, AfterValidator(_pattern)]


class Attach(Params):
    """Threads already running on the host: one of a process id, a thread-name pattern or a cgroup."""

    pid: Annotated[int, Field(ge=1)] | None = Field(None, description="a running process: its threads")
    comm: Pattern | None = Field(None, description="every thread whose name matches this regular expression")
    cgroup: str | None = Field(None, description="every thread of this cgroup (a path under /sys/fs/cgroup)")

    @model_validator(mode="after")
    def _one(self) -> Attach:
        if sum(x is not None for x in (self.pid, self.comm, self.cgroup)) != 1:
            raise ValueError("give one of pid, comm or cgroup")
        return self


class ThreadsParams(Params):
    """Any program's threads, measured from the kernel capture: a command started per step, or threads already running."""

    command: Command | None = Field(None, description="a command to start for each step (stopped with SIGINT when the step's time is up)")
    attach: Attach | None = Field(None, description="or threads already running: {pid: N}, {comm: REGEX} or {cgroup: PATH}")
    threads: Pattern | None = Field(None, description="of the target's threads, only those whose name matches this regular expression (default: all)")
    env: dict[EnvName, str] = Field(default_factory=dict, description="extra environment variables of the command")
    cpu: list[Annotated[int, Field(ge=0)]] | None = Field(None, description="pin the command to these CPUs")
    priority: Annotated[int, Field(ge=1, le=99)] | None = Field(None, description="run the command SCHED_FIFO at this priority")
    cwd: str | None = Field(None, description="the command's working directory")

    @model_validator(mode="after")
    def _target(self) -> ThreadsParams:
        if (self.command is None) == (self.attach is None):
            raise ValueError("give either command or attach")
        return self

    def check_here(self) -> list[str]:
        from loopscope.probes.targets import problem

        out = cpus_here(self.cpu)
        if self.attach is not None and (why := problem(self.attach.pid, self.attach.comm, self.attach.cgroup)):
            out.append(why)
        return out


# ---- the lab's helpers: processes a kind starts beside its probe ------------------------


class EchoParams(Params):
    """The echo server an rr probe's client talks to."""

    bind: Bind = Field(description="HOST:PORT to answer on")
    transport: Literal["udp", "tcp"] = Field("udp", description="udp datagrams or tcp connections")


class PipeSourceParams(Params):
    """A pipeline's source: paced messages through the nodes to the sink."""

    dest: Endpoint = Field(description="the first stage's HOST:PORT (a node, or the sink)")
    rate: pps("a pipeline's") = Field("1000pps", description="messages per second")  # type: ignore[valid-type]  # an Annotated type a function makes
    size: Annotated[int, Field(ge=56, le=65000)] = Field(256, description="message bytes; 56 + 24 per node at least")
    flow: Annotated[int, Field(ge=0, le=2**31)] = Field(1, description="the pipeline's id, carried by every message (the sink keeps only its own)")
    count: Annotated[int, Field(ge=1)] | None = Field(None, description="how many messages (default: for the step's duration)")
    linger_ns: Annotated[int, Field(ge=0)] = Field(
        0, description="after the last message, sleep this long before exiting, so the messages in flight arrive undisturbed"
    )


class PipeNodeParams(Params):
    """A pipeline's processing node: receive, work, stamp, forward."""

    bind: Bind = Field(description="HOST:PORT this node listens on")
    next: Endpoint = Field(description="HOST:PORT of the next stage")
    work_us: Annotated[int, Field(ge=0, le=1_000_000)] = Field(0, description="busy work per message, µs")


class PipeSinkParams(Params):
    """A pipeline's sink: records every message of its flow."""

    bind: Bind = Field(description="HOST:PORT the sink listens on")
    flow: Annotated[int, Field(ge=0, le=2**31)] = Field(1, description="the pipeline's id to record")


class SyncServeParams(Params):
    """The reference host's clock-sync responder."""

    bind: Bind = Field(description="HOST:PORT the responder listens on")


class SyncParams(Params):
    """A host's clock-sync initiator: probe pairs to the reference host's responder."""

    dest: Endpoint = Field(description="HOST:PORT of the reference host's responder")
    flow: Annotated[int, Field(ge=0, le=2**31)] = Field(1, description="this host's id in the responder's records")
    rate: Annotated[float, Field(ge=0.01, le=10_000)] = Field(20.0, description="probe pairs per second")
    gap_ns: Annotated[int, Field(ge=0, le=1_000_000_000)] = Field(20_000, description="gap between the two probes of a pair, ns")
