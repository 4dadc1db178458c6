"""What a probe kind is: one object that knows everything about its kind.

A kind has its experiment-file model (a ``ProbeModel`` with ``kind:
Literal[...]``), the command line an agent starts for it, how the
controller runs one step of it (default: one process on its host), the rows
its trace adds to the run's tables, the measures compared across phases,
and its section of the report. The agent, the controller, the spec and the
report look kinds up in ``loopscope.kinds.KINDS`` instead of branching on
the kind's name; the report is handed the registry (it sits below the
kinds in the layers), so imports keep pointing down.

Helper processes that are not probes of their own (a pipeline's stages, an
rr probe's echo server, the clock-sync probes) are ``helpers``: command
lines an agent can start by name.
"""

from __future__ import annotations

import sys
from dataclasses import dataclass, field
from pathlib import Path
from contextlib import AbstractContextManager
from typing import Any, Callable, Generic, Iterator, Protocol, TypeVar

import polars as pl
from pydantic import ValidationError

from loopscope.analysis.phases import Measure
from loopscope.analysis.registry import Columns, Section, Tables
from loopscope.analysis.inputs import SectionInputs
from loopscope.analysis.steps import Part
from loopscope.errors import InputError
from loopscope.probes.params import Launch, Params
from loopscope.rundir import HubStep, RunRecord, Step
from loopscope.spec.models import Experiment, ProbeModel
from loopscope.analysis.windows import WINDOWS as WINDOWS, no_windows as no_windows  # re-exported for the kinds
import numpy as np


def cli(kind: str) -> list[str]:
    """The start of a command line that runs ``loopscope probe KIND``."""
    return [sys.executable, "-m", "loopscope.cli", "probe", kind]


def launch_of(
    kind: str,
    model: type[Params],
    p: dict[str, object],
    duration_ns: int,
    trace: Path | None,
    scratch: Path,
    calibrate: bool = False,
    calibration: dict[str, int] | None = None,
) -> Launch:
    """The ``Launch`` of a spec (a probe's dump, or a helper's): its model's fields, validated by it."""
    try:
        params = model.model_validate({k: v for k, v in p.items() if k in model.model_fields})
    except ValidationError as e:  # a request the caller made wrong: said as an input error naming the field, never a crash
        err = e.errors()[0]
        raise InputError(f"{kind} {p.get('name') or ''}: {'.'.join(str(x) for x in err['loc'])}: {err['msg']}") from None
    return Launch(
        kind=kind,
        params=params.model_dump(mode="json"),
        duration_ns=duration_ns,
        trace=None if trace is None else str(trace),
        scratch=str(scratch),
        calibrate=calibrate,
        calibration=calibration or {},
    )


def launch_argv(launch: Launch) -> list[str]:
    """The command line that runs a probe from its ``Launch`` (one JSON argument, the model's dump):
    ``probes/launch.py`` on its own (``loopscope probe launch`` is the same without the command line's imports)."""
    return [sys.executable, "-m", "loopscope.probes.launch", launch.model_dump_json()]


#: adds a step's columns (rep, phase, loads, probe) to a frame of its rows
Tag = Callable[[pl.DataFrame], pl.DataFrame]


class RunFiles(Protocol):
    """A run directory's files, for a kind building its rows."""

    run: RunRecord

    @property
    def run_dir(self) -> Path: ...

    def kernel(self, host: str) -> Any:
        """The kernel capture covering ``host`` (a ``kernel.store.Store``, opened once); None without one."""
        ...

    def trace(self, rel: str) -> pl.DataFrame | None:
        """A trace of the run (read once, shared); None when it is missing."""
        ...

    def json(self, rel: str) -> dict[str, object]:
        """A probe's result (the last line of its JSON file); {} when missing."""
        ...

    def place(self, host_a: np.ndarray, rt_a: np.ndarray, host_b: np.ndarray, rt_b: np.ndarray, base: int = 0) -> tuple[np.ndarray, np.ndarray]:
        """``rt_b`` on ``host_b`` minus ``rt_a`` on ``host_a`` (CLOCK_REALTIME
        arrays less ``base``) on the run's global clock, and its bound."""
        ...


