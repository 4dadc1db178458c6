"""Reading traces into tables.

The native reader returns one numpy array per column (owning the Rust
memory) plus the file's metadata; this module turns them into a polars
DataFrame without touching records one by one in Python: names come from
gathering small categorical tables by the records' numeric ids, nulls from
masks over the record types. A trace that was cut off or has damaged chunks
still reads; what was lost is in ``TraceInfo.stats`` and every reader
(``info``, ``dump``, reports) shows it.

Columns of ``read(path)``:

==========  =========  ======================================================
t_ns        Int64      CLOCK_MONOTONIC of the writing host, ns
host        Cat        host name of the writer
thread      Cat        name of the thread that logged the record
tid         UInt32     its kernel thread id
stream      Cat        stream the record was logged to
dump        UInt32     flight-recorder dump number (0: normal stream)
group       Cat        entity group
name        Cat        entity name
kind        Enum       event | interval | counter | histogram
tag         UInt32     the caller's tag (counters/histograms: 0 log, 1 reset)
dur_ns      Int64      interval duration (null for other kinds)
value       Int64      event value, counter value, histogram count (else null)
payload     Binary     event payload bytes (else null)
==========  =========  ======================================================
"""

from __future__ import annotations

import json
import os
import threading
from contextlib import contextmanager
from dataclasses import dataclass, field
from typing import Any, Iterator, NotRequired, TypedDict

import numpy as np
import polars as pl
import nanoarrow as na

from loopscope import _native
from loopscope.once import Once

KINDS = ["event", "interval", "counter", "histogram"]
# Record type (format.rs `rec`) -> index into KINDS; 255 for types that are not records.
_RTYPE_KIND = np.full(64, 255, dtype=np.uint8)
_RTYPE_KIND[[1, 2, 3]] = 0
_RTYPE_KIND[4] = 1
_RTYPE_KIND[5] = 2
_RTYPE_KIND[6] = 3
_VALUE_TYPES = [2, 5, 6]  # event with value, counter, histogram
REC_EVENT_PAYLOAD = 3
REC_INTERVAL = 4


# The trace file's metadata as the native reader gives it: one TypedDict per
# chunk kind, the same fields as the Rust side's structs (crates/trace
# format.rs and reader.rs), so a field renamed there fails the checker here.


class StreamInfo(TypedDict):
    id: int
    name: str
    #: "normal" or "ring"
    kind: str
    groups: list[str]
    buffer_bytes: int


class EntityInfo(TypedDict):
    id: int
    group: str
    name: str
    kind: str
    desc: str
    #: a histogram's bucket scale (``trace.api.histogram``)
    histogram: NotRequired[object]


class ThreadInfo(TypedDict):
    index: int
    tid: int
    name: str


class DumpInfo(TypedDict):
    """A flight-recorder dump of a ring stream."""

    stream: int
    dump: int
    tag: int
    trigger_raw: int
    overwritten_bytes: int


class ConfigChange(TypedDict):
    """A run-time switch of a group on a stream."""

    raw: int
    stream: int
    group: str
    enabled: bool


class CalPair(TypedDict):
    """One calibration read: CLOCK_MONOTONIC, CLOCK_REALTIME (with its read error) and the raw counter."""

    mono_ns: int
    realtime_ns: int
    realtime_err_ns: int
    raw: int
    raw_err: int


class EndInfo(TypedDict):
    """The writer's totals at close."""

    end_mono_ns: int
    bytes_written: int
    lost_records: int
    lost_by_stream: list[int]
    dumps: int
    error: str | None


class ReadStats(TypedDict):
    """What the reader found of the file's integrity."""

    file_bytes: int
    chunks: int
    data_chunks: int
    damaged_chunks: int
    damaged_bytes: int
    truncated_bytes: int
    unknown_chunks: int
    records: int
    lost_records: int
    lost_by_stream: list[int]
    orphan_records: int
    closed: bool
    version: list[int]
    problems: list[str]


