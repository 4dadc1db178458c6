"""The experiment file as data: pydantic models, checked, never executed.

An experiment runs its probes, one after another, in each *phase* (a set of
background loads held for the phase), and repeats the whole sequence
``repetitions`` times, interleaved, so that a drift of the machine hits
every phase alike. By default the phases are an idle baseline followed by
each load alone; ``sweep`` generates loads (kind × level), and ``phases``
lists phases explicitly. Every probe runs for ``duration`` in every phase of
every repetition, after ``warmup`` has let the loads settle.

The models forbid unknown fields, so a typo is an error rather than a
silently ignored setting, and their JSON Schema (``loopscope schema``) lets
editors complete the file.
"""

from __future__ import annotations

import re
import shlex
from typing import Annotated, Any, Literal, Union

from pydantic import BaseModel, BeforeValidator, ConfigDict, Field, PlainSerializer, WithJsonSchema, model_validator
from pydantic_core import PydanticCustomError

from loopscope.units import duration_text, parse_duration_ns

SYSCALLS = [
    "getpid", "clock_gettime", "open", "close", "read", "write", "stat", "link", "unlink", "socket", "sendto", "recvfrom", "mmap", "munmap",
]
NATIVE_LOADS = ["cpu", "memory", "io", "net", "mix"]


def _duration(v: Any) -> int:
    if isinstance(v, bool) or not isinstance(v, (str, int, float)):
        raise PydanticCustomError("duration", "must be a duration like 30s, 500ms or 2m [got {got}]", {"got": v})
    if isinstance(v, (int, float)):
        raise PydanticCustomError("duration", "needs a unit, e.g. {got}s or {got}ms [got {got}]", {"got": v})
    try:
        return parse_duration_ns(v)
    except ValueError as e:
        raise PydanticCustomError("duration", "{why}", {"why": str(e)}) from None


Duration = Annotated[
    int,
    BeforeValidator(_duration),
    PlainSerializer(duration_text, return_type=str),
    WithJsonSchema({"type": "string", "pattern": r"^\s*[0-9]*\.?[0-9]+\s*(ns|us|µs|ms|s|m|min|h)\s*$", "examples": ["30s", "500ms", "2m"]}),
]


def _zero_or_duration(v: Any) -> int:
    if v in (0, "0"):
        return 0
    return _duration(v)


OptDuration = Annotated[
    int,
    BeforeValidator(_zero_or_duration),
    PlainSerializer(lambda ns: duration_text(ns) if ns else "0", return_type=str),
    WithJsonSchema({"type": ["string", "integer"], "description": "a duration like 5s, or 0", "examples": ["5s", 0]}),
]


class Level(BaseModel):
    """How much of a load: a number of processes, or a duty cycle on every CPU."""

    model_config = ConfigDict(frozen=True)
    processes: int | None = None
    percent: float | None = None

    def label(self) -> str:
        if self.percent is not None:
            return f"{self.percent:g}pct"
        return str(self.processes)

    def __str__(self) -> str:
        return f"{self.percent:g}%" if self.percent is not None else f"{self.processes}"


def _level(v: Any) -> Level:
    msg = "must be 1..512 processes or 1..100 % [got {got}]"
    if isinstance(v, Level):
        return v
    if isinstance(v, bool):
        raise PydanticCustomError("level", msg, {"got": v})
    if isinstance(v, int):
        if 1 <= v <= 512:
            return Level(processes=v)
        raise PydanticCustomError("level", msg, {"got": v})
    if isinstance(v, str):
        m = re.fullmatch(r"\s*([0-9]+(?:\.[0-9]+)?)\s*%\s*", v)
        if m and 1 <= float(m.group(1)) <= 100:
            return Level(percent=float(m.group(1)))
        if re.fullmatch(r"\s*[0-9]+\s*", v) and 1 <= int(v) <= 512:
            return Level(processes=int(v))
    raise PydanticCustomError("level", msg, {"got": v})


LevelField = Annotated[
    Level,
    BeforeValidator(_level),
    PlainSerializer(lambda lv: lv.percent and f"{lv.percent:g}%" or lv.processes, return_type=Union[int, str]),
    WithJsonSchema(
        {
            "oneOf": [
                {"type": "integer", "minimum": 1, "maximum": 512, "description": "processes"},
                {"type": "string", "pattern": r"^[0-9]+(\.[0-9]+)?%$", "description": "duty cycle on every CPU, 1..100 %"},
            ]
        }
    ),
]

Name = Annotated[str, Field(pattern=r"^[A-Za-z0-9][A-Za-z0-9._-]{0,63}$", description="letters, digits, . _ - (used in file names)")]


class Model(BaseModel):
    model_config = ConfigDict(extra="forbid", populate_by_name=True)