@dataclass(frozen=True)
class HostView:
    """What a kind may know of a lab host: where its parts listen."""

    name: str
    #: the address others reach it at (None: this machine's loopback)
    address: str | None
    #: reached over ssh (it binds 0.0.0.0, its files are fetched)
    remote: bool

    def bind(self, port: int) -> str:
        """HOST:PORT a server of a step binds on this host."""
        return f"{'0.0.0.0' if self.remote else self.address}:{port}"

    def at(self, port: int) -> str:
        """HOST:PORT others reach that server at."""
        return f"{self.address}:{port}"


@dataclass
class Collected:
    """A process a step started, once stopped: its files (relative to the
    run directory), its command, what it cost, and its JSON result."""

    name: str
    host: str
    trace: str
    json: str
    command: str
    cpu_usec: int | None
    spawn_mono_ns: int | None
    end_mono_ns: int | None
    result: dict[str, object]


#: what a step starts through an agent: a probe's or a helper's spec, its ``kind`` and unique ``name`` first
HelperSpec = dict[str, Any]


class Helpers(Protocol):
    """The processes one step starts beside (or as) its probe: an echo
    server, a pipeline's stages, an app's processes. Whatever is still
    running when the step leaves ``StepContext.helpers`` is stopped there,
    on every way out, without hiding the first failure."""

    def start(self, host: str, spec: HelperSpec, *, duration_ns: int | None = None, wait_ready: bool = False) -> None:
        """Start ``spec`` (a probe or helper spec with a unique ``name``) on ``host``."""
        ...

    def start_each(self, starts: list[tuple[str, HelperSpec]], *, wait_ready: bool = False) -> None:
        """Start several that wait for nothing of each other's at once: (host, spec) each, in that order."""
        ...

    def stop(self, host: str, name: str) -> Collected:
        """Stop one (it ends as its kind ends: SIGINT, or it has exited) and collect it."""
        ...

    def running(self) -> list[tuple[str, str]]:
        """(host, name) of those started and not stopped, in start order."""
        ...


class StepContext(Protocol):
    """What the controller hands a kind to run one step. A kind sees the
    lab only through it: hosts as ``HostView``, processes through
    ``helpers`` and ``run_one``, never an agent."""

    exp: Experiment
    run_id: str
    hosts: dict[str, HostView]
    calibration: dict[str, dict[str, int]]

    @property
    def first_host(self) -> str:
        """The experiment's first host (where parts without one run)."""
        ...

    def run_one(self, probe: ProbeModel, spec: dict[str, object], key: str, dur_ns: int) -> dict[str, object]:
        """Run ``spec`` as one process on the probe's host; the step's record."""
        ...

    def calibrate(self, probe: ProbeModel) -> dict[str, Any]:
        """Run the probe once on the idle machine in calibration mode; its JSON result."""
        ...

    def helpers(self, key: str) -> AbstractContextManager[Helpers]:
        """Processes of step ``key``, stopped on the way out."""
        ...

    def check(self) -> None:
        """Raise if a lab component (an agent, the emulator) failed meanwhile."""
        ...

    def sleep(self, seconds: float) -> None: ...

    def window(self, watch: dict[str, list[str]], until: tuple[str, str] | None, timeout_s: float) -> tuple[bool, list[tuple[str, str]]]:
        """Sleep while the probes ``watch`` (host → names) measure, until the
        probe ``until`` (host, name) exits or ``timeout_s`` passes, with no
        lab component awake; a failure meanwhile raises at once. Whether
        ``until`` ended, and the watched probes that exited cleanly."""
        ...

    def with_hosts(self, command: list[str]) -> list[str]:
        """``{host:NAME}`` in a command, replaced by that host's address."""
        ...

    def channel_env(self, host: str, key: str, name: str) -> dict[str, str]:
        """The environment that connects a program to the lab's channels (empty without channels)."""
        ...

    def channel_stats(self, host: str, key: str, name: str) -> str | None:
        """Where a program's channel statistics go, relative to the run (None without channels)."""
        ...

    def hubs_start(self, probe: str, key: str, dur_ns: int) -> list[Any]: ...

    def hubs_check(self, running: list[Any]) -> None: ...

    def hubs_stop(self, running: list[Any], quiet: bool = False) -> list[HubStep]: ...

    def failure(self, what: str, host: str, component: str) -> Exception:
        """The exception that stops the run naming a failed component."""
        ...


