"""Per-item macro events: an item followed through channels across hosts.

Paul et al. 2003 split an item's trip into (a) the sender's put, (b) the network
and (c) the receiver until the item was delivered. The channel runtime
records, per channel C (``crates/channels/src/inst.rs``): ``put:C`` and
``get:C`` intervals and ``send:C`` tagged with the item's timestamp,
``bytes:C`` events (the item's size) and ``arrived:C`` events whose value
is the sender's CLOCK_REALTIME send stamp. For every program or app step,
per channel and item (its timestamp's low 32 bits, the records' tag):

- **put**: the origin put (in the process where the item did not arrive
  from the network): its duration on the sender;
- **network**: from the origin's send (its ``send:C`` record, on the
  sender's clock) to the arrival at the consumer (on the consumer's), both
  placed on the run's global timeline (``clock/sync.py``: each host's
  CLOCK_REALTIME mapped to the reference's), so the figure holds across
  real machines; ``net_bound_ns`` is the two ends' sync bounds added (0
  when both ends are one host, null when the run has no clock sync and the
  hosts differ: then the raw REALTIME difference is used). Through a
  declared channel the item passes a hub (``via``): the hub's time is part
  of the network leg. ``net_raw_ns`` keeps the plain CLOCK_REALTIME
  difference (exact between namespaces of one machine, which share the
  clock; the timeline's figure carries the sync bound even there);
- **deliver**: from the arrival (or, in one process, the end of the put)
  to the end of the consumer's get, on the consumer's clock.

``RUN/tables/items.parquet``: one row per channel, item and consumer process
(``bytes``, ``put_ns``, ``net_ns``, ``net_bound_ns``, ``net_raw_ns``,
``deliver_ns``, ``total_ns``, ``via``).
"""

from __future__ import annotations

from typing import Any

import numpy as np
import polars as pl

from loopscope.analysis.steps import Kinds
from loopscope.clock.sync import RunClocks
from loopscope.rundir import RunRecord, Step
from loopscope.trace.files import Files
from loopscope.clock.sync import Pairs
from loopscope.analysis.steps import program_parts
from loopscope.clock import sync

SCHEMA = {
    "rep": pl.Int64,
    "phase": pl.String,
    "probe": pl.String,
    "channel": pl.String,
    "ts": pl.Int64,
    "bytes": pl.Int64,
    "producer": pl.String,
    "consumer": pl.String,
    "via": pl.String,
    "put_ns": pl.Int64,
    "net_ns": pl.Int64,
    "net_bound_ns": pl.Float64,
    "net_raw_ns": pl.Int64,
    "deliver_ns": pl.Int64,
    "total_ns": pl.Int64,
}


def _records(files: Files, trace: str) -> tuple[pl.DataFrame, Any] | None:

    got = files.trace_info(trace)
    if got is None:
        return None
    df, info = got
    df = df.filter(pl.col("group").cast(pl.String) == "chan").with_columns(pl.col("name").cast(pl.String))
    df = (
        df.filter(pl.col("name").str.contains(":", literal=True))
        .with_columns(pl.col("name").str.split_exact(":", 1).struct.rename_fields(["what", "channel"]).alias("n"))
        .unnest("n")
    )
    return df, Pairs.of(info.calibration)


class Placement:
    """Host CLOCK_REALTIME → the run's global clock, with bound."""

    def __init__(self, clocks: RunClocks | None) -> None:
        self.clocks = clocks

    @classmethod
    def of(cls, run: RunRecord, files: Files) -> Placement:
        """The run's placement: its clocks estimated when it has more than one host."""
        if len(run.hosts) <= 1:
            return cls(None)

        try:
            return cls(sync.estimate(run, files))
        except Exception:  # noqa: BLE001 - no placement: raw REALTIME, said by a null bound
            return cls(None)

    def diff(self, host_a: np.ndarray, rt_a: np.ndarray, host_b: np.ndarray, rt_b: np.ndarray, base: int = 0) -> tuple[np.ndarray, np.ndarray]:
        """rt_b (on host_b) − rt_a (on host_a) on the global clock, and its
        bound; the stamps are given less ``base``."""
        n = len(rt_a)
        d = (rt_b - rt_a).astype(np.float64)
        bound = np.where(host_a == host_b, 0.0, np.nan)
        if self.clocks is None or not n:
            return d, bound
        ga, gb = np.full(n, np.nan), np.full(n, np.nan)
        ba, bb = np.full(n, np.nan), np.full(n, np.nan)
        for h in set(host_a) | set(host_b):
            if h not in self.clocks.hosts:
                continue
            for host, rt, g, b in ((host_a, rt_a, ga, ba), (host_b, rt_b, gb, bb)):
                m = (host == h) & ~np.isnan(rt)
                if m.any():
                    x, e = self.clocks.map_real(h, rt[m].astype(np.int64) + base)
                    g[m], b[m] = x - base, e
        same = host_a == host_b
        placed = np.isfinite(ba) & np.isfinite(bb) & ~same
        d = np.where(placed, gb - ga, d)
        bound = np.where(same, 0.0, np.where(placed, ba + bb, np.nan))
        return d, bound