# ---- probes ----------------------------------------------------------------------


class TimerProbe(Model):
    """Timer wake-up latency on absolute deadlines (cyclictest's measurement)."""

    kind: Literal["timer"]
    name: Name | None = None
    interval_us: Annotated[int, Field(ge=1, le=10_000_000)] = 1000
    threads: Annotated[int, Field(ge=1, le=1024)] = 1
    cpu: list[Annotated[int, Field(ge=0)]] | None = Field(None, description="pin threads to these CPUs, round-robin")
    priority: Annotated[int, Field(ge=1, le=99)] | None = Field(None, description="SCHED_FIFO priority (needs CAP_SYS_NICE)")
    dma_latency_us: Annotated[int, Field(ge=0)] | None = Field(None, description="hold /dev/cpu_dma_latency during the probe, as cyclictest does with 0")
    duration: Duration | None = Field(None, description="this probe's time per phase (default: the experiment's duration)")


class SchedProbe(Model):
    """Scheduler responsiveness: a thread alternating sleep and work next to busy threads (seeds/001)."""

    kind: Literal["sched"]
    name: Name | None = None
    busy_threads: Annotated[int, Field(ge=0, le=64)] = 2
    sleep_us: Annotated[int, Field(ge=1, le=10_000_000)] = 1000
    work_us: Annotated[int, Field(ge=1, le=10_000_000)] = 1000
    cpu: list[Annotated[int, Field(ge=0)]] | None = None
    duration: Duration | None = None


class SyscallProbe(Model):
    """Per-call cost of system calls, in batches until the 95 % CI is within `target` (seeds/004)."""

    kind: Literal["syscall"]
    name: Name | None = None
    calls: list[Literal[tuple(SYSCALLS)]] = Field(default_factory=lambda: list(SYSCALLS))  # type: ignore[valid-type]
    batch: Annotated[int, Field(ge=1, le=500)] = 200
    target_pct: Annotated[float, Field(gt=0, lt=100)] = 5.0
    max_batches: Annotated[int, Field(ge=2, le=1_000_000)] = 2000
    max_seconds_per_call: Annotated[float, Field(gt=0, le=3600)] = 5.0
    dir: str | None = Field(None, description="where the probe's scratch files go (default: the run's scratch directory)")
    duration: Duration | None = Field(None, description="not used: the syscall probe stops when every call has converged or hit its cap")


Probe = Annotated[Union[TimerProbe, SchedProbe, SyscallProbe], Field(discriminator="kind")]


# ---- loads ------------------------------------------------------------------------


class LoadBase(Model):
    name: Name | None = None
    level: LevelField = Field(default_factory=lambda: Level(processes=1))


class CpuLoad(LoadBase):
    """Huffman-code a 5000-byte buffer, again and again (seeds/004's computation load)."""

    kind: Literal["cpu"]


class MemoryLoad(LoadBase):
    """Fill an array of random integers and sort it (seeds/004: 10 M integers)."""

    kind: Literal["memory"]
    count: Annotated[int, Field(ge=1000, le=1_000_000_000)] = 10_000_000


class IoLoad(LoadBase):
    """Copy a 1 MiB file in 100-byte blocks (seeds/004), optionally fsyncing each copy."""

    kind: Literal["io"]
    fsync: bool = False
    dir: str | None = None


def _net_rate(v: Any) -> str:
    from loopscope.units import parse_rate

    if v == "unlimited":
        return v
    try:
        parse_rate(str(v))
    except ValueError as e:
        raise PydanticCustomError("rate", "{why}", {"why": str(e)}) from None
    return str(v)


class NetLoad(LoadBase):
    """A UDP or TCP stream per process (the role of ettcp in seeds/000), to a sink of its own on loopback or to `dest`."""

    kind: Literal["net"]
    protocol: Literal["udp", "tcp"] = "udp"
    rate: Annotated[str, BeforeValidator(_net_rate)] = Field("20Mbit", description="per process: a bit rate (100Mbit), a packet rate (1000pps) or 'unlimited'")
    size: Annotated[int, Field(ge=1, le=1_048_576)] = Field(1400, description="UDP datagram or TCP write size, bytes")
    dest: Annotated[str, Field(pattern=r"^.+:[0-9]{1,5}$")] | None = Field(None, description="HOST:PORT of a sink (default: one of its own on loopback)")


class MixLoad(LoadBase):
    """A build-like mix: compiler-like CPU bursts with small file writes, reads and fsyncs."""

    kind: Literal["mix"]
    dir: str | None = None


