"""Where a pipeline thread's time goes: application, blocking, runtime, messaging.

Paul et al. 2003 split every thread of a Stampede pipeline into application logic,
blocking (waiting for an item or for room), runtime (the channel's own
work) and messaging (moving bytes over the network), with the shares of
memory allocation and locking inside the last two (its Figures 7–8). The
channel runtime logs those boundaries itself (``crates/channels/src/
inst.rs``: group ``chan``), so every thread of a ``program`` or ``app``
probe that used channels can be split the same way, from its trace alone.

Each nanosecond of a thread's window (its first to its last record in the
step) goes to the innermost boundary that covers it, by precedence:

1. ``messaging``: ``chan/send``, ``chan/recv``, and ``chan/alloc`` (the
   buffer a received item lands in; reported as ``alloc`` within messaging);
2. ``runtime: lock``: a channel lock that took long enough to be logged;
3. ``blocking``: ``chan/block`` (the thread waited; the network it pumped
   meanwhile is messaging, above);
4. ``runtime``: the rest of ``chan/put`` and ``chan/get``;
5. ``application``: everything else.

Result: one row per step, thread and category (``ns``, ``share`` of the
window), written to ``RUN/tables/breakdown.parquet``.

**Per item size** (``by_size``): each put and get call of a thread split
the same way (blocking, runtime, lock, messaging, allocation inside the
call; a put of an item that arrived in that process is a ``store``: on
a hub it includes pushing the item on), joined with its item's size (the ``chan/bytes:C`` record of the
put, from whichever process of the step made it) and averaged per
process, channel, call and size, per phase: the shape of Paul et al. 2003's
per-size figures, from one run whose items vary in size.
``RUN/tables/breakdown_size.parquet``.
"""

from __future__ import annotations


import numpy as np
import polars as pl
from loopscope.analysis.registry import Registry
from loopscope.rundir import RunRecord
from loopscope.trace.files import Files
from loopscope.analysis.steps import program_parts

# innermost first: a nanosecond covered by several goes to the first
LAYERS = [("messaging: alloc", ["alloc"]), ("messaging", ["send", "recv"]), ("runtime: lock", ["lock"]), ("blocking", ["block"]), ("runtime", ["put", "get"])]
CATEGORIES = ["application", "blocking", "runtime", "runtime: lock", "messaging", "messaging: alloc"]


def _union(s: np.ndarray, e: np.ndarray) -> list[tuple[int, int]]:
    out: list[tuple[int, int]] = []
    for a, b in sorted(zip(s.tolist(), e.tolist())):
        if out and a <= out[-1][1]:
            out[-1] = (out[-1][0], max(out[-1][1], b))
        else:
            out.append((a, b))
    return out


def _minus(a: list[tuple[int, int]], b: list[tuple[int, int]]) -> list[tuple[int, int]]:
    """Intervals of ``a`` not covered by ``b`` (both sorted, disjoint)."""
    out = []
    j = 0
    for x, y in a:
        cur = x
        while j < len(b) and b[j][1] <= cur:
            j += 1
        k = j
        while k < len(b) and b[k][0] < y:
            if b[k][0] > cur:
                out.append((cur, b[k][0]))
            cur = max(cur, b[k][1])
            k += 1
        if cur < y:
            out.append((cur, y))
    return out


def _layers(df: pl.DataFrame) -> dict[str, list[tuple[int, int]]]:
    """One thread's ``chan`` intervals → the disjoint time of each layer
    (innermost first: a nanosecond covered by several goes to the first)."""
    ch = df.filter((pl.col("group") == "chan") & (pl.col("kind") == "interval")).with_columns(pl.col("name").str.split(":").list.first().alias("name"))
    out: dict[str, list[tuple[int, int]]] = {}
    taken: list[tuple[int, int]] = []
    for cat, names in LAYERS:
        g = ch.filter(pl.col("name").is_in(names))
        if not len(g):
            continue
        u = _union(g["t_ns"].to_numpy(), (g["t_ns"] + g["dur_ns"]).to_numpy())
        mine = _minus(u, taken)
        out[cat] = out.get(cat, []) + mine
        taken = _union(np.array([a for a, _ in taken + mine], dtype=np.int64), np.array([b for _, b in taken + mine], dtype=np.int64))
    return out


