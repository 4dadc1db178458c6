"""Where a pipeline thread's time goes: application, blocking, runtime, messaging.

seeds/001 split every thread of a Stampede pipeline into application logic,
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
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

import numpy as np
import polars as pl

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


def split_thread(df: pl.DataFrame) -> dict[str, int]:
    """One thread's records (t_ns, dur_ns, group, name, kind) → ns per category."""
    if not len(df):
        return {}
    t0 = int(df["t_ns"].min())  # type: ignore[arg-type]
    t1 = int((df["t_ns"] + df["dur_ns"].fill_null(0)).max())  # type: ignore[arg-type]
    # per-channel entities are named `put:<channel>`: the layer is the part before the colon
    ch = df.filter((pl.col("group") == "chan") & (pl.col("kind") == "interval")).with_columns(pl.col("name").str.split(":").list.first().alias("name"))
    out = {c: 0 for c in CATEGORIES}
    taken: list[tuple[int, int]] = []
    for cat, names in LAYERS:
        g = ch.filter(pl.col("name").is_in(names))
        if not len(g):
            continue
        u = _union(g["t_ns"].to_numpy(), (g["t_ns"] + g["dur_ns"]).to_numpy())
        mine = _minus(u, taken)
        out[cat] += sum(b - a for a, b in mine)
        taken = _union(np.array([a for a, _ in taken + mine], dtype=np.int64), np.array([b for _, b in taken + mine], dtype=np.int64))
    out["application"] = max(0, (t1 - t0) - sum(v for k, v in out.items() if k != "application"))
    return out


def breakdown(run_dir: Path, run: dict[str, Any]) -> pl.DataFrame:
    """Every thread of every program/app step whose trace has ``chan`` records."""
    from loopscope.analysis.steps import program_parts
    from loopscope.trace import reader

    rows = []
    for st in run.get("steps") or []:
        parts = [(p.name, p.trace) for p in program_parts(st, run)]
        for proc, trace in parts:
            path = run_dir / trace
            if not path.exists():
                continue
            df = reader.read(path, sort=False)
            if not len(df) or not (df["group"].cast(pl.String) == "chan").any():
                continue
            df = df.with_columns(pl.col("group").cast(pl.String), pl.col("name").cast(pl.String), pl.col("kind").cast(pl.String), pl.col("thread").cast(pl.String))
            df = df.filter(pl.col("group") != "loopscope")
            for (tid, thread), g in df.group_by(["tid", "thread"], maintain_order=True):
                if not (g["group"] == "chan").any():
                    continue
                parts_ns = split_thread(g)
                total = sum(parts_ns.values())
                for cat, ns in parts_ns.items():
                    rows.append({"rep": st["rep"], "phase": st["phase"], "probe": st["probe"], "process": proc, "tid": int(tid), "thread": str(thread),
                                 "category": cat, "ns": int(ns), "share": ns / total if total else None})
    return pl.DataFrame(rows) if rows else pl.DataFrame(schema={"rep": pl.Int64, "phase": pl.String, "probe": pl.String, "process": pl.String, "tid": pl.Int64, "thread": pl.String, "category": pl.String, "ns": pl.Int64, "share": pl.Float64})
