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

STEP_COLS = {"rep": pl.UInt16, "phase": pl.String, "loads": pl.String, "probe": pl.String}


@dataclass
class RunTables:
    run: dict[str, Any]
    spec: dict[str, Any]
    provenance: dict[str, Any]
    timer: pl.DataFrame
    sched: pl.DataFrame
    syscall: pl.DataFrame
    loads: pl.DataFrame
    steps: pl.DataFrame
    results: dict[tuple[int, str, str], dict[str, Any]] = field(default_factory=dict)
    pipeline: pl.DataFrame = field(default_factory=pl.DataFrame)
    stages: pl.DataFrame = field(default_factory=pl.DataFrame)
    emulator: dict[str, Any] | None = None
    program: pl.DataFrame = field(default_factory=pl.DataFrame)

    def write(self, out: Path) -> list[Path]:
        out.mkdir(exist_ok=True)
        paths = []
        names = ["timer", "sched", "syscall", "loads", "steps"] + (["pipeline", "stages"] if len(self.pipeline) else []) + (["program"] if len(self.program) else [])
        for name in names:
            df: pl.DataFrame = getattr(self, name)
            p = out / f"{name}.parquet"
            df.write_parquet(p)
            paths.append(p)
        return paths


def _empty(schema: dict[str, Any]) -> pl.DataFrame:
    return pl.DataFrame(schema={**STEP_COLS, **schema})


def _tag(df: pl.DataFrame, st: dict[str, Any]) -> pl.DataFrame:
    return df.with_columns(
        pl.lit(st["rep"], dtype=pl.UInt16).alias("rep"),
        pl.lit(st["phase"]).alias("phase"),
        pl.lit("+".join(st["loads"]) or "none").alias("loads"),
        pl.lit(st["probe"]).alias("probe"),
    )


def _intervals(df: pl.DataFrame, prefix: str, kind: str) -> pl.DataFrame:
    """A program's intervals (its own groups: loopscope's and the channel
    runtime's ``chan``, which the time breakdown uses, left out), named
    ``<prefix><group>/<name>``."""
    name = pl.col("name").cast(pl.String)
    return df.filter((pl.col("kind").cast(pl.String) == "interval") & ~pl.col("group").cast(pl.String).is_in(["loopscope", "chan"])).select(
        (pl.lit(prefix) + pl.col("group").cast(pl.String) + "/" + name).alias("interval"), "tag", pl.col("tid").cast(pl.Int64), "t_ns", "dur_ns",
        pl.lit(kind).alias("kind"),
    )