def split_thread(df: pl.DataFrame) -> dict[str, int]:
    """One thread's records (t_ns, dur_ns, group, name, kind) → ns per category."""
    if not len(df):
        return {}
    t0 = int(df["t_ns"].min())  # type: ignore[arg-type]
    t1 = int((df["t_ns"] + df["dur_ns"].fill_null(0)).max())  # type: ignore[arg-type]
    out = {c: 0 for c in CATEGORIES}
    for cat, iv in _layers(df).items():
        out[cat] += sum(b - a for a, b in iv)
    out["application"] = max(0, (t1 - t0) - sum(v for k, v in out.items() if k != "application"))
    return out


def _covered(iv: list[tuple[int, int]], s: np.ndarray, e: np.ndarray) -> np.ndarray:
    """How much of each window [s, e) the disjoint intervals ``iv`` cover."""
    if not iv:
        return np.zeros(len(s), dtype=np.int64)
    iv = sorted(iv)
    a = np.array([x for x, _ in iv], dtype=np.int64)
    b = np.array([y for _, y in iv], dtype=np.int64)
    cum = np.concatenate([[0], np.cumsum(b - a)])

    def before(x: np.ndarray) -> np.ndarray:  # covered time before x
        k = np.searchsorted(a, x, side="right")  # intervals starting at or before x
        part = np.where(k > 0, np.minimum(x, b[np.maximum(k - 1, 0)]) - a[np.maximum(k - 1, 0)], 0)
        return np.asarray(cum[np.maximum(k - 1, 0)] * (k > 0) + np.maximum(part, 0))

    return np.asarray(before(e) - before(s))


CALL_CATEGORIES = ["blocking", "runtime", "runtime: lock", "messaging", "messaging: alloc"]


def split_calls(df: pl.DataFrame) -> pl.DataFrame:
    """One thread's records → one row per put/get call (channel, what, ts,
    dur_ns) with the ns of each layer inside it (runtime: the rest)."""
    calls = (
        df.filter((pl.col("group") == "chan") & (pl.col("kind") == "interval") & pl.col("name").str.contains(r"^(put|get):"))
        .select(
            pl.col("name").str.split_exact(":", 1).struct.rename_fields(["what", "channel"]).alias("n"),
            pl.col("tag").cast(pl.Int64).alias("ts"),
            "t_ns",
            "dur_ns",
        )
        .unnest("n")
    )
    if not len(calls):
        return calls
    s = calls["t_ns"].to_numpy()
    e = s + calls["dur_ns"].to_numpy()
    layers = _layers(df)
    cols = {}
    for cat in CALL_CATEGORIES:
        if cat != "runtime":
            cols[cat] = _covered(layers.get(cat, []), s, e)
    cols["runtime"] = np.maximum(0, (e - s) - sum(cols.values()))
    return calls.with_columns(*[pl.Series(c, v) for c, v in cols.items()])