class WindowSource(Protocol):
    """What a kind reads to hand explain its windows (``analysis.explain.RunSource``)."""

    run_dir: Path
    run: RunRecord
    spec: dict[str, Any]

    def trace(self, rel: str) -> pl.DataFrame | None:
        """A trace of the run as a table (None: missing)."""
        ...

    def trace_info(self, rel: str) -> tuple[pl.DataFrame, Any] | None:
        """A trace and its metadata (calibration pairs), or None."""
        ...

    def host_of(self, step: Step) -> str:
        """The host a step ran on (its ``host``, else the run's first)."""
        ...

    def same_kernel(self, a: str, b: str) -> bool:
        """Whether two hosts run on one kernel (one capture covers both)."""
        ...


def wait_windows(step: Step, src: WindowSource, trace_rel: str, krx_rt: np.ndarray, urx_rt: np.ndarray, tid: int, host: str, label: str) -> pl.DataFrame:
    """Kernel-to-application waits of one receiving thread: a message was in
    the host's kernel at ``krx_rt`` and the thread read it at ``urx_rt``
    (CLOCK_REALTIME ns arrays), moved to the host's CLOCK_MONOTONIC by the
    calibration pairs of ``trace_rel`` (a trace written on that host)."""

    from loopscope.clock.sync import Pairs

    got = src.trace_info(trace_rel)
    if got is None:
        return no_windows()
    pairs = Pairs.of(got[1].calibration)
    if not len(pairs.mono):
        return no_windows()
    a, _ = pairs.mono_of(np.asarray(krx_rt, dtype=np.int64))
    b, _ = pairs.mono_of(np.asarray(urx_rt, dtype=np.int64))
    n = len(a)
    return (
        pl.DataFrame(
            {
                "rep": [step.rep] * n,
                "phase": [step.phase] * n,
                "probe": [label] * n,
                "host": [host] * n,
                "tid": [tid] * n,
                "t_ns": a,
                "latency_ns": b - a,
                "span": [False] * n,
            }
        )
        .cast(WINDOWS)  # type: ignore[arg-type]
        .filter(pl.col("latency_ns") > 0)
    )


def interval_windows(step: Step, src: WindowSource, group: str, names: list[str] | None, span: bool, label: str | None = None) -> pl.DataFrame:
    """The step's own intervals of ``group`` (``names``: only these; None:
    all) as windows of the threads that logged them, named ``label`` (default
    the probe's name; ``"{name}"`` puts each interval's name in)."""
    df = src.trace(step.trace) if step.trace else None
    if df is None or not len(df):
        return no_windows()
    iv = df.filter((pl.col("kind").cast(pl.String) == "interval") & (pl.col("group").cast(pl.String) == group) & (pl.col("dur_ns") > 0))
    if names is not None:
        iv = iv.filter(pl.col("name").cast(pl.String).is_in(names))
    name = (
        pl.lit(step.probe)
        if label is None
        else pl.lit(label.split("{name}")[0]) + pl.col("name").cast(pl.String) + pl.lit(label.split("{name}")[-1] if "{name}" in label else "")
    )
    return iv.select(
        pl.lit(step.rep).alias("rep"),
        pl.lit(step.phase).alias("phase"),
        name.alias("probe"),
        pl.lit(src.host_of(step)).alias("host"),
        pl.col("tid"),
        "t_ns",
        pl.col("dur_ns").alias("latency_ns"),
        pl.lit(span).alias("span"),
    ).cast(WINDOWS)  # type: ignore[arg-type]


@dataclass
class StepRows:
    """What one step adds to the run's tables: frames per table (already
    tagged with the step) and plain rows per table."""

    frames: dict[str, list[pl.DataFrame]] = field(default_factory=dict)
    rows: dict[str, list[dict[str, object]]] = field(default_factory=dict)

    def add(self, table: str, df: pl.DataFrame) -> None:
        self.frames.setdefault(table, []).append(df)


@dataclass
class Series:
    """One measure of one probe as rows of rep, phase, t_ns, value: charted
    in its report section and scanned by the anomaly detectors."""

    measure: str
    label: str
    frame: pl.DataFrame
    #: scanned by the anomaly detectors
    scan: bool = True
    #: put before what the detectors say of it
    prefix: str = ""
    #: charted (its distribution and course) above its table
    charts: bool = True


#: a kind's experiment-file model
M = TypeVar("M", bound=ProbeModel)


