"""The flight recorder's windows (``loopscope monitor``): a window taken out
of the reader's buffers as a table, and written as a store of its own.

The reader of a run never keeps a window: it writes its segments natively
(``Reader.drain``) and loads neither polars nor the store. A flight
recorder does, through ``Reader.keep``, and starts polars' pool before it
records (``start_pool``) so that its threads are among those the capture
leaves out.
"""

from __future__ import annotations

import json
import time
from pathlib import Path
from typing import TYPE_CHECKING, Any

import polars as pl

from loopscope import _native
from loopscope.kernel import store
from loopscope.kernel.instance import MAX_READ, buffer_stats, dropped
from loopscope.kernel.tracing import timens_offset_ns
from loopscope.kernel.tracing import Kept

if TYPE_CHECKING:
    from loopscope.kernel.instance import Reader


def start_pool() -> None:
    """polars' threads started now (their page faults and timers are the recorder's own)."""
    pl.thread_pool_size()


def keep(r: Reader, t0: int, t1: int, dest: Path, margin_ns: int) -> Kept:
    """Take [t0, t1] out of the buffers into a store in ``dest``
    (``segments.jsonl``, ``events/00000.parquet``): pause, read every CPU,
    resume; events up to ``margin_ns`` before the newest are held for the
    next keep, older ones dropped (memory stays a few seconds' events)."""

    def now() -> int:
        return time.clock_gettime_ns(time.CLOCK_MONOTONIC) - timens_offset_ns()

    if r.flight == "drain":
        return keep_drained(r, t0, t1, dest)
    h = r.held
    if h is not None and len(h) and int(h["t_ns"].min()) <= t0 and int(h["t_ns"].max()) >= t1:  # type: ignore[arg-type]
        # an earlier keep's read holds the whole window: no pause, no read
        return write_kept(r, h.filter((pl.col("t_ns") >= t0) & (pl.col("t_ns") <= t1)), t0, t1, dest, [], [], [], None, 0, 0)
    a = r.active
    inst, fds = r.pair[a]
    p0 = now()
    if len(r.pair) > 1:
        # the twin records from now on; this one stops a moment later (the
        # events of that moment are in both, and are kept once)
        (r.pair[1 - a][0] / "tracing_on").write_text("1")
        switched = now()
    (inst / "tracing_on").write_text("0")
    t_read = time.monotonic_ns()
    nbytes = 0
    try:
        held = {c: buffer_stats(inst, c).get("bytes", 0) for c in fds}
        for c, fd in fds.items():
            bound = (held[c] // max(1, r.page_size - 64) + 2) * r.page_size
            buf = _native.ktrace_read(fd, r.page_size, min(bound, MAX_READ))
            nbytes += len(buf)
            if buf:
                r.decoder.pages(c, buf)
    finally:
        if len(r.pair) == 1:
            (inst / "tracing_on").write_text("1")
    p1 = now()
    read_ns = time.monotonic_ns() - t_read
    got = r.decoder.take()
    r.k_strings, r.k_events = got["strings"], got["events"]  # the tables only grow: the last one serves every window
    new = store.frame(got)
    # per CPU: where this read's events start, and whether the buffer overwrote pages since it last started recording
    first = {int(c): int(t) for c, t in new.group_by("cpu").agg(pl.col("t_ns").min()).iter_rows()} if len(new) else {}
    after = {c: dropped(buffer_stats(inst, c)) for c in fds}
    over = {c: after[c] > r.bases[a].get(c, 0) for c in fds}
    r.bases[a] = after
    had = r.held if r.held is not None and len(r.held) else None
    short = []
    for c in fds:
        # covered when this CPU's events reach back to t0 without a gap: the
        # buffer's oldest event when it overwrote, else from when it started
        # recording, and before that the events held from the last read
        start = first.get(c, p0) if over[c] else r.since[a]
        if start > t0 and (over[c] or had is None or int(had["t_ns"].min()) > t0):  # type: ignore[arg-type]
            short.append({"cpu": c, "from_ns": t0, "to_ns": min(start, t1)})
    both = pl.concat([had, new]) if had is not None else new
    if had is not None and len(new):
        lo, hi = int(new["t_ns"].min()), int(had["t_ns"].max())  # type: ignore[arg-type]
        if lo <= hi:
            # both are in time order; only where they overlap (the moment
            # both instances recorded, at the switch) is an event twice, or
            # out of order: deduplicate and sort there, not everywhere (a
            # sort of everything held was a third of a keep under a storm)
            t = pl.col("t_ns")
            mid = pl.concat([had.filter(t >= lo), new.filter(t <= hi)])
            mid = (mid.unique(maintain_order=True) if len(r.pair) > 1 else mid).sort("t_ns", maintain_order=True)
            both = pl.concat([had.filter(t < lo), mid, new.filter(t > hi)])
    win = both.filter((pl.col("t_ns") >= t0) & (pl.col("t_ns") <= t1))
    newest = int(both["t_ns"].max()) if len(both) else p1  # type: ignore[arg-type]
    r.held = both.filter(pl.col("t_ns") >= newest - margin_ns)
    if len(r.pair) > 1:
        r.active = 1 - a
        r.since[r.active] = switched
        # no pause: nothing was blind
        placed = [w for w in store.lost_list(got) if w["end_ns"] > t0 and w["start_ns"] < t1 and w["start_ns"] >= first.get(w["cpu"], w["start_ns"])]
        r.totals["reads_asked"] += 1
        return write_kept(r, win, t0, t1, dest, short, [], placed, None, len(new), nbytes, read_ns)
    r.since[a] = p1
    blind = [(x, y) for x, y in r.pauses if y > t0 and x < t1]
    r.pauses = [*r.pauses[-63:], (p0, p1)]
    # the page flags' own losses between events this read has
    placed = [w for w in store.lost_list(got) if w["end_ns"] > t0 and w["start_ns"] < t1 and w["start_ns"] >= first.get(w["cpu"], w["start_ns"])]
    r.totals["reads_asked"] += 1
    return write_kept(r, win, t0, t1, dest, short, blind, placed, (p0, p1), len(new), nbytes, read_ns)


def keep_drained(r: Reader, t0: int, t1: int, dest: Path) -> Kept:
    """A draining recorder's keep: a read (the window's end may still be in
    the kernel), then the ring's pages over [t0, t1] decoded, nothing else."""
    r.pull()
    ring = r.ring
    assert ring is not None
    t_read = time.monotonic_ns()
    n = 0
    nbytes = 0
    short = []
    for c in r.pair[0][1]:
        pages = ring.over(c, t0, t1)
        cut = ring.cut.get(c)
        if cut is not None and cut > t0:  # the ring had let these go: the window came too late
            short.append({"cpu": c, "from_ns": t0, "to_ns": min(cut, t1)})
        if pages:
            r.decoder.set_last_time(c, int.from_bytes(pages[0][:8], "little"))
            buf = b"".join(pages)
            r.decoder.pages(c, buf)
            n += len(pages)
            nbytes += len(buf)
    got = r.decoder.take()
    r.k_strings, r.k_events = got["strings"], got["events"]
    new = store.frame(got)
    win = new.filter((pl.col("t_ns") >= t0) & (pl.col("t_ns") <= t1)).sort("t_ns", maintain_order=True)
    read_ns = time.monotonic_ns() - t_read
    placed: list[Any] = [w for w in store.lost_list(got) if w["end_ns"] > t0 and w["start_ns"] < t1]
    placed += [
        {"cpu": c, "start_ns": a, "end_ns": b, "events": ev, "why": "the kernel overwrote these before the recorder's read took them"}
        for c, a, b, ev in ring.gaps
        if b > t0 and a < t1
    ]
    r.totals["reads_asked"] += 1
    return write_kept(r, win, t0, t1, dest, short, [], placed, None, len(new), nbytes, read_ns)


def write_kept(
    r: Reader,
    win: pl.DataFrame,
    t0: int,
    t1: int,
    dest: Path,
    short: list[dict[str, int]],
    blind: list[tuple[int, int]],
    placed: list[Any],
    pause: tuple[int, int] | None,
    n_read: int,
    nbytes: int,
    read_ns: int = 0,
) -> Kept:
    (dest / "events").mkdir(parents=True, exist_ok=True)
    lost: list[store.LostWindow] = [
        {
            "cpu": w["cpu"],
            "start_ns": w["from_ns"],
            "end_ns": w["to_ns"],
            "events": 1,
            "why": "the flight recorder's buffer had overwritten this before the window was kept",
        }
        for w in short
    ]
    lost += [{"cpu": c, "start_ns": a, "end_ns": b, "events": 1, "why": "tracing was paused to keep an earlier window"} for a, b in blind for c in r.fds]
    lost += placed
    seg: store.Segment = {
        "seg": 0,
        "reason": "kept",
        "label": dest.name,
        "read_ns": read_ns,
        "bytes_read": nbytes,
        "events": len(win),
        "t_first_ns": t0,
        "t_last_ns": t1,
        "lost": lost,
        "file": None,
        "strings": r.k_strings,
        "event_names": r.k_events,
    }
    t_w = time.monotonic_ns()
    if len(win):
        written = store.write_segment(dest, 0, win, sync=False)
        seg["file"], seg["groups"], seg["bytes"] = written["file"], written["groups"], written["bytes"]
    (dest / "segments.jsonl").write_text(json.dumps(seg) + "\n")
    t = r.totals
    t["segments"] += 1
    t["events"] += len(win)
    t["bytes_read"] += nbytes
    t["read_ns"] += read_ns
    return {
        "kept": len(win),
        "read": n_read,
        "read_ns": read_ns,
        "age_ns": time.clock_gettime_ns(time.CLOCK_MONOTONIC) - timens_offset_ns() - t0,
        "write_ns": time.monotonic_ns() - t_w,
        "paused_ns": pause[1] - pause[0] if pause else 0,
        "pause": list(pause) if pause else [],
        "short": short,
        "blind": [list(b) for b in blind],
        "bytes": seg.get("bytes", 0),
    }
