"""Per-item macro events: an item followed through channels across hosts.

seeds/001 split an item's trip into (a) the sender's put, (b) the network
and (c) the receiver until the item was delivered. The channel runtime
records, per channel C (``crates/channels/src/inst.rs``): ``put:C`` and
``get:C`` intervals and ``send:C`` tagged with the item's timestamp, and
``arrived:C`` events whose value is the sender's CLOCK_REALTIME send stamp.
For every program or app step, per channel and item (its timestamp's low 32
bits, the records' tag):

- **put**: the origin put (in the process where the item did not arrive
  from the network): its duration on the sender;
- **network**: the arrival's CLOCK_REALTIME (from the receiving trace's
  own calibration pairs) minus the sender's send stamp: exact between
  namespaces of one machine (one CLOCK_REALTIME), as good as the hosts'
  clock sync otherwise;
- **deliver**: from the arrival (or, in one process, the end of the put)
  to the end of the consumer's get, on the consumer's clock.

``RUN/tables/items.parquet``: one row per channel, item and consumer process
(``put_ns``, ``net_ns``, ``deliver_ns``, ``total_ns``).
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

import numpy as np
import polars as pl

SCHEMA = {"rep": pl.Int64, "phase": pl.String, "probe": pl.String, "channel": pl.String, "ts": pl.Int64, "producer": pl.String, "consumer": pl.String,
          "put_ns": pl.Int64, "net_ns": pl.Int64, "deliver_ns": pl.Int64, "total_ns": pl.Int64}


def _records(run_dir: Path, trace: str) -> tuple[pl.DataFrame, Any]:
    from loopscope.clock.sync import Pairs
    from loopscope.trace import reader

    df, info = reader.read_with_info(run_dir / trace, sort=False)
    df = df.filter(pl.col("group").cast(pl.String) == "chan").with_columns(pl.col("name").cast(pl.String))
    df = df.filter(pl.col("name").str.contains(":", literal=True)).with_columns(
        pl.col("name").str.split_exact(":", 1).struct.rename_fields(["what", "channel"]).alias("n"),
    ).unnest("n")
    return df, Pairs.of(info.calibration)


def items(run_dir: Path, run: dict[str, Any]) -> pl.DataFrame:
    from loopscope.analysis.steps import program_parts

    rows: list[pl.DataFrame] = []
    for st in run.get("steps") or []:
        parts = [(p.name, p.trace) for p in program_parts(st, run)]
        puts, arrs, gets = [], [], []
        for proc, trace in parts:
            if not (run_dir / trace).exists():
                continue
            df, pairs = _records(run_dir, trace)
            if not len(df):
                continue
            p = df.filter(pl.col("what") == "put").select("channel", pl.col("tag").cast(pl.Int64).alias("ts"), "t_ns", "dur_ns")
            puts.append(p.with_columns(pl.lit(proc).alias("proc")))
            a = df.filter(pl.col("what") == "arrived").select("channel", pl.col("tag").cast(pl.Int64).alias("ts"), "t_ns", pl.col("value").alias("sent_rt"))
            if len(a) and len(pairs.mono):
                rt, _ = pairs.real_of(a["t_ns"].to_numpy())
                a = a.with_columns(pl.Series("arr_rt", np.asarray(rt, dtype=np.int64)))
            else:
                a = a.with_columns(pl.lit(None, dtype=pl.Int64).alias("arr_rt"))
            arrs.append(a.with_columns(pl.lit(proc).alias("proc")))
            g = df.filter(pl.col("what") == "get").select("channel", pl.col("tag").cast(pl.Int64).alias("ts"), (pl.col("t_ns") + pl.col("dur_ns")).alias("got"))
            gets.append(g.with_columns(pl.lit(proc).alias("proc")))
        if not gets:
            continue
        P = pl.concat(puts)
        A = pl.concat(arrs, how="diagonal_relaxed")
        G = pl.concat(gets)
        # origin puts: in a process the item did not arrive in from the network
        O = P.join(A.select("channel", "ts", "proc"), on=["channel", "ts", "proc"], how="anti").unique(["channel", "ts"], keep="first", maintain_order=True)
        j = G.join(A.select("channel", "ts", "proc", pl.col("t_ns").alias("arr_t"), "arr_rt", "sent_rt").unique(["channel", "ts", "proc"], keep="first"), on=["channel", "ts", "proc"], how="left")
        j = j.join(O.select("channel", "ts", pl.col("proc").alias("producer"), pl.col("t_ns").alias("put_t"), pl.col("dur_ns").alias("put_ns")), on=["channel", "ts"], how="left")
        local = pl.col("arr_t").is_null() & (pl.col("producer") == pl.col("proc"))
        j = j.with_columns(
            pl.when(local).then(0).otherwise(pl.col("arr_rt") - pl.col("sent_rt")).alias("net_ns"),
            pl.when(local).then(pl.col("got") - pl.col("put_t") - pl.col("put_ns")).otherwise(pl.col("got") - pl.col("arr_t")).alias("deliver_ns"),
        ).filter(pl.col("deliver_ns").is_not_null())
        j = j.with_columns((pl.col("put_ns") + pl.col("net_ns") + pl.col("deliver_ns")).alias("total_ns"))
        rows.append(j.select(
            pl.lit(st["rep"]).alias("rep"), pl.lit(st["phase"]).alias("phase"), pl.lit(st["probe"]).alias("probe"), "channel", "ts", "producer",
            pl.col("proc").alias("consumer"), "put_ns", "net_ns", "deliver_ns", "total_ns",
        ).cast(SCHEMA))  # type: ignore[arg-type]
    return pl.concat(rows) if rows else pl.DataFrame(schema=SCHEMA)
