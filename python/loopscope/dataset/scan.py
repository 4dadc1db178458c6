"""Which directories under a path are runs, and what identifies each.

A run is a directory holding ``run.json`` (``rundir.RunDir``): the path
itself, its children, or its grandchildren (``results/<host>/<run>``, a
fleet's runs gathered per machine). Each is read by its format: the run
record (``run.json``, format 1 or 2) gives the run id (the directory's
name, as ``run`` makes it), experiment, status, start, hosts and the steps'
probes; ``provenance.json`` each host's kernel and the loopscope that
recorded it. A run that cannot be read (a record that does not parse, a
newer format, an unreadable provenance) is kept as an entry with why, so a
listing says it and every query goes on with the others. Directories that
are loopscope's but not runs (a monitor's) are said too.

A run's tables are checked only as far as is cheap: a Parquet file ends in
the magic ``PAR1``; one cut short does not, and is left out with why.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from pathlib import Path

from loopscope.errors import InputError
from loopscope.rundir import RunDir

PARQUET_MAGIC = b"PAR1"


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

    def to_json(self) -> dict[str, object]:
        kernels = sorted({k for k in self.hosts.values() if k})
        return {
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
        }


@dataclass
class Dataset:
    root: Path
    runs: list[RunEntry]
    #: directories under the root that are loopscope's but not runs, with what they are
    others: list[tuple[Path, str]] = field(default_factory=list)

    @property
    def readable(self) -> list[RunEntry]:
        return [r for r in self.runs if r.readable]

    def notes(self) -> list[str]:
        """What a listing or a query says beside its answer: runs left out and why."""
        out = [f"{r.path}: left out: {r.why}" for r in self.runs if not r.readable]
        out += [f"{r.path}: {r.why}" for r in self.runs if r.readable and r.why]
        out += [f"{r.path}/tables/{t}.parquet: left out: {why}" for r in self.runs for t, why in r.damaged.items()]
        out += [f"{p}: {what}" for p, what in self.others]
        return out


def _run_dirs(root: Path) -> tuple[list[Path], list[tuple[Path, str]]]:
    if (root / "run.json").is_file():
        return [root], []
    runs, others = [], []
    for d in sorted(p for p in root.iterdir() if p.is_dir()):
        if (d / "run.json").is_file():
            runs.append(d)
        elif (d / "monitor.json").is_file():
            others.append((d, "a monitor's directory, not a run (its figures: monitor.json, periods.jsonl, outliers.jsonl)"))
        else:
            try:
                kids = sorted(p for p in d.iterdir() if p.is_dir() and (p / "run.json").is_file())
            except OSError:
                continue
            runs.extend(kids)
    return runs, others


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
    """The runs under ``root``; InputError when it is not a directory or holds none."""
    r = Path(root)
    if not r.is_dir():
        raise InputError(f"{root}: not a directory; give the directory runs are recorded into (`results:` of the experiment, runs/ by default)")
    dirs, others = _run_dirs(r)
    if not dirs:
        said = "".join(f"; {p.name}: {w}" for p, w in others[:3])
        raise InputError(f"{root}: holds no run (no directory with a run.json in it or one level below){said}; give the directory `loopscope run` records into")
    return Dataset(r, [read_entry(d) for d in dirs], others)