# an item got in the process that put it: no network between
_LOCAL = pl.col("arr_t").is_null() & (pl.col("producer") == pl.col("proc"))


def items(run: RunRecord, files: Files, kinds: Kinds, place: Placement | None = None) -> pl.DataFrame:
    """One row per item a step's programs passed on: who put it, who got it, and its put, network and delivery times."""
    place = place if place is not None else Placement.of(run, files)
    rows: list[pl.DataFrame] = []
    for st in run.steps:
        got = _step_records(st, run, files, kinds)
        if got is None:
            continue
        j = _placed(_joined(*got), place)
        rows.append(
            j.select(
                pl.lit(st.rep).alias("rep"),
                pl.lit(st.phase).alias("phase"),
                pl.lit(st.probe).alias("probe"),
                "channel",
                "ts",
                "bytes",
                "producer",
                pl.col("proc").alias("consumer"),
                "via",
                "put_ns",
                "net_ns",
                "net_bound_ns",
                "net_raw_ns",
                "deliver_ns",
                "total_ns",
            ).cast(SCHEMA)  # type: ignore[arg-type]
        )
    return pl.concat(rows) if rows else pl.DataFrame(schema=SCHEMA)


def _step_records(st: Step, run: RunRecord, files: Files, kinds: Kinds) -> tuple[pl.DataFrame, ...] | None:
    """A step's puts, arrivals, gets, sends and sizes over all its programs (None: nothing got)."""
    puts: list[Any] = []
    arrs: list[Any] = []
    gets: list[Any] = []
    sends: list[Any] = []
    sizes: list[Any] = []
    for part in program_parts(st, run, kinds):
        proc, host, trace = part.name, part.host, part.trace
        got = _records(files, trace)
        if got is None:
            continue
        df, pairs = got
        if not len(df):
            continue
        who = [pl.lit(proc).alias("proc"), pl.lit(host).alias("host")]
        p = df.filter(pl.col("what") == "put").select("channel", pl.col("tag").cast(pl.Int64).alias("ts"), "t_ns", "dur_ns")
        puts.append(p.with_columns(who))
        a = df.filter(pl.col("what") == "arrived").select("channel", pl.col("tag").cast(pl.Int64).alias("ts"), "t_ns", pl.col("value").alias("sent_rt"))
        sd = df.filter(pl.col("what") == "send").select("channel", pl.col("tag").cast(pl.Int64).alias("ts"), "t_ns")
        for frame, out in ((a, arrs), (sd, sends)):
            if len(frame) and len(pairs.mono):
                rt, _ = pairs.real_of(frame["t_ns"].to_numpy())
                frame = frame.with_columns(pl.Series("rt", np.asarray(rt, dtype=np.int64)))
            else:
                frame = frame.with_columns(pl.lit(None, dtype=pl.Int64).alias("rt"))
            out.append(frame.with_columns(who))
        sizes.append(df.filter(pl.col("what") == "bytes").select("channel", pl.col("tag").cast(pl.Int64).alias("ts"), pl.col("value").alias("bytes")))
        g = df.filter(pl.col("what") == "get").select("channel", pl.col("tag").cast(pl.Int64).alias("ts"), (pl.col("t_ns") + pl.col("dur_ns")).alias("got"))
        gets.append(g.with_columns(who))
    if not gets:
        return None
    return (
        pl.concat(puts),
        pl.concat(arrs, how="diagonal_relaxed"),
        pl.concat(gets),
        pl.concat(sends, how="diagonal_relaxed"),
        pl.concat(sizes).unique(["channel", "ts"], keep="first"),
    )