def load_run(run_dir: Path) -> RunTables:
    run = json.loads((run_dir / "run.json").read_text())
    spec = json.loads((run_dir / "spec.json").read_text())
    prov_path = run_dir / "provenance.json"
    prov = json.loads(prov_path.read_text()) if prov_path.exists() else {}
    from loopscope.probes.pipeline import messages_from

    timer, sched, sysc, stepsrows, pipe, stages, prog = [], [], [], [], [], [], []
    results: dict[tuple[int, str, str], dict[str, Any]] = {}
    for st in run["steps"]:
        res_path = run_dir / st["json"]
        try:
            res = json.loads(res_path.read_text().strip().splitlines()[-1])
        except (OSError, json.JSONDecodeError, IndexError):
            res = {}
        results[(st["rep"], st["phase"], st["probe"])] = res
        trace = run_dir / st["trace"]
        df, inf = reader.read_with_info(trace, sort=False)
        stepsrows.append(
            {
                "rep": st["rep"], "phase": st["phase"], "loads": "+".join(st["loads"]) or "none", "probe": st["probe"], "kind": st["kind"],
                "trace": st["trace"], "records": inf.records, "lost_records": inf.lost_records, "damaged_chunks": inf.stats["damaged_chunks"],
                "probe_cpu_s": (st.get("cpu_usec") or 0) / 1e6, "wall_s": (st["end_mono_ns"] - st["spawn_mono_ns"]) / 1e9,
            }
        )
        name = pl.col("name").cast(pl.String)
        if st["kind"] == "timer":
            w = df.filter(name == "wakeup").select(pl.col("tag").alias("thread"), "t_ns", pl.col("dur_ns").alias("latency_ns"))
            timer.append(_tag(w, st))
        elif st["kind"] == "sched":
            wk = df.filter(name == "wakeup").select(pl.col("tag").alias("cycle"), pl.col("t_ns"), pl.col("dur_ns").alias("wake_delay_ns"))
            bu = df.filter(name == "burst").select(pl.col("tag").alias("cycle"), pl.col("dur_ns").alias("burst_ns"))
            alone = int(res.get("alone_ns") or 0)
            j = wk.join(bu, on="cycle", how="left").with_columns((pl.col("burst_ns") - alone).alias("extra_ns"))
            sched.append(_tag(j, st))
        elif st["kind"] == "syscall":
            batch = int(res.get("batch") or 1)
            s = df.filter(pl.col("group").cast(pl.String) == "syscall").select(
                name.alias("call"), pl.col("tag").alias("batch"), "t_ns", (pl.col("dur_ns") / batch).alias("per_call_ns")
            )
            sysc.append(_tag(s, st))
        elif st["kind"] == "program":
            prog.append(_tag(_intervals(df, "", "program"), st))
        elif st["kind"] == "app":
            for proc in st.get("processes") or []:
                path = run_dir / proc["trace"]
                if path.exists():
                    prog.append(_tag(_intervals(reader.read(path, sort=False), f"{proc['name']}: ", "app"), st))
        elif st["kind"] == "pipeline":
            m = messages_from(df)
            if len(m):
                pipe.append(_tag(m, st))
            for sg in st.get("stages") or []:
                try:
                    sres = json.loads((run_dir / sg["json"]).read_text().strip().splitlines()[-1])
                except (OSError, json.JSONDecodeError, IndexError):
                    sres = {}
                row = {"rep": st["rep"], "phase": st["phase"], "probe": st["probe"], "role": sg["role"], "stage": sg["name"], "host": sg["host"]}
                for k in ("sent", "send_errors", "received", "forwarded", "unique", "lost", "duplicates", "reordered", "malformed", "full", "no_kernel_ts"):
                    row[k] = sres.get(k)
                stages.append(row)
    loads = pl.DataFrame(run.get("loads") or [], infer_schema_length=None) if run.get("loads") else pl.DataFrame()
    if len(loads):
        loads = loads.with_columns((pl.col("cpu_s") / pl.col("elapsed_s")).alias("cpu_util")).drop("exit")
    cat = lambda xs, schema: pl.concat(xs, how="vertical_relaxed") if xs else _empty(schema)  # noqa: E731
    return RunTables(
        run=run,
        spec=spec,
        provenance=prov,
        timer=cat(timer, {"thread": pl.UInt32, "t_ns": pl.Int64, "latency_ns": pl.Int64}),
        sched=cat(sched, {"cycle": pl.UInt32, "t_ns": pl.Int64, "wake_delay_ns": pl.Int64, "burst_ns": pl.Int64, "extra_ns": pl.Int64}),
        syscall=cat(sysc, {"call": pl.String, "batch": pl.UInt32, "t_ns": pl.Int64, "per_call_ns": pl.Float64}),
        loads=loads,
        steps=pl.DataFrame(stepsrows) if stepsrows else pl.DataFrame(schema={**STEP_COLS, "kind": pl.String}),
        results=results,
        pipeline=pl.concat(pipe, how="diagonal_relaxed") if pipe else pl.DataFrame(),
        stages=pl.DataFrame(stages, infer_schema_length=None) if stages else pl.DataFrame(),
        emulator=_emulator(run_dir, run),
        program=cat(prog, {"interval": pl.String, "tag": pl.UInt32, "tid": pl.Int64, "t_ns": pl.Int64, "dur_ns": pl.Int64, "kind": pl.String}),
    )


def _emulator(run_dir: Path, run: dict[str, Any]) -> dict[str, Any] | None:
    """The emulator's counts (when it ran), with what carried each path
    (``paths``) and the router kernel's own counts (``router_kernel``)."""
    em = run.get("emulator")
    paths, router = run.get("paths"), run.get("router_kernel")
    if not em and not paths:
        return None
    out: dict[str, Any] = {"links": [], "paths": paths or {}, "router_kernel": router}
    if em:
        try:
            out.update(json.loads((run_dir / em["json"]).read_text()))
        except (OSError, json.JSONDecodeError):
            return out if paths else None
        out["queueing"] = _emulator_queueing(run_dir / em["trace"], out)
    return out


def _emulator_queueing(trace: Path, em: dict[str, Any]) -> dict[str, Any]:
    """Per link, the emulator's own residence beyond the configured delay (its
    actual departure minus the packet's ready time: the rate queue plus its
    lateness) against the M/Er/1 model (``analysis/queueing.py``)."""
    import numpy as np

    from loopscope.analysis.queueing import fit

    if not trace.exists():
        return {}
    try:
        df = reader.read(trace, sort=False)
    except Exception:  # noqa: BLE001 - a damaged emulator trace costs this figure only
        return {}
    ev = df.filter(pl.col("name").cast(pl.String) == "forward")
    out: dict[str, Any] = {}
    names = [l["name"] for l in em.get("links") or []]
    for (tag,), g in ev.group_by(["tag"]):
        pay = [p for p in g["payload"].to_list() if p is not None and len(p) >= 32]
        if len(pay) < 200 or int(tag) >= len(names):
            continue
        a = np.frombuffer(b"".join(p[:32] for p in pay), dtype="<i8").reshape(len(pay), 4)
        f = fit((a[:, 3] - a[:, 1]).astype(np.float64))
        if f is not None:
            out[names[int(tag)]] = {**f.to_json(), "text": f.text()}
    return out