class ProbeKind(Generic[M]):
    """A kind's behaviour; each kind module subclasses it once, over its
    experiment-file model (``class Timer(ProbeKind[TimerProbe])``), so its
    hooks take that model."""

    name: str = ""
    model: type[M] | None = None
    #: one paragraph for its report section
    describe: str = ""
    #: the run tables its steps fill: name → column schema (beyond rep, phase, loads, probe)
    tables: dict[str, Columns] = {}
    #: (table, value column, group-by) trimmed of a detected warm-up before phases are compared
    steady: tuple[tuple[str, str, tuple[str, ...]], ...] = ()
    #: its samples in a dataset of runs' ``records`` view (``loopscope query``):
    #: (table, the measure's name as an SQL expression over the table's columns,
    #: the column of the value in ns), the same names as its ``measures``
    records: tuple[tuple[str, str, str], ...] = ()
    #: the measures the terminal summary shows (None: all)
    summary: frozenset[str] | None = None
    #: names of its measures in the report (``wake_delay`` → ``wake-up delay``)
    labels: dict[str, str] = {}
    #: helper processes an agent may start: name → their parameter model (launched like a probe)
    helpers: dict[str, type[Params]] = {}
    #: the process name (comm) a helper runs under, where it is not the default
    comm: dict[str, str] = {}
    #: the names of the threads its probe measures with (a pipeline's stages):
    #: a cause naming one is the probe's own work, never an intruder to move
    threads: frozenset[str] = frozenset()

    #: its parameter model (``probes/*.py``), which its experiment model
    #: inherits; a kind with one is started from a ``Launch``, never a command line of strings
    params: type[Params] | None = None

    def argv(self, p: dict[str, object], duration_ns: int, trace: Path, scratch: Path, calibrate: bool = False) -> list[str]:
        """How an agent starts it: ``python -m loopscope.probes.launch`` with its typed parameters."""
        if self.params is None:
            raise NotImplementedError(f"{self.name}: no command line")
        own = self.model.model_fields if self.model is not None else {}
        calibration = {k: int(v) for k, v in p.items() if k not in own and isinstance(v, int) and not isinstance(v, bool)}
        return launch_argv(launch_of(self.name, self.params, p, duration_ns, None if calibrate else trace, scratch, calibrate, calibration))

    def prepare(self, ctx: StepContext, probe: M, say: Callable[[str], None]) -> dict[str, int] | None:
        """Once per run, before the first phase (the sched probe sizes its burst)."""
        return None

    def trace_bytes_per_s(self, probe: M) -> float | None:
        """About how many bytes a second its trace grows while it measures
        (``check``'s disk estimate); None when it depends on what it measures."""
        return None

    def run(self, ctx: StepContext, probe: M, key: str, dur_ns: int) -> dict[str, Any]:
        """One step (a repetition × phase); the record that goes in run.json."""
        spec = {**probe.model_dump(mode="json"), **ctx.calibration.get(probe.name or "", {})}
        return ctx.run_one(probe, spec, key, dur_ns)

    #: the probe's main measure, (table, column): what load and link sweeps fit against the level
    main: tuple[str, str] | None = None

    def sweep_values(self, tables: Tables, probe: str) -> list[tuple[str, pl.DataFrame]]:
        """What a sweep fits for ``probe``: (name, rows of ``phase`` and
        ``value``); the main measure, named after the probe, by default."""
        if self.main is None:
            return []
        table, col = self.main
        df: pl.DataFrame = getattr(tables, table)
        if not len(df) or col not in df.columns:
            return []
        return [(probe, df.filter(pl.col("probe") == probe).select("phase", pl.col(col).alias("value")))]

    def programs(self, step: Step, run: RunRecord) -> list[Part]:
        """The programs a step of this kind started, whose traces hold their
        own intervals (``program``: one; ``app``: one per process)."""
        return []

    def local_programs(self, probe: M) -> list[Any]:
        """Its parts that take a ``cwd`` and ``host`` (programs it starts)."""
        return []

    def rows(self, step: Step, trace: pl.DataFrame, result: dict[str, object], read: RunFiles, tag: Tag) -> StepRows:
        """The table rows of one step: ``trace`` is the step's trace,
        ``result`` its probe's JSON, ``read`` reads the run's other files
        (each trace once), ``tag`` adds the step's columns."""
        return StepRows()

    def measures(self, tables: Tables) -> list[Measure]:
        """Its measures, compared across phases."""
        return []

    def series(self, tables: Tables, probe: str) -> list[Series]:
        return []

    #: the kind's windows are found in the run's kernel capture, not in its
    #: own trace (a monitor, which keeps only windows around outliers, cannot run it
    #: unless ``live_capture``)
    windows_need_capture: bool = False
    #: a monitor can record such a kind's steps with a watching capture of their
    #: own (``kernel.capture`` ``read="watch"``: only the threads its probe puts in
    #: the capture's ``set_event_pid``), which its ``windows`` then reads
    live_capture: bool = False
    #: a pinned probe of the kind is held up only by what happens on its own
    #: CPUs (and the wake-ups aimed at them): a monitor whose probes are all
    #: such records only those CPUs (``kernel.capture.cpu_filter``)
    windows_on_its_cpus: bool = False

    def live_step(self, probe: M, key: str, host: str, step_dir: Callable[[str], str]) -> dict[str, Any]:
        """Where a step's trace and result will be, before it runs (a monitor
        reads the open period's trace as it grows): ``host``, ``trace``,
        ``json`` (paths under ``step_dir(host)``), and ``stages`` for a kind
        whose step has them. One process named after the probe, by default."""
        d = Path(step_dir(host))
        return {"host": host, "trace": str(d / f"{probe.name}.lstrace"), "json": str(d / f"{probe.name}.json")}

    def windows(self, step: Step, src: WindowSource) -> pl.DataFrame:
        """The intervals of one step that explain splits into causes, as a
        ``WINDOWS`` frame. Every kind answers, even with an empty frame:
        a kind that forgets fails the contract test instead of silently
        getting no attribution."""
        raise NotImplementedError(f"{self.name}: no windows for explain")

    def silent(self, results: list[dict[str, object]]) -> str:
        """Why a probe of this kind has nothing to compare, and what it did
        record, from its steps' results (said in the summary and the report)."""
        return f"measured nothing in its {len(results)} step(s)"

    def missed(self, tables: Tables, probe: str) -> dict[str, list[tuple[int, int]]]:
        """Per phase, (missed deadlines, deadlines) of each repetition; {} for a kind without deadlines."""
        return {}

    def section(self, sec: Section, tables: Tables, comp: pl.DataFrame, present: list[str], inputs: SectionInputs) -> None:
        """Fill its report section (``sec``): charts and tables."""
        from loopscope.report.sections import series_section

        series_section(sec, comp, present, self.series(tables, sec.name))


