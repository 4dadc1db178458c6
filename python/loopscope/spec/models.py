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
import typing
from typing import Annotated, Any, ClassVar, Literal, Protocol, Union

from pydantic import BeforeValidator, Field, WithJsonSchema, create_model, model_validator
from pydantic_core import PydanticCustomError

from loopscope.fields import Command as Command, pps as pps  # re-exported for the kinds
from loopscope.spec.hostkinds import DECLARED
from loopscope.spec.hostkinds import REMOTE as _REMOTE
from loopscope.units import parse_bytes
from loopscope.units import parse_rate

from loopscope.spec.values import (
    CpuList as CpuList,
    Duration as Duration,
    OptDuration as OptDuration,
    Level as Level,
    LevelField as LevelField,
    Name as Name,
    Model as Model,
)
from loopscope.spec.tunings import (
    AffinityTuning as AffinityTuning,
    SchedTuning as SchedTuning,
    LimitTuning as LimitTuning,
    IrqTuning as IrqTuning,
    DmaLatencyTuning as DmaLatencyTuning,
    CpuidleTuning as CpuidleTuning,
    MlockTuning as MlockTuning,
    WriteTuning as WriteTuning,
    IsolateTuning as IsolateTuning,
    Tuning as Tuning,
)
from loopscope.spec.settings import (
    SignedDuration as SignedDuration,
    VirtualClock as VirtualClock,
    ClockSync as ClockSync,
    EmulatorSettings as EmulatorSettings,
    Size as Size,
    MIN_RETAIN as MIN_RETAIN,
    MonitorSettings as MonitorSettings,
    KernelCapture as KernelCapture,
)

NATIVE_LOADS = ["cpu", "memory", "io", "net", "mix"]


# ---- probes ----------------------------------------------------------------------
#
# Each probe kind's model lives with the rest of that kind (loopscope.kinds):
# the experiment model a file is read with is built from the registry's models
# (``experiment_model``), its ``probes`` their union on ``kind``.


class ProbeModel(Model):
    """What every probe kind's model has and answers: its name, the hosts
    it names (for checking references) and runs on, and its time per phase."""

    kind: str
    name: Name | None = None
    uses_channels: ClassVar[bool] = False
    #: its parts on different hosts talk to each other over the network
    talks_across_hosts: ClassVar[bool] = False

    @property
    def label(self) -> str:
        """Its name: given, or made from its kind when the experiment was read."""
        return self.name or self.kind

    def host_refs(self) -> list[tuple[tuple[str | int, ...], str | None]]:
        """(field path within the probe, host name) for every host it names."""
        refs: list[tuple[tuple[str | int, ...], str | None]] = [(("host",), getattr(self, "host", None))]
        for k, arg in enumerate(getattr(self, "command", None) or []):
            refs += [(("command", k), n) for n in re.findall(HOST_REF, arg)]
        return refs

    def hosts(self, first: str) -> list[str]:
        """The hosts it runs on (``first``: the experiment's first host)."""
        return [getattr(self, "host", None) or first]

    def seconds(self, default_ns: int) -> float:
        """Its time in one phase."""
        return (getattr(self, "duration", None) or default_ns) / 1e9


HOST_REF = r"\{host:([A-Za-z0-9][A-Za-z0-9._-]{0,63})\}"
#: host kinds whose agent runs elsewhere (its files come back at the end; this controller cannot signal it)
REMOTE = _REMOTE  # the kinds whose agents run elsewhere (spec/hostkinds.py)


# ---- loads ------------------------------------------------------------------------


class LoadBase(Model):
    name: Name | None = None
    level: LevelField = Field(default_factory=lambda: Level(processes=1))
    host: Name | None = Field(None, description="the host it runs on (default: the first host)")


class CpuLoad(LoadBase):
    """Huffman-code a 5000-byte buffer, again and again (Carlinet et al. 2000's computation load)."""

    kind: Literal["cpu"]


class MemoryLoad(LoadBase):
    """Fill an array of random integers and sort it (Carlinet et al. 2000: 10 M integers)."""

    kind: Literal["memory"]
    count: Annotated[int, Field(ge=1000, le=1_000_000_000)] = 10_000_000


