"""Text views of a trace: ``loopscope trace info`` and ``loopscope trace dump``.

``info`` says what the file holds (writer, clock, streams, threads, entities
with their record counts, time span) and, always, what was lost or damaged.
``dump`` narrates records one per line in time order, with the time since
the first record, the thread, the entity and the fields its kind carries.
"""

from __future__ import annotations

import datetime as _dt
import os
from typing import Any, Iterator

from typing_extensions import TypedDict

import polars as pl

from loopscope.errors import InputError
from loopscope.trace.reader import ConfigChange, DumpInfo, ReadStats, StreamInfo, ThreadInfo, TraceInfo
from loopscope.units import format_ns


def _bytes(n: int) -> str:
    for unit, f in (("GiB", 1 << 30), ("MiB", 1 << 20), ("KiB", 1 << 10)):
        if n >= f:
            return f"{n / f:.1f} {unit}"
    return f"{n} B"


class EntityJson(TypedDict):
    """One entity of a trace (a probe's measurement point) and its record count."""

    id: int
    group: str
    name: str
    kind: str
    desc: str
    records: int


class TraceInfoJson(TypedDict):
    """What ``loopscope trace info --json`` prints: the trace's header, streams, threads, entities and counts."""

    path: str
    format_version: list[int]
    host: str
    pid: int
    process: str
    clock: str
    clock_reason: str
    raw_hz: float
    start_realtime_ns: int
    t_first_ns: int | None
    t_last_ns: int | None
    streams: list[StreamInfo]
    threads: list[ThreadInfo]
    entities: list[EntityJson]
    dumps: list[DumpInfo]
    group_changes: list[ConfigChange]
    calibration_pairs: int
    stats: ReadStats
    losses: list[str]


def info_json(inf: TraceInfo) -> TraceInfoJson:
    ents: list[EntityJson] = [
        {"id": e["id"], "group": e["group"], "name": e["name"], "kind": e["kind"], "desc": e.get("desc", ""), "records": inf.counts.get(e["id"], 0)}
        for e in inf.entities
    ]
    return {
        "path": inf.path,
        "format_version": list(inf.version),
        "host": inf.host,
        "pid": inf.pid,
        "process": inf.process,
        "clock": inf.clock,
        "clock_reason": inf.clock_reason,
        "raw_hz": inf.raw_hz,
        "start_realtime_ns": inf.start_realtime_ns,
        "t_first_ns": inf.t_first_ns,
        "t_last_ns": inf.t_last_ns,
        "streams": inf.streams,
        "threads": inf.threads,
        "entities": ents,
        "dumps": inf.dumps,
        "group_changes": inf.changes,
        "calibration_pairs": len(inf.calibration),
        "stats": inf.stats,
        "losses": inf.loss_lines(),
    }