@dataclass
class TraceInfo:
    """A trace's metadata and what the reader found about its integrity."""

    path: str
    host: str
    pid: int
    process: str
    clock: str
    clock_reason: str
    raw_hz: float
    version: tuple[int, int]
    start_realtime_ns: int
    streams: list[StreamInfo]
    entities: list[EntityInfo]
    threads: list[ThreadInfo]
    dumps: list[DumpInfo]
    changes: list[ConfigChange]
    calibration: list[CalPair]
    end: EndInfo | None
    stats: ReadStats
    counts: dict[int, int] = field(default_factory=dict)
    t_first_ns: int | None = None
    t_last_ns: int | None = None
    # "mlockall" / "mlockall failed: …" when LOOPSCOPE_MLOCKALL asked the writer to lock memory
    memory_locked: str | None = None

    @property
    def records(self) -> int:
        return int(self.stats["records"])

    @property
    def lost_records(self) -> int:
        return int(self.stats["lost_records"])

    @property
    def damaged(self) -> bool:
        s = self.stats
        return bool(s["damaged_chunks"] or s["truncated_bytes"] or s["orphan_records"])

    def loss_lines(self) -> list[str]:
        """One line per kind of loss, empty when nothing was lost."""
        s = self.stats
        out = []
        if s["lost_records"]:
            out.append(f"{s['lost_records']} records dropped by the writer (buffers full); per stream: {s['lost_by_stream']}")
        if s["damaged_chunks"]:
            out.append(f"{s['damaged_chunks']} damaged chunks skipped ({s['damaged_bytes']} bytes)")
        if s["truncated_bytes"]:
            out.append(f"file cut off: {s['truncated_bytes']} bytes at the end lost")
        if s["orphan_records"]:
            out.append(f"{s['orphan_records']} records skipped: their names were in a damaged chunk")
        if not s["closed"]:
            out.append("the writer did not close the file (process killed or still running)")
        return out


def _info_from(path: str, meta: dict[str, Any]) -> TraceInfo:
    i = meta["info"]
    return TraceInfo(
        path=path,
        host=i["host"],
        pid=i["pid"],
        process=i["process"],
        clock=i["clock"],
        clock_reason=i["clock_reason"],
        raw_hz=i["raw_hz"],
        version=tuple(meta["stats"]["version"]),
        start_realtime_ns=i["start_realtime_ns"],
        streams=i["streams"],
        entities=meta["entities"],
        threads=meta["threads"],
        dumps=meta["dumps"],
        changes=meta["changes"],
        calibration=meta["calibration"],
        end=meta["end"],
        stats=meta["stats"],
        memory_locked=i.get("memory_locked"),
    )


def _load(path: str | os.PathLike[str], sort: bool, count_only: bool = False) -> tuple[dict[str, np.ndarray], TraceInfo]:
    global opened
    with _opened_lock:  # a report's two threads read traces side by side
        opened += 1
    p = os.fspath(path)
    cols, meta = _native.read_trace(p, sort, count_only)
    return cols, _info_from(p, json.loads(meta))


def _enum_table(labels: list[str]) -> pl.Series:
    """A small lookup series: labels (repeats allowed) typed as an Enum of the distinct ones."""
    return pl.Series(labels, dtype=pl.Enum(list(dict.fromkeys(labels))))