def _command(v: Any) -> list[str]:
    if isinstance(v, str):
        try:
            parts = shlex.split(v)
        except ValueError as e:
            raise PydanticCustomError("command", "is not a valid command line: {why}", {"why": str(e)}) from None
    elif isinstance(v, list) and all(isinstance(x, str) for x in v):
        parts = v
    else:
        raise PydanticCustomError("command", "must be a command line or a list of arguments [got {got}]", {"got": v})
    if not parts:
        raise PydanticCustomError("command", "must not be empty", {})
    return parts


class CommandLoad(LoadBase):
    """Any external program (e.g. stress-ng), `level` copies of it."""

    kind: Literal["command"]
    command: Annotated[list[str], BeforeValidator(_command), WithJsonSchema({"oneOf": [{"type": "string"}, {"type": "array", "items": {"type": "string"}}]})]


Load = Annotated[Union[CpuLoad, MemoryLoad, IoLoad, NetLoad, MixLoad, CommandLoad], Field(discriminator="kind")]


class Sweep(Model):
    """Generate loads: every kind at every level (each becomes its own phase)."""

    kind: list[Literal["cpu", "memory", "io", "net", "mix"]] = Field(min_length=1)
    level: list[LevelField] = Field(min_length=1)


class Phase(Model):
    name: Name
    loads: list[str] = Field(default_factory=list, description="names of loads held during this phase")


class Host(Model):
    name: Name = "localhost"
    kind: Literal["local"] = "local"


class Experiment(Model):
    """One experiment: probes × phases (sets of loads) × repetitions."""

    name: Name
    description: str = ""
    hosts: list[Host] = Field(default_factory=lambda: [Host()], min_length=1, max_length=1)
    probes: list[Probe] = Field(min_length=1)
    loads: list[Load] = Field(default_factory=list)
    sweep: Sweep | None = None
    baseline: bool = Field(True, description="add an idle phase named 'baseline' first (when phases are not listed)")
    phases: list[Phase] | None = None
    repetitions: Annotated[int, Field(ge=1, le=1000)] = 1
    order: Literal["interleaved", "shuffled"] = Field("interleaved", description="phase order within each repetition")
    seed: int = 0
    duration: Duration
    warmup: OptDuration = Field(0, description="after the loads of a phase start and before its first probe")
    results: str = Field("runs", description="directory that receives run directories")

    @model_validator(mode="after")
    def _names_and_phases(self) -> "Experiment":
        """Name unnamed loads and probes, generate sweep loads and default
        phases, and check references; all problems are reported together,
        each with the path of the field at fault."""
        problems: list[tuple[tuple[str | int, ...], str]] = []
        loads = list(self.loads)
        if self.sweep is not None:
            for k in self.sweep.kind:
                for lv in self.sweep.level:
                    loads.append(_LOAD_TYPES[k](kind=k, level=lv))
        names: dict[str, int] = {}
        for i, ld in enumerate(loads):
            if ld.name is None:
                ld.name = f"{ld.kind}-{ld.level.label()}"
            if ld.name in names:
                where = ("loads", i, "name") if i < len(self.loads) else ("sweep",)
                problems.append((where, f"load name {ld.name!r} is used twice; give the loads distinct names"))
            names.setdefault(ld.name, i)
        self.loads = loads
        pnames: set[str] = set()
        for i, p in enumerate(self.probes):
            if p.name is None:
                p.name = p.kind if sum(q.kind == p.kind for q in self.probes) == 1 else f"{p.kind}-{i}"
            if p.name in pnames:
                problems.append((("probes", i, "name"), f"probe name {p.name!r} is used twice; give the probes distinct names"))
            pnames.add(p.name)
        if self.phases is None:
            ph = [Phase(name="baseline", loads=[])] if self.baseline else []
            ph += [Phase(name=ld.name, loads=[ld.name]) for ld in loads]  # type: ignore[misc]
            if not ph:
                problems.append((("baseline",), "nothing to run: there are no loads and baseline is false"))
            self.phases = ph
        else:
            seen: set[str] = set()
            for i, phase in enumerate(self.phases):
                if phase.name in seen:
                    problems.append((("phases", i, "name"), f"phase name {phase.name!r} is used twice"))
                seen.add(phase.name)
                for j, ref in enumerate(phase.loads):
                    if ref not in names:
                        problems.append((("phases", i, "loads", j), f"no load named {ref!r}; the loads are {', '.join(names) or '(none)'}"))
        if problems:
            raise PydanticCustomError("spec_references", "{count} problems with names and references", {"count": len(problems), "problems": problems})
        return self

    def load(self, name: str) -> Any:
        return next(ld for ld in self.loads if ld.name == name)


_LOAD_TYPES: dict[str, type[LoadBase]] = {"cpu": CpuLoad, "memory": MemoryLoad, "io": IoLoad, "net": NetLoad, "mix": MixLoad}