class IoLoad(LoadBase):
    """Copy a 1 MiB file in 100-byte blocks (Carlinet et al. 2000), optionally fsyncing each copy."""

    kind: Literal["io"]
    fsync: bool = False
    dir: str | None = None


def _net_rate(v: object) -> str:

    if v == "unlimited":
        return "unlimited"
    try:
        parse_rate(str(v))
    except ValueError as e:
        raise PydanticCustomError("rate", "{why}", {"why": str(e)}) from None
    return str(v)


class NetLoad(LoadBase):
    """A UDP or TCP stream per process (the role of ettcp in Boie & Niehaus 2007), to a sink of its own on loopback or to `dest`."""

    kind: Literal["net"]
    protocol: Literal["udp", "tcp"] = "udp"
    rate: Annotated[str, BeforeValidator(_net_rate)] = Field("20Mbit", description="per process: a bit rate (100Mbit), a packet rate (1000pps) or 'unlimited'")
    size: Annotated[int, Field(ge=1, le=1_048_576)] = Field(1400, description="UDP datagram or TCP write size, bytes")
    dest: Annotated[str, Field(pattern=r"^.+:[0-9]{1,5}$")] | None = Field(None, description="HOST:PORT of a sink (default: one of its own on loopback)")


class MixLoad(LoadBase):
    """A build-like mix: compiler-like CPU bursts with small file writes, reads and fsyncs."""

    kind: Literal["mix"]
    dir: str | None = None


class CommandLoad(LoadBase):
    """Any external program (e.g. stress-ng), `level` copies of it."""

    kind: Literal["command"]
    command: Command


Load = Annotated[Union[CpuLoad, MemoryLoad, IoLoad, NetLoad, MixLoad, CommandLoad], Field(discriminator="kind")]


class Sweep(Model):
    """Generate loads: every kind at every level (each becomes its own phase)."""

    kind: list[Literal["cpu", "memory", "io", "net", "mix"]] = Field(min_length=1)
    level: list[LevelField] = Field(min_length=1)


class Phase(Model):
    name: Name
    loads: list[str] = Field(default_factory=list, description="names of loads held during this phase")
    tunings: list[Tuning] = Field(default_factory=list, description="settings applied when the phase starts and restored when it ends (docs/experiments.md)")
    links: list["Link"] = Field(
        default_factory=list,
        description="links that change in this phase: each replaces the experiment's link on the same path (between/from-to) for the phase",
    )
    compare_with: Name | None = Field(
        None, description="the phase this one is compared with (default: the baseline phase); a remedy phase names the phase it remedies"
    )


class Host(Model):
    """A machine of the experiment: a network namespace on this machine (netns, the default with
    root), a real machine reached over ssh, a machine or container reached through a launcher
    fleets already run (exec: srun, kubectl exec, docker exec, ip netns exec, ssh), or processes on
    loopback (local)."""

    name: Name = "localhost"
    kind: Literal["auto", "netns", "ssh", "exec", "local"] = Field("auto", description="auto: netns with root or CAP_NET_ADMIN, else local (spec/hostkinds.py)")
    address: str | None = Field(
        None,
        description="ssh: the machine to connect to; exec: the address its network probes and clock sync use (required); netns: the host's IPv4 address (default 10.77.<i>.2); local: a loopback address (default 127.0.<i>.1)",
    )
    launcher: list[str] | None = Field(
        None,
        min_length=1,
        description="exec: the command that runs a process on the host with its standard input and output (e.g. [srun, --nodelist=n1, --ntasks=1], [kubectl, exec, -i, POD, --]); the agent's command is appended",
    )
    clock_offset: SignedDuration = Field(0, description="netns: shift this host's CLOCK_MONOTONIC (a time namespace), e.g. 2.5s")
    user: str | None = Field(None, description="ssh: login name (default: yours)")
    port: Annotated[int, Field(ge=1, le=65535)] = Field(22, description="ssh: port")
    identity: str | None = Field(None, description="ssh: private key file (default: the ssh agent and ~/.ssh/id_*)")
    known_hosts: str | None = Field(None, description="ssh: known_hosts file the host key is checked against (default ~/.ssh/known_hosts)")
    python: str | None = Field(
        None,
        description="ssh, exec: the host's interpreter that has loopscope (default: the one `loopscope hosts install` put in install_dir, else this controller's own interpreter's path)",
    )
    install_dir: str = Field(
        "~/.local/share/loopscope",
        description="ssh, exec: where `loopscope hosts install` puts loopscope on the host (one directory per version; ~ is the host's home)",
    )
    system_python: str = Field("python3", description="ssh, exec: the host's own Python 3, which `loopscope hosts install` builds loopscope's environment from")
    workdir: str = Field("/tmp/loopscope-runs", description="ssh, exec: where the remote agent writes before its files come back")
    virtual_clock: VirtualClock | None = Field(None, description="test only: skew this host's timestamps to validate clock synchronization")
    sync_address: str | None = Field(
        None,
        description="ssh, exec: the address the clock-sync probes reach this host at when it is the reference (an interface off the experiment's network); netns hosts get a sync network of their own",
    )

    @property
    def remote(self) -> bool:
        """Reached through ssh or a launcher: its files are written there and come back at the end."""
        return DECLARED[self.kind].remote