def info_lines(inf: TraceInfo) -> list[str]:
    s = inf.stats
    start = _dt.datetime.fromtimestamp(inf.start_realtime_ns / 1e9, tz=_dt.timezone.utc)
    lines = [
        f"trace     {inf.path} ({_bytes(s['file_bytes'])}, format {inf.version[0]}.{inf.version[1]})",
        f"writer    {inf.process or '?'} (pid {inf.pid}) on {inf.host}, started {start:%Y-%m-%d %H:%M:%S.%f} UTC",
        f"clock     {inf.clock} at {inf.raw_hz / 1e9:.6f} GHz ({inf.clock_reason}); {len(inf.calibration)} calibration pairs",
    ]
    if inf.t_first_ns is not None and inf.t_last_ns is not None:
        lines.append(f"span      {format_ns(inf.t_last_ns - inf.t_first_ns)} (t_ns {inf.t_first_ns} .. {inf.t_last_ns})")
    for st in inf.streams:
        lines.append(f"stream    {st['name']}: {st['kind']}, groups {', '.join(st['groups']) or '(none)'}, {_bytes(st['buffer_bytes'])} per thread")
    for d in inf.dumps:
        lines.append(f"dump      #{d['dump']} of stream {d['stream']} (tag {d['tag']}), {d['overwritten_bytes']} older bytes already overwritten")
    for c in inf.changes:
        lines.append(f"switch    stream {c['stream']}: group {c['group']} {'on' if c['enabled'] else 'off'}")
    th = ", ".join(f"{t['name'] or '?'} (tid {t['tid']})" for t in inf.threads[:8])
    more = f" and {len(inf.threads) - 8} more" if len(inf.threads) > 8 else ""
    lines.append(f"threads   {len(inf.threads)}: {th}{more}")
    lines.append(f"records   {s['records']:,} in {s['data_chunks']:,} data chunks ({s['chunks']:,} chunks in all)")
    losses = inf.loss_lines()
    if losses:
        for i, l in enumerate(losses):
            lines.append(f"{'LOST' if i == 0 else '':<9} {l}")
        for p in s["problems"]:
            lines.append(f"          {p}")
    else:
        lines.append("lost      nothing: no dropped records, no damaged chunks, closed cleanly")
    lines.append("entities")
    w = max([len(f"{e['group']}/{e['name']}") for e in inf.entities], default=10)
    for e in inf.entities:
        nm = f"{e['group']}/{e['name']}"
        lines.append(f"  {nm:<{w}}  {e['kind']:<9} {inf.counts.get(e['id'], 0):>12,}  {e.get('desc', '')}")
    return lines


def _fmt_row(t0: int, r: dict[str, Any]) -> str:
    rel = (r["t_ns"] - t0) / 1e9
    head = f"{r['t_ns']:>20} {rel:>+14.9f}  {str(r['thread'])[:16]:<16} {r['group']}/{r['name']}  {r['kind']}  tag={r['tag']}"
    k = r["kind"]
    if k == "interval":
        return f"{head}  dur={format_ns(r['dur_ns'])}"
    if k == "counter":
        return f"{head}  value={r['value']}{'  (reset)' if r['tag'] == 1 else ''}"
    if k == "histogram":
        return f"{head}  count={r['value']}{'  (reset)' if r['tag'] == 1 else ''}"
    if r["value"] is not None:
        return f"{head}  value={r['value']}"
    if r["payload"] is not None:
        p: bytes = r["payload"]
        shown = p[:32].hex() + ("…" if len(p) > 32 else "")
        return f"{head}  payload[{len(p)}]={shown}"
    return head


def select(df: pl.DataFrame, inf: TraceInfo, entity: str | None) -> pl.DataFrame:
    """Rows of one entity ('group/name'); InputError naming the file when unknown."""
    if entity is None:
        return df
    if "/" not in entity:
        raise InputError(f"--entity: write group/name, e.g. timer/wakeup [got {entity!r}]")
    g, n = entity.split("/", 1)
    known = {(e["group"], e["name"]) for e in inf.entities}
    if (g, n) not in known:
        names = ", ".join(sorted(f"{a}/{b}" for a, b in known)) or "(none)"
        raise InputError(f"{inf.path}: no entity {entity}; the trace has {names}")
    return df.filter((pl.col("group").cast(pl.String) == g) & (pl.col("name").cast(pl.String) == n))


def dump_lines(df: pl.DataFrame, inf: TraceInfo, limit: int | None = None) -> Iterator[str]:
    src = os.path.basename(inf.path)
    yield f"# {src}: {inf.records:,} records from {inf.host} (pid {inf.pid}); t_ns is CLOCK_MONOTONIC, then seconds since the first record"
    for l in inf.loss_lines():
        yield f"# LOST: {l}"
    if df.is_empty():
        return
    t0 = int(df["t_ns"][0])
    rows = df if limit is None else df.head(limit)
    for batch in rows.iter_slices(10_000):
        for r in batch.iter_rows(named=True):
            yield _fmt_row(t0, r)
    if limit is not None and len(df) > limit:
        yield f"# … {len(df) - limit:,} more records (use --limit to show more)"