def _frame(cols: dict[str, np.ndarray], info: TraceInfo) -> pl.DataFrame:
    """Columns -> DataFrame. Names are Enum gathers by id, done in one
    ``select`` so polars spreads them over the cores."""
    n = len(cols["t_ns"])
    max_id = max([e["id"] for e in info.entities], default=0)
    groups = ["?"] * (max_id + 1)
    names = ["?"] * (max_id + 1)
    for e in info.entities:
        groups[e["id"]] = e["group"]
        names[e["id"]] = e["name"]
    n_threads = max([t["index"] + 1 for t in info.threads] + [int(cols["thread"].max(initial=0)) + 1])
    tnames = [f"thread-{i}" for i in range(n_threads)]
    tids = [0] * n_threads
    for t in info.threads:
        tnames[t["index"]] = t["name"] or f"tid-{t['tid']}"
        tids[t["index"]] = t["tid"]
    snames = [s["name"] for s in info.streams] or ["main"]
    kinds = [None] + [KINDS[k] if k != 255 else None for k in _RTYPE_KIND[1:7]]
    raw = pl.DataFrame(
        {
            "t_ns": cols["t_ns"],
            "thread_i": cols["thread"],
            "stream_i": cols["stream"],
            "dump": cols["dump"],
            "entity": cols["entity"],
            "rtype": cols["rtype"],
            "tag": cols["tag"],
            "dur_ns": cols["dur_ns"],
            "value": cols["value"],
        }
    )
    if len(cols["payload_off"]):
        # An Arrow large-binary array over the decoder's own buffers (offsets, bytes), no copy into Python objects.
        arr = na.c_array_from_buffers(na.large_binary(), n, [None, cols["payload_off"], cols["payload"]])
        raw = raw.with_columns(pl.Series(arr, dtype=pl.Binary).alias("payload"))
    else:
        raw = raw.with_columns(pl.lit(None, dtype=pl.Binary).alias("payload"))
    rt = pl.col("rtype")
    return raw.select(
        "t_ns",
        pl.lit(info.host, dtype=pl.Enum([info.host])).alias("host"),
        pl.lit(_enum_table(tnames)).gather("thread_i").alias("thread"),
        pl.lit(pl.Series(tids, dtype=pl.UInt32)).gather("thread_i").alias("tid"),
        pl.lit(_enum_table(snames)).gather(pl.col("stream_i").cast(pl.UInt32)).alias("stream"),
        "dump",
        pl.lit(_enum_table(groups)).gather("entity").alias("group"),
        pl.lit(_enum_table(names)).gather("entity").alias("name"),
        pl.lit(pl.Series(kinds, dtype=pl.Enum(KINDS))).gather(rt.cast(pl.UInt32)).alias("kind"),
        "tag",
        pl.when(rt == REC_INTERVAL).then("dur_ns").alias("dur_ns"),
        pl.when(rt.is_in(_VALUE_TYPES)).then("value").alias("value"),
        pl.when(rt == REC_EVENT_PAYLOAD).then("payload").alias("payload"),
    )


def read(path: str | os.PathLike[str], *, sort: bool = True) -> pl.DataFrame:
    """Read a trace into a DataFrame (columns in the module text).

    Records are sorted by ``t_ns`` (stable) unless ``sort=False``, which
    keeps file order: each thread's records in the order it logged them.
    Damage and loss do not raise; see ``info(path)``.
    """
    return read_with_info(path, sort=sort)[0]


def read_with_info(path: str | os.PathLike[str], *, sort: bool = True) -> tuple[pl.DataFrame, TraceInfo]:
    """``read`` plus the metadata, from one pass over the file."""
    got = _from_shared(path)
    if got is not None:
        df, info = got
        return (df.sort("t_ns", maintain_order=True) if sort else df), info
    cols, info = _load(path, sort)
    df = _frame(cols, info)
    _fill_counts(info, cols)
    return df, info


# ---- reading a file once --------------------------------------------------------------
#
# A report reads every trace of a run, and several of its parts (the tables,
# the timeline, explain, the clocks) read the same files. Inside ``shared()``
# each file is read once, in file order, and every later read (sorted or
# not, or only its metadata) comes from that one read. ``opened`` counts the
# files actually read, so a benchmark and a test can see it.

_shared: Once | None = None
opened = 0
_opened_lock = threading.Lock()


@contextmanager
def shared() -> Iterator[None]:
    """Within: each trace file is read once (keyed by path, size and mtime)."""
    global _shared
    outer = _shared
    if outer is None:
        _shared = Once()
    try:
        yield
    finally:
        if outer is None:
            _shared = None


def _from_shared(path: str | os.PathLike[str]) -> tuple[pl.DataFrame, TraceInfo] | None:
    if _shared is None:
        return None
    p = os.fspath(path)
    st = os.stat(p)

    def load() -> tuple[pl.DataFrame, TraceInfo]:
        cols, info = _load(p, False)
        _fill_counts(info, cols)
        return _frame(cols, info), info

    return _shared.get((os.path.realpath(p), st.st_size, st.st_mtime_ns), load)