def _percent(v: object) -> float:
    msg = "must be a percentage 0..100, like 1% or 0.5 [got {got}]"
    if isinstance(v, bool):
        raise PydanticCustomError("percent", msg, {"got": v})
    if isinstance(v, str):
        t = v.strip().rstrip("%").strip()
        try:
            x = float(t)
        except ValueError:
            raise PydanticCustomError("percent", msg, {"got": v}) from None
    elif isinstance(v, (int, float)):
        x = float(v)
    else:
        raise PydanticCustomError("percent", msg, {"got": v})
    if not 0 <= x <= 100:
        raise PydanticCustomError("percent", msg, {"got": v})
    return x


Percent = Annotated[float, BeforeValidator(_percent), WithJsonSchema({"type": ["string", "number"], "description": "percent, 0..100 (1% or 1)"})]


def _bit_rate(v: object) -> str | None:
    if v is None:
        return None

    try:
        _, kind = parse_rate(str(v))
    except ValueError as e:
        raise PydanticCustomError("rate", "{why}", {"why": str(e)}) from None
    if kind != "bps":
        raise PydanticCustomError("rate", "a link's rate is a bit rate like 100Mbit [got {got}]", {"got": v})
    return str(v)


class Link(Model):
    """What the network does to packets between two hosts (netem's semantics, applied by netem or
    by loopscope's emulator in the router namespace)."""

    between: list[Name] | None = Field(None, min_length=2, max_length=2, description="two hosts: the link applies in both directions")
    from_: Name | None = Field(None, alias="from", description="one direction only: from this host…")
    to: Name | None = Field(None, description="…to this host")
    delay: OptDuration = Field(0, description="one-way delay, e.g. 2ms")
    jitter: OptDuration = Field(0, description="spread added to the delay")
    distribution: Literal["normal", "uniform", "pareto"] = Field(
        "normal", description="jitter's shape: normal (sd = jitter), uniform (±jitter), pareto (shape 3, sd = jitter)"
    )
    loss: Percent = 0.0
    duplicate: Percent = 0.0
    reorder: Percent = Field(0.0, description="this share of packets skips the delay and overtakes the others")
    rate: Annotated[str | None, BeforeValidator(_bit_rate)] = Field(None, description="link bit rate, e.g. 100Mbit (packets queue behind each other)")
    limit: Annotated[int, Field(ge=1, le=1_000_000)] = Field(1000, description="packets that may wait on the link; more are dropped")

    @model_validator(mode="after")
    def _ends(self) -> "Link":
        if (self.between is None) == (self.from_ is None or self.to is None):
            if self.between is None:
                raise PydanticCustomError("link_ends", "give `between: [a, b]` or both `from` and `to`", {})
            raise PydanticCustomError("link_ends", "give either `between` or `from`/`to`, not both", {})
        return self

    def directions(self) -> list[tuple[str, str]]:
        if self.between is not None:
            a, b = self.between
            return [(a, b), (b, a)]
        return [(self.from_ or "", self.to or "")]


Phase.model_rebuild()


def _size(v: object) -> int:

    try:
        return parse_bytes(v if isinstance(v, (str, int)) else str(v))
    except ValueError as e:
        raise PydanticCustomError("size", "{why}", {"why": str(e)}) from None