def groups(df: pl.DataFrame) -> list[tuple[str, pl.DataFrame]]:
    """Rows of a table by probe."""
    if df.is_empty() or "probe" not in df.columns:
        return []
    return [(str(k[0]), g) for k, g in df.group_by("probe", maintain_order=True)]


class Kinds:
    """The registry: kinds by name, and the helpers they bring."""

    def __init__(self) -> None:
        self.by_name: dict[str, ProbeKind[Any]] = {}
        self.helpers: dict[str, type[Params]] = {}
        self.comms: dict[str, str] = {}

    def add(self, kind: ProbeKind[Any]) -> None:
        if kind.name in self.by_name:
            raise ValueError(f"probe kind {kind.name!r} registered twice")
        self.by_name[kind.name] = kind
        for h, model in kind.helpers.items():
            self.helpers[h] = model
        self.comms.update(kind.comm)

    def __getitem__(self, name: str) -> ProbeKind[Any]:
        return self.by_name[name]

    def get(self, name: str) -> ProbeKind[Any] | None:
        return self.by_name.get(name)

    def __iter__(self) -> Iterator[ProbeKind[Any]]:
        return iter(self.by_name.values())

    def models(self) -> list[type[ProbeModel]]:
        return [k.model for k in self if k.model is not None]

    def argv(self, p: dict[str, Any], duration_ns: int, trace: Path, scratch: Path, calibrate: bool = False) -> list[str] | None:
        """The command line for a probe or helper spec (None: unknown kind)."""
        k = self.by_name.get(p["kind"])
        if k is not None and k.model is not None:
            return k.argv(p, duration_ns, trace, scratch, calibrate)
        h = self.helpers.get(p["kind"])
        return None if h is None else launch_argv(launch_of(p["kind"], h, p, duration_ns, trace, scratch))
