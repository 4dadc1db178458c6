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

from pydantic import ValidationError

from loopscope.errors import InputError
from loopscope.once import Once
from loopscope.rundir.provenance import (
    VirtualClock as VirtualClock,
    LabHost as LabHost,
    LabProvenance as LabProvenance,
    MachineCpu as MachineCpu,
    MachineKernel as MachineKernel,
    KernelClock as KernelClock,
    Chrony as Chrony,
    ClockDiscipline as ClockDiscipline,
    CpuFreq as CpuFreq,
    Privileges as Privileges,
    GitInfo as GitInfo,
    Machine as Machine,
    Provenance as Provenance,
)
from loopscope.rundir.record import (
    RUN_FORMAT as RUN_FORMAT,
    StageStep as StageStep,
    ProcessStep as ProcessStep,
    ServerStep as ServerStep,
    HubStep as HubStep,
    Step as Step,
    LoadReport as LoadReport,
    LoadRecord as LoadRecord,
    AgentRecord as AgentRecord,
    HostAgent as HostAgent,
    CaptureReport as CaptureReport,
    ReadDuring as ReadDuring,
    CpuLimit as CpuLimit,
    Capture as Capture,
    KernelRecord as KernelRecord,
    SyncPart as SyncPart,
    ClockSyncRecord as ClockSyncRecord,
    HistQuantiles as HistQuantiles,
    EmulatorRecord as EmulatorRecord,
    LinkCounts as LinkCounts,
    PortCounts as PortCounts,
    EmulatorResult as EmulatorResult,
    EMULATOR_RESULT as EMULATOR_RESULT,
    read_emulator_result as read_emulator_result,
    PathRecord as PathRecord,
    LinkSetting as LinkSetting,
    TuningChange as TuningChange,
    TuningsApplied as TuningsApplied,
    Failed as Failed,
    LostHost as LostHost,
    RunRecord as RunRecord,
)

T = TypeVar("T")


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
        started = (
            pl.lit(self.started_utc).str.to_datetime(time_zone="UTC", time_unit="us") if self.started_utc else pl.lit(None, dtype=pl.Datetime("us", "UTC"))
        )
        out = frame.drop([c for c in IDENTITY if c in frame.columns and c != "host"]).with_columns(
            pl.lit(self.run_id).alias("run_id"), pl.lit(self.experiment).alias("experiment"), host.cast(pl.String).alias("host")
        )
        return out.with_columns(
            pl.col("host").replace_strict(self.kernels, default=None, return_dtype=pl.String).alias("kernel"),
            pl.lit(self.loopscope_version, dtype=pl.String).alias("loopscope_version"),
            started.alias("started_utc"),
        )


#: within ``read_once()``: each run document parsed once, keyed by path, size and mtime
_read: Once | None = None


@contextlib.contextmanager
def read_once() -> Iterator[None]:
    """Within: run.json, spec.json and provenance.json are each parsed once and
    shared (the report's load, its timeline and explain read the same run).
    What they return is shared, so it is read-only there; a file that
    changes is read again."""
    global _read
    outer = _read
    if outer is None:
        _read = Once()
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
    return _read.get((os.path.realpath(path), st.st_size, st.st_mtime_ns), parse)


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
            raise InputError(
                f"{self.run_json}: run format {fmt} is newer than this loopscope reads (up to {RUN_FORMAT}); read it with the version that recorded it"
            )
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