class ChannelDecl(Model):
    """A channel the lab hosts for the run: a hub process on ``host`` serves
    it; every program and app process finds it by name
    (``loopscope.channels.producer("frames")``) through LOOPSCOPE_CHANNELS."""

    name: Name
    host: Name | None = Field(None, description="the host whose hub holds it (default: the first host)")
    transport: Literal["tcp", "udp"] = Field(
        "tcp", description="how items reach it and leave it: tcp (reliable) or udp (fragmented into datagrams; a lost fragment loses the item, counted)"
    )
    capacity: Annotated[int, Field(ge=1, le=1_000_000)] = Field(64, description="items it holds at most")
    full: Literal["block", "drop-oldest"] = Field("block", description="when full: a put waits (with its timeout), or the oldest item goes (counted)")
    max_item: Annotated[
        int,
        BeforeValidator(_size),
        Field(ge=1, le=256 << 20),
        WithJsonSchema({"oneOf": [{"type": "integer", "minimum": 1}, {"type": "string", "pattern": r"^\s*[0-9]*\.?[0-9]+\s*([kKMG]i?B|B)?\s*$"}]}),
    ] = Field(16 << 20, description="largest item, e.g. 2MiB; a larger one is refused and counted")


class Experiment(Model):
    """One experiment: probes × phases (sets of loads) × repetitions."""

    name: Name
    description: str = ""
    hosts: list[Host] = Field(default_factory=lambda: [Host(kind="local")], min_length=1, max_length=250)
    links: list[Link] = Field(default_factory=list)
    channels: list[ChannelDecl] = Field(
        default_factory=list, description="channels the lab hosts for the programs and apps (one hub process per host that holds any)"
    )
    channel_port: Annotated[int, Field(ge=1024, le=65535)] = Field(47600, description="TCP and UDP port of the hubs")
    clocksync: ClockSync = Field(default_factory=ClockSync)
    kernel: KernelCapture = Field(default_factory=KernelCapture)
    emulator: EmulatorSettings = Field(default_factory=EmulatorSettings)
    #: ProbeModel here; the model ``experiment_model`` builds makes it the kinds' union
    probes: list[ProbeModel] = Field(min_length=1)
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
    monitor: MonitorSettings | None = Field(None, description="a monitor file (loopscope monitor): no duration, phases or repetitions needed")
    on_host_failure: Literal["stop", "continue"] = Field(
        "stop",
        description="a host lost mid-run (its agent or launcher gone): stop the run cleanly, exit 1; or continue with the other hosts, mark the lost host's steps, exit 0 naming it",
    )

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
                    loads.append(_LOAD_TYPES[k](kind=k, level=lv))  # type: ignore[call-arg, arg-type]
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
        if self.monitor is not None and self.phases is None:
            self.phases = [Phase(name="monitor", loads=[str(ld.name) for ld in loads])]
        elif self.monitor is not None and len(self.phases or []) > 1:
            problems.append((("phases",), f"a monitor runs one phase (its loads held throughout) [got {len(self.phases or [])}]"))
        if self.phases is None:
            ph = [Phase(name="baseline", loads=[])] if self.baseline else []
            ph += [Phase(name=str(ld.name), loads=[str(ld.name)]) for ld in loads]  # names are set above
            if not ph:
                problems.append((("baseline",), "nothing to run: there are no loads and baseline is false"))
            self.phases = ph
        else:
            seen: set[str] = set()
            for i, phase in enumerate(self.phases):
                if phase.name in seen:
                    problems.append((("phases", i, "name"), f"phase name {phase.name!r} is used twice"))
                seen.add(phase.name)
                if phase.compare_with is not None and phase.compare_with not in {p.name for p in self.phases}:
                    problems.append(
                        (("phases", i, "compare_with"), f"no phase named {phase.compare_with!r}; the phases are {', '.join(p.name for p in self.phases)}")
                    )
                for j, ref in enumerate(phase.loads):
                    if ref not in names:
                        problems.append((("phases", i, "loads", j), f"no load named {ref!r}; the loads are {', '.join(names) or '(none)'}"))
                problems += self._check_tunings(i, phase, pnames)
        problems += self._check_hosts()
        if problems:
            raise PydanticCustomError("spec_references", "{count} problems with names and references", {"count": len(problems), "problems": problems})
        return self

    def _check_tunings(self, i: int, phase: "Phase", probes: set[str]) -> list[tuple[tuple[str | int, ...], str]]:
        """A tuning's probe or load exists (the load in this phase) and can take it."""
        problems: list[tuple[tuple[str | int, ...], str]] = []
        kept = {c for t in phase.tunings if isinstance(t, IsolateTuning) for c in t.cpus}
        for j, t in enumerate(phase.tunings):
            where = ("phases", i, "tunings", j)
            if isinstance(t, AffinityTuning) and t.load is not None and kept & set(t.cpus):
                problems.append(
                    (
                        where + ("cpus",),
                        f"load {t.load!r} is pinned to CPU {','.join(map(str, sorted(kept & set(t.cpus))))}, which the phase isolates for its probes; pin it to the other CPUs or isolate fewer",
                    )
                )
            if isinstance(t, MlockTuning):
                q = next((q for q in self.probes if q.name == t.probe), None)
                if q is None:
                    problems.append((where + ("probe",), f"no probe named {t.probe!r}; the probes are {', '.join(sorted(probes))}"))
                elif "mlock" not in type(q).model_fields:
                    problems.append((where + ("probe",), f"a {q.kind} probe takes no mlock (timer and program probes do)"))
                continue
            if isinstance(t, LimitTuning) and t.load not in phase.loads:
                problems.append((where + ("load",), f"no load {t.load!r} in phase {phase.name!r}; its loads are {', '.join(phase.loads) or '(none)'}"))
            if not isinstance(t, (AffinityTuning, SchedTuning)):
                continue
            if t.load is not None and t.load not in phase.loads:
                problems.append((where + ("load",), f"no load {t.load!r} in phase {phase.name!r}; its loads are {', '.join(phase.loads) or '(none)'}"))
            if t.probe is not None:
                p = next((q for q in self.probes if q.name == t.probe), None)
                if p is None:
                    problems.append((where + ("probe",), f"no probe named {t.probe!r}; the probes are {', '.join(sorted(probes))}"))
                elif isinstance(t, AffinityTuning) and "cpu" not in type(p).model_fields:
                    problems.append((where + ("probe",), f"a {p.kind} probe takes no CPU placement; place its hosts' loads instead"))
                elif isinstance(t, SchedTuning) and ("priority" not in type(p).model_fields or t.policy != "fifo"):
                    problems.append(
                        (where + ("probe",), f"a {p.kind} probe takes no scheduling tuning (only the timer's SCHED_FIFO priority); tune a load instead")
                    )
                elif isinstance(t, SchedTuning) and t.priority is None:
                    problems.append((where + ("priority",), "a fifo probe needs a priority 1..99"))
        return problems

    def _check_hosts(self) -> list[tuple[tuple[str | int, ...], str]]:
        """Host names, addresses and every reference to a host."""
        problems: list[tuple[tuple[str | int, ...], str]] = []
        hosts: dict[str, int] = {}
        for i, h in enumerate(self.hosts):
            if h.name in hosts:
                problems.append((("hosts", i, "name"), f"host name {h.name!r} is used twice"))
            hosts.setdefault(h.name, i)
        known = ", ".join(hosts)
        addrs: dict[str, str] = {}
        for i, h in enumerate(self.hosts):
            d = DECLARED[h.kind]
            problems += d.problems(i, h)
            key = d.address_key(h)
            if key is not None:
                if key in addrs:
                    problems.append((("hosts", i, "address"), f"address {h.address} clashes with host {addrs[key]!r}; give each host its own"))
                addrs.setdefault(key, h.name)

        def ref(where: tuple[str | int, ...], name: str | None) -> None:
            if name is not None and name not in hosts:
                problems.append((where, f"no host named {name!r}; the hosts are {known}"))

        ref(("clocksync", "reference"), self.clocksync.reference)
        for i, p in enumerate(self.probes):
            for where, name in p.host_refs():
                ref(("probes", i, *where), name)
        for i, ld in enumerate(self.loads):
            if i < len(self.loads):
                ref(("loads", i, "host"), ld.host)
        cnames: set[str] = set()
        for i, c in enumerate(self.channels):
            ref(("channels", i, "host"), c.host)
            if c.name in cnames:
                problems.append((("channels", i, "name"), f"channel name {c.name!r} is used twice"))
            cnames.add(c.name)
        if self.channels and not any(p.uses_channels for p in self.probes):
            problems.append((("channels",), "channels are for program and app probes, and there is none; add one or remove the channels"))
        pairs: dict[tuple[str, str], int] = {}
        for i, link in enumerate(self.links):
            ends: list[str | None] = list(link.between or []) or [link.from_, link.to]
            for end in ends:
                if end is not None and end not in hosts:
                    problems.append((("links", i), f"link to a host that does not exist: {end!r}; the hosts are {known}"))
            for a, b in link.directions():
                if a == b:
                    problems.append((("links", i), f"a link joins two different hosts [got {a!r} twice]"))
                elif (a, b) in pairs:
                    problems.append((("links", i), f"the path {a} -> {b} is already set by links.{pairs[(a, b)]}"))
                pairs.setdefault((a, b), i)
        for i, phase in enumerate(self.phases or []):
            for j, link in enumerate(phase.links):
                dirs = link.directions()
                homes = {pairs.get(d) for d in dirs}
                if None in homes:
                    problems.append(
                        (
                            ("phases", i, "links", j),
                            f"phase {phase.name!r} changes the path {' and '.join(f'{a} -> {b}' for a, b in dirs if (a, b) not in pairs)}, which no link of the experiment sets; add it to `links` first",
                        )
                    )
                elif len(homes) > 1 or set(self.links[typing.cast(int, homes.pop())].directions()) != set(dirs):
                    problems.append(
                        (
                            ("phases", i, "links", j),
                            f"phase {phase.name!r}: give the same ends as the experiment's link (between or from/to) so it replaces that link whole",
                        )
                    )
        return problems

    def load(self, name: str) -> Any:
        return next(ld for ld in self.loads if ld.name == name)

    def host(self, name: str | None) -> Host:
        """A host by name (None: the first host)."""
        if name is None:
            return self.hosts[0]
        return next(h for h in self.hosts if h.name == name)

    def wants_clocksync(self) -> bool:
        """Whether the run synchronizes its hosts' clocks: asked for, or left to ``auto`` with more than one host."""
        cs = self.clocksync
        return cs.enabled == "on" or (cs.enabled == "auto" and len(self.hosts) > 1)

    def hosts_of(self, probe: ProbeModel) -> list[str]:
        return list(probe.hosts(self.hosts[0].name))


