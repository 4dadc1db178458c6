"""A run directory: its paths and its typed run record, read and written here.

``RunDir.open`` is the one place that decides whether a path is a run
directory (it holds the ``run.json`` that ``loopscope run`` writes first)
and says so in one message, exit code 2, naming the path.

``run.json`` is the run record (``RunRecord``): what ran, on which hosts,
every step (repetition × phase × probe) with its files, how the run ended.
The controller writes it only through ``RunDir.write_run`` and every reader
goes through ``RunDir.run``, both checking it against the model. The record
carries its format version (``format``); a record without one is from
before versions were written (format 1, which this version reads), and a
record of a newer format is refused, naming it. Fields the model does not
name (a kind's own step fields: a pipeline's stages, an rr probe's server)
are kept as they are.
"""

from __future__ import annotations

import json
import os
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from pydantic import BaseModel, ConfigDict, Field, ValidationError

from loopscope.errors import InputError

#: the run record's format: 2 added ``format`` itself; 1 is every run before it
RUN_FORMAT = 2


class _Open(BaseModel):
    model_config = ConfigDict(extra="allow")


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


class RunRecord(_Open):
    """What ``run.json`` holds (docs/tables.md lists the rest of a run directory)."""

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
    loads: list[dict[str, Any]] = Field(default_factory=list)
    timings: dict[str, Any] = Field(default_factory=dict)


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


class LabProvenance(_Open):
    """The lab's side of provenance.json: hosts, network, links."""

    hosts: dict[str, LabHost] = Field(default_factory=dict)
    network: dict[str, Any] | None = None
    links: dict[str, Any] | None = None


class MachineCpu(_Open):
    usable_cpus: list[int] = Field(default_factory=list)


class Machine(_Open):
    """One host's machine as its agent found it (host/provenance.py writes the rest)."""

    cpu: MachineCpu | None = None


class Provenance(_Open):
    """What ``provenance.json`` holds: the controller, the lab, each host's machine, and the tunings the phases applied."""

    controller: dict[str, Any] = Field(default_factory=dict)
    lab: LabProvenance = Field(default_factory=LabProvenance)
    hosts: dict[str, Machine] = Field(default_factory=dict)
    tunings: list[dict[str, Any]] | None = None

    def offsets(self) -> dict[str, int]:
        """Each host's CLOCK_MONOTONIC offset (its time namespace), ns."""
        return {h: v.clock_offset_ns for h, v in self.lab.hosts.items()}


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

    def run(self) -> dict[str, Any]:
        """The run record as the JSON it is (checked by ``record``)."""
        return self.record().model_dump(mode="json", by_alias=True, exclude_unset=True)

    def write_run(self, run: dict[str, Any]) -> None:
        """Write the run record (checked against the model first), atomically."""
        rec = RunRecord.model_validate({**run, "format": RUN_FORMAT})
        tmp = self.run_json.with_name(".run.json.tmp")
        tmp.write_text(json.dumps(rec.model_dump(mode="json", by_alias=True, exclude_unset=True), indent=1, default=str) + "\n")
        os.replace(tmp, self.run_json)
