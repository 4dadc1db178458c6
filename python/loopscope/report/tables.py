"""A run directory as tables: every measurement, one row each.

The traces are the source of truth: each step of a run (repetition × phase
× probe) has one trace, and its records become rows tagged with the step
they came from. The probes' JSON results supply what a record does not carry
(the sched probe's burst-alone reference, the syscall probe's batch size).
``docs/tables.md`` documents every column; the files are written to
``RUN/tables/*.parquet``.
"""

from __future__ import annotations

import json
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import polars as pl

from loopscope.trace import reader
from loopscope.errors import InputError
from loopscope.rundir import EmulatorResult, Identity, PathRecord, Provenance, RunDir, RunRecord, Step, read_emulator_result
from loopscope.analysis.registry import Columns, Registry
from loopscope.analysis.items import Placement
from loopscope.analysis.queueing import ErlangFit
from loopscope.trace.files import Files
import numpy as np
from loopscope.analysis.queueing import fit
import dataclasses
from loopscope.kernel import store as S

STEP_COLS = {"rep": pl.UInt16, "phase": pl.String, "loads": pl.String, "probe": pl.String}


@dataclass
class RunTables:
    """A run as tables: the run's record, spec and provenance, and one frame
    per table the probe kinds fill (``timer``, ``sched``, ``pipeline``, …,
    reached as attributes), plus the steps, the loads and each step's result."""

    run: RunRecord
    spec: dict[str, Any]
    provenance: Provenance
    frames: dict[str, pl.DataFrame]
    loads: pl.DataFrame
    steps: pl.DataFrame
    results: dict[tuple[int, str, str], dict[str, Any]] = field(default_factory=dict)
    emulator: EmulatorView | None = None

    def __getattr__(self, name: str) -> pl.DataFrame:
        """A table by name: every table a registered kind declares is here
        (empty when no step filled it); any other name is a mistake, said as one."""
        frames: dict[str, pl.DataFrame] = self.__dict__.get("frames") or {}
        if name in frames:
            return frames[name]
        if name.startswith("_"):
            raise AttributeError(name)
        raise AttributeError(f"no table {name!r}: no registered probe kind declares it (the tables are {', '.join(sorted(frames))})")

    def replace(self, **frames: pl.DataFrame) -> "RunTables":
        """The same run with some tables replaced (the steady state, say)."""

        return dataclasses.replace(self, frames={**self.frames, **frames})

    def write(self, out: Path, extra: dict[str, pl.DataFrame] | None = None) -> list[Path]:
        """Every table as ``out/<name>.parquet`` (and ``extra``'s: the
        comparisons), each row identified by the run's columns
        (``rundir.Identity``): the one place a run's measurement tables are written."""
        out.mkdir(exist_ok=True)
        ident = Identity.of(self.run, self.provenance)
        paths = []
        for name, df in [*self.frames.items(), ("loads", self.loads), ("steps", self.steps), *(extra or {}).items()]:
            if name not in ALWAYS and not len(df):
                continue
            p = out / f"{name}.parquet"
            ident.tag(df).write_parquet(p)
            paths.append(p)
        return paths


ALWAYS = {"timer", "sched", "syscall", "loads", "steps", "comparisons"}  # written even when empty (docs/tables.md)
# Tables the report's analysis adds for programs that used channels
# (``report._channel_tables``): present, empty, in every run without them.
ANALYSIS_TABLES = ("breakdown", "items", "breakdown_size", "channels")


def _empty(schema: Columns) -> pl.DataFrame:
    return pl.DataFrame(schema={**STEP_COLS, **schema})


def _tag(df: pl.DataFrame, st: Step) -> pl.DataFrame:
    return df.with_columns(
        pl.lit(st.rep, dtype=pl.UInt16).alias("rep"),
        pl.lit(st.phase).alias("phase"),
        pl.lit("+".join(st.loads) or "none").alias("loads"),
        pl.lit(st.probe).alias("probe"),
    )


class StepFiles:
    """The run's files for the kinds (``kinds.base.RunFiles``): traces as
    ``files`` reads them, results by path, clock placement built once."""

    def __init__(self, run: RunRecord, files: Files) -> None:
        self.run, self.files = run, files
        self._place: Placement | None = None
        self._kernels: dict[str, S.Store | None] = {}

    @property
    def run_dir(self) -> Path:
        return self.files.root

    def kernel(self, host: str) -> Any:
        """The capture covering ``host``, opened once (None: none, or unreadable)."""

        if host not in self._kernels:
            cap = next((c for c in self.run.captures if c.data and (host in c.covers or c.host == host)), None)
            try:
                self._kernels[host] = S.open_capture(self.files.root, cap) if cap is not None else None
            except S.CaptureError:
                self._kernels[host] = None
        return self._kernels[host]

    def trace(self, rel: str) -> pl.DataFrame | None:
        return self.files.trace(rel)

    def json(self, rel: str) -> dict[str, Any]:
        text = self.files.text(rel)
        try:
            return dict(json.loads(text.strip().splitlines()[-1])) if text is not None else {}
        except (json.JSONDecodeError, IndexError, TypeError, ValueError):
            return {}

    def place(self, host_a: np.ndarray, rt_a: np.ndarray, host_b: np.ndarray, rt_b: np.ndarray, base: int = 0) -> tuple[np.ndarray, np.ndarray]:
        if self._place is None:
            self._place = Placement.of(self.run, self.files)
        return self._place.diff(host_a, rt_a, host_b, rt_b, base)


