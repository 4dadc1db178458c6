"""Which directories under a path are runs, and what identifies each.

A run is a directory holding ``run.json`` (``rundir.RunDir``): the path
itself, its children, or its grandchildren (``results/<host>/<run>``, a
fleet's runs gathered per machine). Each is read by its format: the run
record (``run.json``, format 1 or 2) gives the run id (the directory's
name, as ``run`` makes it), experiment, status, start, hosts and the steps'
probes; ``provenance.json`` each host's kernel and the loopscope that
recorded it. A run that cannot be read (a record that does not parse, a
newer format, an unreadable provenance) is kept as an entry with why, so a
listing says it and every query goes on with the others.

A monitor's directory (``monitor.json``) is found the same way and read as
a monitor (``MonitorEntry``): its record, its hosts and their kernels (from
the run record of each of its sessions), its periods and outliers
(``periods.jsonl``, ``outliers.jsonl``, which the query's views read in
place).

A run's tables are checked only as far as is cheap: a Parquet file ends in
the magic ``PAR1``; one cut short does not, and is left out with why.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from pathlib import Path

from typing_extensions import NotRequired, TypedDict

from loopscope.errors import InputError
from loopscope.rundir import RunDir
from loopscope.rundir import monitor as mrec

PARQUET_MAGIC = b"PAR1"


class ProbeOf(TypedDict):
    kind: str | None
    host: str


class Figure(TypedDict):
    """A probe's p99 in its run's baseline phase, with its 95 % interval (ns)."""

    value_ns: float | None
    lo_ns: float | None
    hi_ns: float | None


class RunListing(TypedDict):
    """One run in ``loopscope runs --format json``."""

    kind: str
    run_id: str
    path: str
    readable: bool
    why: str | None
    experiment: str | None
    status: str | None
    format: int | None
    started_utc: str | None
    ended_utc: str | None
    hosts: dict[str, str | None]
    kernel: str | None
    version: str | None
    commit: str | None
    repetitions: int | None
    probes: dict[str, ProbeOf]
    tables: list[str]
    damaged_tables: dict[str, str]
    lost_hosts: list[dict[str, str]]
    #: probe → its p99 in the baseline phase (the listing adds it)
    p99: NotRequired[dict[str, Figure]]


class MonitorListing(TypedDict):
    """One monitor in ``loopscope runs --format json`` (``kind``: "monitor")."""

    kind: str
    run_id: str
    path: str
    readable: bool
    why: str | None
    experiment: str | None
    status: str | None
    started_utc: str | None
    updated_utc: str | None
    hosts: dict[str, str | None]
    kernel: str | None
    version: str | None
    periods: int
    probes: dict[str, ProbeOf]
    outliers_above: int
    kept: int
    not_kept: dict[str, int]
    lost_hosts: list[dict[str, str]]


@dataclass
class RunEntry:
    """One run of the dataset (``why`` set: it cannot be read, or only in part)."""

    path: Path
    run_id: str
    readable: bool = True
    why: str | None = None
    experiment: str | None = None
    status: str | None = None
    format: int | None = None
    started_utc: str | None = None
    ended_utc: str | None = None
    #: host → its kernel release (None: not recorded)
    hosts: dict[str, str | None] = field(default_factory=dict)
    first_host: str | None = None
    version: str | None = None
    commit: str | None = None
    repetitions: int | None = None
    #: probe → (kind, host)
    probes: dict[str, tuple[str, str]] = field(default_factory=dict)
    #: table name → its Parquet file
    tables: dict[str, Path] = field(default_factory=dict)
    #: tables left out, with why
    damaged: dict[str, str] = field(default_factory=dict)
    #: hosts lost mid-run (``on_host_failure: continue``): host, when, during what, why
    lost_hosts: list[dict[str, str]] = field(default_factory=list)

    def to_json(self) -> RunListing:
        kernels = sorted({k for k in self.hosts.values() if k})
        return {
            "kind": "run",
            "run_id": self.run_id,
            "path": str(self.path),
            "readable": self.readable,
            "why": self.why,
            "experiment": self.experiment,
            "status": self.status,
            "format": self.format,
            "started_utc": self.started_utc,
            "ended_utc": self.ended_utc,
            "hosts": self.hosts,
            "kernel": ", ".join(kernels) or None,
            "version": self.version,
            "commit": self.commit,
            "repetitions": self.repetitions,
            "probes": {p: {"kind": k, "host": h} for p, (k, h) in self.probes.items()},
            "tables": sorted(self.tables),
            "damaged_tables": self.damaged,
            "lost_hosts": self.lost_hosts,
        }


@dataclass
class MonitorEntry:
    """One monitor of the dataset: its record's figures, its hosts, and its lines' files (``why`` set: it cannot be read)."""

    path: Path
    run_id: str
    readable: bool = True
    why: str | None = None
    experiment: str | None = None
    status: str | None = None
    started_utc: str | None = None
    updated_utc: str | None = None
    periods: int = 0
    #: host (the spec's name) → its kernel release (None: not recorded)
    hosts: dict[str, str | None] = field(default_factory=dict)
    first_host: str | None = None
    version: str | None = None
    #: probe → (kind, host)
    probes: dict[str, tuple[str | None, str]] = field(default_factory=dict)
    outliers_above: int = 0
    kept: int = 0
    not_kept: dict[str, int] = field(default_factory=dict)
    #: hosts lost while it ran: host, when, why, in which session, and when it was back (``back_utc``, when it was)
    lost_hosts: list[dict[str, str]] = field(default_factory=list)

    @property
    def periods_file(self) -> Path:
        return self.path / "periods.jsonl"

    @property
    def outliers_file(self) -> Path:
        return self.path / "outliers.jsonl"

    def to_json(self) -> MonitorListing:
        kernels = sorted({k for k in self.hosts.values() if k})
        return {
            "kind": "monitor",
            "run_id": self.run_id,
            "path": str(self.path),
            "readable": self.readable,
            "why": self.why,
            "experiment": self.experiment,
            "status": self.status,
            "started_utc": self.started_utc,
            "updated_utc": self.updated_utc,
            "hosts": self.hosts,
            "kernel": ", ".join(kernels) or None,
            "version": self.version,
            "periods": self.periods,
            "probes": {p: {"kind": k, "host": h} for p, (k, h) in self.probes.items()},
            "outliers_above": self.outliers_above,
            "kept": self.kept,
            "not_kept": self.not_kept,
            "lost_hosts": self.lost_hosts,
        }


def read_monitor(d: Path) -> MonitorEntry:
    """One monitor directory as a dataset entry, whatever its state: its
    record, and its hosts as the run records of its sessions name them."""
    e = MonitorEntry(path=d, run_id=d.name)
    try:
        rec = mrec.read(d)
        e.experiment, e.status = rec.get("name"), rec.get("status")
        e.started_utc, e.updated_utc = rec.get("started_utc"), rec.get("updated_utc")
        e.periods = int(rec.get("periods") or 0)
        c = rec.get("counts") or {}
        e.outliers_above, e.kept = int(c.get("outliers_above") or 0), int(c.get("kept") or 0)
        e.not_kept = {str(k): int(v) for k, v in (c.get("not_kept") or {}).items()}
    except InputError as err:
        e.readable, e.why = False, str(err).removeprefix(f"{d / mrec.NAME}: ")
        return e
    except (AttributeError, TypeError, ValueError) as err:
        # JSON that parses but is not a monitor's record (a list, a count that is not a number)
        e.readable, e.why = False, f"{mrec.NAME} is not a monitor's record ({type(err).__name__}: {err}); the directory is damaged"
        return e
    sessions = sorted(p for p in (d / "sessions").glob("*") if (p / "run.json").is_file()) if (d / "sessions").is_dir() else []
    for s in sessions:
        rd = RunDir(s)
        try:
            run, prov = rd.record(), rd.provenance()
        except InputError as err:
            e.why = f"session {s.name}: {err}"
            continue
        e.first_host = e.first_host or run.first_host
        for h in run.hosts:
            e.hosts.setdefault(h, None)
        for h, m in prov.hosts.items():
            e.hosts[h] = m.kernel.release if m.kernel else e.hosts.get(h)
            e.version = e.version or m.software.get("loopscope")
        e.lost_hosts += [
            {"host": x.host, "at_utc": x.at_utc, "why": x.why, "session": s.name, **({"back_utc": x.back_utc} if x.back_utc else {})} for x in run.lost_hosts
        ]
        for st in run.steps:
            e.probes.setdefault(st.probe, (st.kind, run.host_of(st)))
        try:
            spec = rd.spec()
        except (InputError, OSError, ValueError):
            spec = {}
        for p in spec.get("probes") or []:
            if isinstance(p, dict) and p.get("name"):
                e.probes.setdefault(str(p["name"]), (str(p.get("kind") or "") or None, str(p.get("host") or e.first_host)))
    if not e.hosts:
        e.hosts = {"localhost": None}
    e.first_host = e.first_host or next(iter(e.hosts))
    for p in rec.get("probes") or {}:
        e.probes.setdefault(p, (None, e.first_host))
    return e


@dataclass
class Dataset:
    root: Path
    runs: list[RunEntry]
    #: directories under the root that are loopscope's but not runs, with what they are
    others: list[tuple[Path, str]] = field(default_factory=list)
    monitors: list[MonitorEntry] = field(default_factory=list)

    @property
    def readable(self) -> list[RunEntry]:
        return [r for r in self.runs if r.readable]

    def notes(self) -> list[str]:
        """What a listing or a query says beside its answer: runs left out and why."""
        out = [f"{r.path}: left out: {r.why}" for r in self.runs if not r.readable]
        out += [f"{r.path}: {r.why}" for r in self.runs if r.readable and r.why]
        out += [f"{r.path}/tables/{t}.parquet: left out: {why}" for r in self.runs for t, why in r.damaged.items()]
        out += [f"{m.path}: left out: {m.why}" for m in self.monitors if not m.readable]
        out += [f"{m.path}: {m.why}" for m in self.monitors if m.readable and m.why]
        out += [f"{p}: {what}" for p, what in self.others]
        return out


def _run_dirs(root: Path) -> tuple[list[Path], list[Path]]:
    """The run directories and the monitor directories: ``root`` itself, its children, or its grandchildren."""
    if (root / "run.json").is_file():
        return [root], []
    if mrec.exists(root):
        return [], [root]
    runs, monitors = [], []
    for d in sorted(p for p in root.iterdir() if p.is_dir()):
        if (d / "run.json").is_file():
            runs.append(d)
        elif mrec.exists(d):
            monitors.append(d)
        else:
            try:
                kids = sorted(p for p in d.iterdir() if p.is_dir())
            except OSError:
                continue
            runs.extend(p for p in kids if (p / "run.json").is_file())
            monitors.extend(p for p in kids if mrec.exists(p))
    return runs, monitors


def _intact(path: Path) -> str | None:
    """Why a Parquet file cannot be read (None: it looks whole)."""
    try:
        size = path.stat().st_size
        if size < 12:
            return f"{size} bytes: cut short"
        with path.open("rb") as f:
            head = f.read(4)
            f.seek(-4, 2)
            tail = f.read(4)
    except OSError as e:
        return f"cannot be read ({e.strerror})"
    if head != PARQUET_MAGIC or tail != PARQUET_MAGIC:
        return "not a whole Parquet file (cut short or damaged)"
    return None


def read_entry(d: Path) -> RunEntry:
    """One run directory as a dataset entry, whatever its state."""
    e = RunEntry(path=d, run_id=d.name)
    rd = RunDir(d)
    try:
        rec = rd.record()
        prov = rd.provenance()
    except InputError as err:
        e.readable, e.why = False, str(err).removeprefix(f"{rd.run_json}: ").removeprefix(f"{rd.provenance_json}: ")
        return e
    e.run_id = d.name  # the directory's name: unique in its results directory, as `run` makes it (run.json's run_id is the same)
    e.experiment, e.status, e.format = rec.name, rec.status, rec.format
    e.started_utc, e.ended_utc = rec.started_utc, rec.ended_utc
    e.first_host = rec.first_host
    e.hosts = {h: None for h in rec.hosts} or {rec.first_host: None}
    for h, m in prov.hosts.items():
        e.hosts[h] = m.kernel.release if m.kernel else None
        e.version = e.version or m.software.get("loopscope")
        if e.commit is None and m.loopscope_git is not None:
            e.commit = m.loopscope_git.sha
    e.lost_hosts = [{"host": x.host, "at_utc": x.at_utc, "during": x.during, "why": x.why} for x in rec.lost_hosts]
    for st in rec.steps:
        e.probes.setdefault(st.probe, (st.kind, rec.host_of(st)))
        e.repetitions = max(e.repetitions or 0, st.rep)
    e.tables, e.damaged = _tables(d / "tables")
    if not e.tables:
        e.why = (
            "no tables: " + ("the run " + rec.status if rec.status != "completed" else "recorded without its report") + f"; `loopscope report {d}` writes them"
        )
    return e


def _tables(d: Path) -> tuple[dict[str, Path], dict[str, str]]:
    good: dict[str, Path] = {}
    bad: dict[str, str] = {}
    try:
        files = sorted(d.glob("*.parquet"))
    except OSError:
        return good, bad
    for p in files:
        why = _intact(p)
        if why is None:
            good[p.stem] = p
        else:
            bad[p.stem] = why
    return good, bad


def scan(root: str | Path) -> Dataset:
    """The runs and monitors under ``root``; InputError when it is not a directory or holds neither."""
    r = Path(root)
    if not r.is_dir():
        raise InputError(f"{root}: not a directory; give the directory runs are recorded into (`results:` of the experiment, runs/ by default)")
    dirs, mons = _run_dirs(r)
    if not dirs and not mons:
        raise InputError(
            f"{root}: holds no run or monitor (no directory with a run.json or a monitor.json in it or one level below); "
            "give the directory `loopscope run` or `loopscope monitor` records into"
        )
    return Dataset(r, [read_entry(d) for d in dirs], [], [read_monitor(d) for d in mons])