class HasModels(Protocol):
    """What reading an experiment needs of the kind registry: its kinds' models."""

    def models(self) -> list[type[ProbeModel]]: ...


_BUILT: dict[tuple[type[ProbeModel], ...], type[Experiment]] = {}


def experiment_model(kinds: HasModels) -> type[Experiment]:
    """The experiment model whose ``probes`` are ``kinds``' models (each with
    a ``kind: Literal[...]`` field), told apart by ``kind``; built once per
    set of models. Every reader of an experiment file is handed the registry
    and asks for this: nothing depends on an import having happened first."""
    key = tuple(kinds.models())
    got = _BUILT.get(key)
    if got is None:
        if not key:
            raise ValueError("no probe kinds: an experiment needs a registry with at least one kind")
        union = Annotated[Union[key], Field(discriminator="kind")]  # type: ignore[valid-type]
        got = create_model("Experiment", __base__=Experiment, __module__=__name__, probes=(list[union], Field(min_length=1)))
        _BUILT[key] = got
        _KIND_NAMES[got] = [typing.get_args(m.model_fields["kind"].annotation)[0] for m in key]
    return got


_KIND_NAMES: dict[type[Experiment], list[str]] = {}


def probe_kinds(model: type[Experiment]) -> list[str]:
    """The probe kinds an experiment model takes (none for the bare ``Experiment``)."""
    return list(_KIND_NAMES.get(model, []))


_LOAD_TYPES: dict[str, type[LoadBase]] = {"cpu": CpuLoad, "memory": MemoryLoad, "io": IoLoad, "net": NetLoad, "mix": MixLoad}