def load_run(run_dir: Path, kinds: Registry, traces: Files | None = None) -> RunTables:
    """Read a run's steps into tables, each step's rows made by its kind."""
    rd = RunDir(run_dir)
    run = rd.record()
    spec = rd.spec()
    prov = rd.provenance()
    files = StepFiles(run, traces if traces is not None else Files(run_dir))
    frames: dict[str, list[pl.DataFrame]] = {}
    plain: dict[str, list[dict[str, object]]] = {}
    stepsrows = []
    results: dict[tuple[int, str, str], dict[str, object]] = {}
    for st in run.steps:
        res = files.json(st.json_)
        results[(st.rep, st.phase, st.probe)] = res
        got = files.files.trace_info(st.trace)
        if got is None:
            raise FileNotFoundError(f"{run_dir / st.trace}: the trace of rep {st.rep} {st.phase} {st.probe} is missing")
        df, inf = got
        stepsrows.append(
            {
                "rep": st.rep,
                "phase": st.phase,
                "loads": "+".join(st.loads) or "none",
                "probe": st.probe,
                "kind": st.kind,
                "trace": st.trace,
                "records": inf.records,
                "lost_records": inf.lost_records,
                "damaged_chunks": inf.stats["damaged_chunks"],
                "probe_cpu_s": (st.cpu_usec or 0) / 1e6,
                "wall_s": (st.end_mono_ns - st.spawn_mono_ns) / 1e9,
            }
        )
        kind = kinds.get(st.kind)
        if kind is None:
            continue  # a kind this version does not know: its step is listed, its rows are not
        rows = kind.rows(st, df, res, files, lambda d, st=st: _tag(d, st))
        for t, xs in rows.frames.items():
            frames.setdefault(t, []).extend(xs)
        for t, rs in rows.rows.items():
            plain.setdefault(t, []).extend(rs)
    loads = pl.DataFrame([ld.model_dump(mode="json", exclude_unset=True) for ld in run.loads], infer_schema_length=None) if run.loads else pl.DataFrame()
    if len(loads):
        loads = loads.with_columns((pl.col("cpu_s") / pl.col("elapsed_s")).alias("cpu_util")).drop("exit")
    out: dict[str, pl.DataFrame] = {}
    for k in kinds:
        for t, schema in k.tables.items():
            xs = frames.get(t) or []
            if xs:
                out[t] = pl.concat(xs, how="diagonal_relaxed" if not schema else "vertical_relaxed")
            elif t in plain:
                out[t] = pl.DataFrame(plain[t], infer_schema_length=None)
            elif t not in out:
                out[t] = _empty(schema) if schema else pl.DataFrame()
    for t in ANALYSIS_TABLES:
        out.setdefault(t, pl.DataFrame())
    return RunTables(
        run=run,
        spec=spec,
        provenance=prov,
        frames=out,
        loads=loads,
        steps=pl.DataFrame(stepsrows) if stepsrows else pl.DataFrame(schema={**STEP_COLS, "kind": pl.String}),
        results=results,
        emulator=_emulator(run_dir, run),
    )


@dataclass
class EmulatorView:
    """What carried each path (``paths``), the router kernel's own counts, and
    when the emulator ran its netem.json (``result``) with, per link it
    carried, its queueing against the M/Er/1 model (``queueing``)."""

    paths: dict[str, PathRecord]
    router_kernel: dict[str, int] | None
    result: EmulatorResult | None = None
    queueing: dict[str, ErlangFit] = field(default_factory=dict)


def _emulator(run_dir: Path, run: RunRecord) -> EmulatorView | None:
    """The emulator's counts (when it ran), with what carried each path
    (``paths``) and the router kernel's own counts (``router_kernel``)."""
    em = run.emulator
    paths, router = run.paths, run.router_kernel
    if not em and not paths:
        return None
    out = EmulatorView(paths=dict(paths or {}), router_kernel=router)
    if em:
        try:
            out.result = read_emulator_result(run_dir / em.json_)
        except (OSError, InputError):
            return out if paths else None
        out.queueing = _emulator_queueing(run_dir / em.trace, out.result)
    return out


def _emulator_queueing(trace: Path, em: EmulatorResult) -> dict[str, ErlangFit]:
    """Per link, the emulator's own residence beyond the configured delay (its
    actual departure minus the packet's ready time: the rate queue plus its
    lateness) against the M/Er/1 model (``analysis/queueing.py``)."""

    if not trace.exists():
        return {}
    try:
        df = reader.read(trace, sort=False)
    except Exception:  # noqa: BLE001 - a damaged emulator trace costs this figure only
        return {}
    ev = df.filter(pl.col("name").cast(pl.String) == "forward")
    out: dict[str, ErlangFit] = {}
    names = [l["name"] for l in em.get("links") or []]
    for (tag,), g in ev.group_by(["tag"]):
        pay = [p for p in g["payload"].to_list() if p is not None and len(p) >= 32]
        if len(pay) < 200 or int(tag) >= len(names):
            continue
        a = np.frombuffer(b"".join(p[:32] for p in pay), dtype="<i8").reshape(len(pay), 4)
        f = fit((a[:, 3] - a[:, 1]).astype(np.float64))
        if f is not None:
            out[names[int(tag)]] = f
    return out