def breakdown(run: RunRecord, files: Files, kinds: Registry) -> pl.DataFrame:
    """Every thread of every program/app step whose trace has ``chan`` records."""

    rows = []
    for st in run.steps:
        parts = [(p.name, p.trace) for p in program_parts(st, run, kinds)]
        for proc, trace in parts:
            df = files.trace(trace)
            if df is None or not len(df) or not (df["group"].cast(pl.String) == "chan").any():
                continue
            df = df.with_columns(
                pl.col("group").cast(pl.String), pl.col("name").cast(pl.String), pl.col("kind").cast(pl.String), pl.col("thread").cast(pl.String)
            )
            df = df.filter(pl.col("group") != "loopscope")
            for (tid, thread), g in df.group_by(["tid", "thread"], maintain_order=True):
                if not (g["group"] == "chan").any():
                    continue
                parts_ns = split_thread(g)
                total = sum(parts_ns.values())
                for cat, ns in parts_ns.items():
                    rows.append(
                        {
                            "rep": st.rep,
                            "phase": st.phase,
                            "probe": st.probe,
                            "process": proc,
                            "tid": int(tid),
                            "thread": str(thread),
                            "category": cat,
                            "ns": int(ns),
                            "share": ns / total if total else None,
                        }
                    )
    return (
        pl.DataFrame(rows)
        if rows
        else pl.DataFrame(
            schema={
                "rep": pl.Int64,
                "phase": pl.String,
                "probe": pl.String,
                "process": pl.String,
                "tid": pl.Int64,
                "thread": pl.String,
                "category": pl.String,
                "ns": pl.Int64,
                "share": pl.Float64,
            }
        )
    )


SIZE_SCHEMA = {
    "rep": pl.Int64,
    "phase": pl.String,
    "probe": pl.String,
    "process": pl.String,
    "channel": pl.String,
    "call": pl.String,
    "bytes": pl.Int64,
    "calls": pl.Int64,
    "mean_ns": pl.Float64,
    **{f"{c}_ns": pl.Float64 for c in CALL_CATEGORIES},
}


def by_size(run: RunRecord, files: Files, kinds: Registry) -> pl.DataFrame:
    """Mean time of a put or get per item size, split into layers."""

    out = []
    for st in run.steps:
        calls, sizes = [], []
        for part in program_parts(st, run, kinds):
            df = files.trace(part.trace)
            if df is None:
                continue
            df = df.with_columns(pl.col("group").cast(pl.String), pl.col("name").cast(pl.String), pl.col("kind").cast(pl.String)).filter(
                pl.col("group") == "chan"
            )
            if not len(df):
                continue
            b = df.filter(pl.col("name").str.starts_with("bytes:"))
            arrived = df.filter(pl.col("name").str.starts_with("arrived:")).select(
                pl.col("name").str.slice(8).alias("channel"), pl.col("tag").cast(pl.Int64).alias("ts")
            )
            sizes.append(b.select(pl.col("name").str.slice(6).alias("channel"), pl.col("tag").cast(pl.Int64).alias("ts"), pl.col("value").alias("bytes")))
            for _, g in df.group_by("tid"):
                c = split_calls(g)
                if len(c):
                    # a put of an item that arrived here stores it (and, on a hub, pushes it on)
                    c = (
                        c.join(arrived.unique().with_columns(pl.lit(True).alias("arr")), on=["channel", "ts"], how="left")
                        .with_columns(
                            pl.when((pl.col("what") == "put") & pl.col("arr").fill_null(False)).then(pl.lit("store")).otherwise(pl.col("what")).alias("what")
                        )
                        .drop("arr")
                    )
                    calls.append(c.with_columns(pl.lit(part.name).alias("process")))
        if not calls or not sizes:
            continue
        C = pl.concat(calls).join(pl.concat(sizes).unique(["channel", "ts"], keep="first"), on=["channel", "ts"], how="inner")
        agg = (
            C.group_by(["process", "channel", "what", "bytes"])
            .agg(pl.len().alias("calls"), pl.col("dur_ns").mean().alias("mean_ns"), *[pl.col(c).mean().alias(f"{c}_ns") for c in CALL_CATEGORIES])
            .sort(["process", "channel", "what", "bytes"])
        )
        out.append(
            agg.select(
                pl.lit(st.rep).alias("rep"),
                pl.lit(st.phase).alias("phase"),
                pl.lit(st.probe).alias("probe"),
                "process",
                "channel",
                pl.col("what").alias("call"),
                "bytes",
                "calls",
                "mean_ns",
                *[f"{c}_ns" for c in CALL_CATEGORIES],
            ).cast(SIZE_SCHEMA)  # type: ignore[arg-type]
        )
    return pl.concat(out) if out else pl.DataFrame(schema=SIZE_SCHEMA)