def _joined(P: pl.DataFrame, A: pl.DataFrame, G: pl.DataFrame, S: pl.DataFrame, B: pl.DataFrame) -> pl.DataFrame:
    """Each item got, joined to where it was put, where it arrived and the processes it passed through on its way."""
    # origin puts: in a process the item did not arrive in from the network
    O = P.join(A.select("channel", "ts", "proc"), on=["channel", "ts", "proc"], how="anti").unique(["channel", "ts"], keep="first", maintain_order=True)
    O = O.join(
        S.select("channel", "ts", "proc", pl.col("rt").alias("origin_rt")).unique(["channel", "ts", "proc"], keep="first"),
        on=["channel", "ts", "proc"],
        how="left",
    )
    relays = A.join(O.select("channel", "ts", pl.col("proc").alias("origin")), on=["channel", "ts"], how="left")
    j = G.join(
        A.select("channel", "ts", "proc", pl.col("t_ns").alias("arr_t"), pl.col("rt").alias("arr_rt"), "sent_rt").unique(
            ["channel", "ts", "proc"], keep="first"
        ),
        on=["channel", "ts", "proc"],
        how="left",
    )
    j = j.join(
        O.select(
            "channel",
            "ts",
            pl.col("proc").alias("producer"),
            pl.col("host").alias("origin_host"),
            pl.col("t_ns").alias("put_t"),
            pl.col("dur_ns").alias("put_ns"),
            "origin_rt",
        ),
        on=["channel", "ts"],
        how="left",
    )
    # the processes an item arrived in on its way, other than the consumer (a declared channel's hub)
    via = (
        relays.join(j.select("channel", "ts", pl.col("proc").alias("consumer")).unique(), on=["channel", "ts"])
        .filter((pl.col("proc") != pl.col("consumer")) & (pl.col("proc") != pl.col("origin").fill_null("")))
        .group_by(["channel", "ts", "consumer"])
        .agg(pl.col("proc").unique().sort().str.join(",").alias("via"))
    )
    j = j.join(via, left_on=["channel", "ts", "proc"], right_on=["channel", "ts", "consumer"], how="left").join(B, on=["channel", "ts"], how="left")
    local = _LOCAL
    j = j.with_columns(
        pl.when(local).then(0).otherwise(pl.col("arr_rt") - pl.col("origin_rt").fill_null(pl.col("sent_rt"))).alias("net_raw_ns"),
        pl.when(local).then(pl.col("got") - pl.col("put_t") - pl.col("put_ns")).otherwise(pl.col("got") - pl.col("arr_t")).alias("deliver_ns"),
    ).filter(pl.col("deliver_ns").is_not_null())
    return j


def _placed(j: pl.DataFrame, place: Placement) -> pl.DataFrame:
    """The network's share on one timeline (each host's clock mapped), with its bound, and the total."""
    # network on the timeline: origin send (its host) → arrival (the consumer's host)
    # REALTIME stamps less a common base before they become floats (NaN
    # marks a missing one): float64 keeps ns only below 2^53
    base = int(j["arr_rt"].min() or j["sent_rt"].min() or 0)  # type: ignore[arg-type]
    src_rt = (j["origin_rt"].fill_null(j["sent_rt"]) - base).to_numpy().astype(np.float64)
    dst_rt = (j["arr_rt"] - base).to_numpy().astype(np.float64)
    ha = j["origin_host"].fill_null("").to_numpy().astype(str)
    hb = j["host"].to_numpy().astype(str)
    d, bound = place.diff(ha, src_rt, hb, dst_rt, base)
    isloc = j.select(_LOCAL.fill_null(False)).to_series().to_numpy()
    net = np.where(isloc, 0.0, d)
    bound = np.where(isloc, 0.0, bound)
    j = j.with_columns(
        pl.Series("net_ns", np.where(np.isfinite(net), net, np.nan)).fill_nan(None).round(0).cast(pl.Int64), pl.Series("net_bound_ns", bound).fill_nan(None)
    )
    j = j.with_columns((pl.col("put_ns") + pl.col("net_ns") + pl.col("deliver_ns")).alias("total_ns"))
    return j