def _fill_counts(info: TraceInfo, cols: dict[str, np.ndarray]) -> None:
    ids, counts = np.unique(cols["entity"], return_counts=True)
    info.counts = {int(i): int(c) for i, c in zip(ids, counts)}
    t = cols["t_ns"]
    if len(t):
        info.t_first_ns = int(t.min())
        info.t_last_ns = int(t.max())


def info(path: str | os.PathLike[str]) -> TraceInfo:
    """Metadata, per-entity record counts, time span, losses and damage."""
    got = _from_shared(path)
    if got is not None:
        return got[1]
    cols, inf = _load(path, sort=False)
    _fill_counts(inf, cols)
    return inf


def check(path: str | os.PathLike[str]) -> TraceInfo:
    """Metadata and integrity only (records counted, no table built): fast on big files."""
    got = _from_shared(path)
    if got is not None:
        return got[1]
    _, inf = _load(path, sort=False, count_only=True)
    return inf


def histograms(path: str | os.PathLike[str]) -> pl.DataFrame:
    """Every histogram record as rows of buckets.

    Columns: t_ns, group, name, tag (0 log, 1 reset), record (its number in
    the file), bucket ("under", "over" or the index), lo, hi (bounds, hi
    exclusive; null for under/overflow), count, and the record's sum, min and
    max of the values added (repeated on each of its rows).
    """
    cols, info = _load(path, sort=True)
    ents = {e["id"]: e for e in info.entities}
    rows = cols["hist_row"].astype(np.int64)
    if len(rows) == 0:
        return pl.DataFrame(
            schema={
                "t_ns": pl.Int64,
                "group": pl.String,
                "name": pl.String,
                "tag": pl.UInt32,
                "record": pl.UInt32,
                "bucket": pl.String,
                "lo": pl.Int64,
                "hi": pl.Int64,
                "count": pl.UInt64,
                "sum": pl.Int64,
                "min": pl.Int64,
                "max": pl.Int64,
            }
        )
    rec_entity = cols["entity"][rows]
    frames = []
    brec = cols["bucket_rec"]
    bidx = cols["bucket_idx"]
    for eid in np.unique(rec_entity):
        e = ents[int(eid)]
        recs = np.nonzero(rec_entity == eid)[0].astype(np.uint32)
        mask = np.isin(brec, recs)
        r = brec[mask]
        lo, hi = _native.hist_bounds(json.dumps(e["histogram"]), bidx[mask])
        base = {
            "t_ns": cols["t_ns"][rows[r]],
            "group": e["group"],
            "name": e["name"],
            "tag": cols["tag"][rows[r]],
            "record": r,
            "bucket": bidx[mask].astype(str),
            "lo": lo,
            "hi": hi,
            "count": cols["bucket_count"][mask],
        }
        frames.append(pl.DataFrame(base))
        for which, key in (("under", "hist_under"), ("over", "hist_over")):
            frames.append(
                pl.DataFrame(
                    {
                        "t_ns": cols["t_ns"][rows[recs]],
                        "group": e["group"],
                        "name": e["name"],
                        "tag": cols["tag"][rows[recs]],
                        "record": recs,
                        "bucket": which,
                        "lo": pl.Series([None] * len(recs), dtype=pl.Int64),
                        "hi": pl.Series([None] * len(recs), dtype=pl.Int64),
                        "count": cols[key][recs],
                    }
                )
            )
    out = pl.concat([f.with_columns(pl.col("record").cast(pl.UInt32), pl.col("count").cast(pl.UInt64)) for f in frames])
    summary = pl.DataFrame({"record": np.arange(len(rows), dtype=np.uint32), "sum": cols["hist_sum"], "min": cols["hist_min"], "max": cols["hist_max"]})
    return out.join(summary, on="record", how="left").sort(["t_ns", "record"])
