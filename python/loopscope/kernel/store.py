"""A kernel capture on disk, read a time window at a time.

The reader (``drain``) leaves under ``hosts/<host>/kernel/``:

- ``segments.jsonl``: one line per read of the buffers: ``seg``, ``reason``
  (``asked`` between windows, ``half full`` during one, ``stopped by …``),
  ``t_first_ns``/``t_last_ns`` (kernel CLOCK_MONOTONIC), ``events``,
  ``file``, ``groups`` (each row group's first and last ``t_ns``),
  ``lost`` (windows: ``cpu``, ``start_ns``, ``end_ns``,
  ``events``, ``why``; ``events`` -1 when nobody counted them);
- ``events/NNNNN.parquet``: the segment's events (``STORED`` columns;
  text as indices into the string table a segment line carries whenever
  it grew, ``strings`` and ``event_names``), zstd-compressed, time-sorted;
- ``formats/``: the kernel's event descriptions it was decoded with.

``Store.load(a, b)`` reads only the row groups (65,536 events each) that
overlap [a, b], keeps the last few decoded, and returns the rows inside
it, so explaining a run needs the memory of the windows it explains, not
of the run. ``Store.reads(a, b)`` names the same groups as row ranges of
files for the native passes (attribution, ``threads``' fold), which read
them themselves: no table or array is made in between. A segment file that cannot be read (cut short by
a kill, damaged) becomes a loss window over its span; a capture whose index
is gone or unreadable has losses at unknown times. Old runs (``kernel.perf``
from ``perf record``) open through ``perfdata`` into the same interface.
"""

from __future__ import annotations

import os
from collections import OrderedDict
from dataclasses import dataclass, field
from collections.abc import Iterator
from pathlib import Path
from typing import TYPE_CHECKING

from pydantic import TypeAdapter, ValidationError
from typing_extensions import TypedDict

import polars as pl

from loopscope.errors import InputError
from loopscope.rundir import Capture

# the index's types and the loss list, re-exported: the store's readers and writers name them here
from loopscope.kernel.segments import LostWindow as LostWindow, Segment as Segment, lost_list as lost_list

if TYPE_CHECKING:
    from loopscope._native import _Decoded as Decoded

SCHEMA = {
    "t_ns": pl.Int64,
    "cpu": pl.Int32,
    "pid": pl.Int32,
    "tid": pl.Int32,
    "comm": pl.String,
    "event": pl.String,
    "target": pl.Int32,
    "target_comm": pl.String,
    "next_pid": pl.Int32,
    "next_comm": pl.String,
    "prev_state": pl.String,
    "irq": pl.Int32,
    "name": pl.String,
    "dest_cpu": pl.Int32,
    "runtime": pl.Int64,
    "expires": pl.Int64,
    "softexpires": pl.Int64,
    "prio": pl.Int32,
    "next_prio": pl.Int32,
}
STORED = [
    "t_ns",
    "cpu",
    "pid",
    "event",
    "target",
    "target_comm",
    "next_pid",
    "next_comm",
    "prev_state",
    "irq",
    "name",
    "dest_cpu",
    "runtime",
    "expires",
    "softexpires",
    "prio",
    "next_prio",
]
LOST_SCHEMA = {"cpu": pl.Int32, "start_ns": pl.Int64, "end_ns": pl.Int64, "events": pl.Int64}
# Events per row group (drain writes them so, the store reads them so) and
# groups kept decoded at once (about 0.2 s of a busy machine each; some 100 MB in all).
GROUP = 65536
CACHE_GROUPS = 24


SEGMENT: TypeAdapter[Segment] = TypeAdapter(Segment)
LOST_LIST: TypeAdapter[list[LostWindow]] = TypeAdapter(list[LostWindow])


class CaptureError(InputError):
    """A run's kernel capture that cannot be read: no data, a newer format, a damaged index."""


#: a window's events as row ranges of the capture's files, for the native attribution to read (``Store.reads``)
Reads = tuple[int, int, list[list[tuple[str, int, int]]]]

CODED = ["event", "target_comm", "next_comm", "prev_state", "name"]


# The decoder's columns that hold -1 where an event has no such field, and their stored type.
NULLABLE = {
    "target": pl.Int32,
    "target_comm": pl.Int32,
    "next_pid": pl.Int32,
    "next_comm": pl.Int32,
    "prev_state": pl.Int32,
    "irq": pl.Int32,
    "name": pl.Int32,
    "dest_cpu": pl.Int32,
    "runtime": pl.Int64,
    "expires": pl.Int64,
    "softexpires": pl.Int64,
    "prio": pl.Int32,
    "next_prio": pl.Int32,
}


def frame(got: Decoded) -> pl.DataFrame:
    """The decoder's columns as a time-sorted table of ``STORED`` columns:
    numbers, and for the text columns indices into the string table (the
    event names for ``event``), null where the event has no such field.
    Text is looked up only when a window is loaded (``decode_text``)."""
    c = got["columns"]
    raw = pl.DataFrame({k: c[k] for k in ("t_ns", "cpu", "pid", "event", *NULLABLE)})
    # one pass over every column (polars runs them in parallel): -1 is "no such field", null in the table
    df = raw.with_columns(
        pl.col("t_ns").cast(pl.Int64),
        pl.col("cpu").cast(pl.Int32),
        pl.col("pid").cast(pl.Int32),
        pl.col("event").cast(pl.Int32),
        *(pl.when(pl.col(k) >= 0).then(pl.col(k)).cast(dt).alias(k) for k, dt in NULLABLE.items()),
    ).select(STORED)
    return df.sort("t_ns", maintain_order=True)


def decode_text(df: pl.DataFrame, strings: list[str], events: list[str]) -> pl.DataFrame:
    """Stored code columns → their text."""
    st = pl.Series("s", strings, dtype=pl.String)
    ev = pl.Series("e", events, dtype=pl.String)
    out = {}
    for c in CODED:
        if c in df.columns and df[c].dtype != pl.String:
            table = ev if c == "event" else st
            out[c] = table.gather(df[c].cast(pl.Int64)) if len(table) else pl.Series(c, [None] * len(df), dtype=pl.String)
    return df.with_columns(**out) if out else df


class SegmentFile(TypedDict):
    file: str
    groups: list[list[int]]
    bytes: int


def write_segment(d: Path, seg: int, df: pl.DataFrame, sync: bool = True, level: int = 3) -> SegmentFile:
    """Write a segment's events (time-sorted) to ``d/events/NNNNN.parquet``:
    under a temporary name, renamed when whole (a kill leaves whole files
    only), in row groups of ``GROUP`` whose first and last times are returned
    for the index; ``sync``: written back now (the live reader does it
    between windows, not inside a later one). OSError when it cannot be written."""
    path = d / "events" / f"{seg:05d}.parquet"
    tmp = path.with_suffix(".tmp")
    try:
        df.write_parquet(tmp, compression="zstd", compression_level=level, row_group_size=GROUP, statistics=True)
        if sync:
            fd = os.open(tmp, os.O_RDONLY)
            try:
                os.fsync(fd)
            finally:
                os.close(fd)
        os.replace(tmp, path)
    except OSError:
        tmp.unlink(missing_ok=True)
        raise
    ts = df["t_ns"]
    groups = [[int(ts[i]), int(ts[min(i + GROUP, len(ts)) - 1])] for i in range(0, len(ts), GROUP)]
    return {"file": f"events/{path.name}", "groups": groups, "bytes": path.stat().st_size}


def full(df: pl.DataFrame) -> pl.DataFrame:
    """Stored columns → the columns attribution reads (the current task's tid
    is its pid in the kernel's sense; its name is not kept)."""
    out = df.with_columns(pl.col("pid").alias("tid"), pl.lit(None, dtype=pl.String).alias("comm"))
    for c, dt in SCHEMA.items():
        if c not in out.columns:
            out = out.with_columns(pl.lit(None, dtype=dt).alias(c))
    return out.select(list(SCHEMA)).cast(SCHEMA)  # type: ignore[arg-type]


@dataclass
class Store:
    """One capture: its segments, its losses, events by time window."""

    dir: Path
    segments: list[Segment]
    lost: pl.DataFrame  # cpu, start_ns, end_ns, events (>= 1; unknown counts as 1)
    unknown_loss: list[str] = field(default_factory=list)  # losses that cannot be placed in time
    problems: list[str] = field(default_factory=list)
    legacy: pl.DataFrame | None = None
    strings: list[str] = field(default_factory=list)
    event_names: list[str] = field(default_factory=list)
    clock: str = "mono"  # the trace clock its stamps are on (an imported recording's may differ)
    _rgs: list[tuple[int, int, Path, int]] | None = None
    _cache: OrderedDict[tuple[Path, int], pl.DataFrame] = field(default_factory=OrderedDict)
    _by_event: dict[str, int] | None = None

    @property
    def lost_events(self) -> int:
        return int(self.lost["events"].sum() or 0) if len(self.lost) else 0

    @property
    def lost_counted(self) -> bool:
        """Whether every loss has a count (else the count is a lower bound)."""
        return not any(s.get("lost_unknown") for s in self.segments)

    @property
    def t_first(self) -> int | None:
        ts = [t for s in self.segments if (t := s.get("t_first_ns")) is not None]
        return min(ts) if ts else None

    @property
    def t_last(self) -> int | None:
        ts = [t for s in self.segments if (t := s.get("t_last_ns")) is not None]
        return max(ts) if ts else None

    @property
    def events(self) -> int:
        return sum(int(s.get("events") or 0) for s in self.segments)

    def _row_groups(self) -> list[tuple[int, int, Path, int]]:
        """(first t, last t, file, group) of every readable segment, by time.
        A group is GROUP consecutive rows (the row groups ``drain`` writes);
        files are time-sorted, so a group's span is its first and last t,
        read from the t_ns column alone."""
        if self._rgs is None:
            out = []
            for seg in self.segments:
                rel = seg.get("file")
                if not rel or not seg.get("readable", True):
                    continue
                p = self.dir / rel
                if seg.get("groups"):
                    out += [(int(lo), int(hi), p, i) for i, (lo, hi) in enumerate(seg["groups"])]
                    continue
                t = pl.read_parquet(p, columns=["t_ns"])["t_ns"]  # captures before the index said
                for i in range(0, len(t), GROUP):
                    out.append((int(t[i]), int(t[min(i + GROUP, len(t)) - 1]), p, i // GROUP))
            out.sort(key=lambda x: x[0])
            self._rgs = out
        return self._rgs

    def _group(self, p: Path, i: int) -> pl.DataFrame:
        """One group as stored (text as codes), kept in a small cache
        (explain walks the run in time order, so each group is read about
        once). The slice is pushed into the Parquet reader: it reads the row
        groups it covers."""
        key = (p, i)
        if key in self._cache:
            self._cache.move_to_end(key)
            return self._cache[key]
        df = pl.scan_parquet(p).slice(i * GROUP, GROUP).collect()
        for c in ("expires", "softexpires", "prio", "next_prio"):  # captures before these columns
            if c not in df.columns:
                df = df.with_columns(pl.lit(None, dtype=SCHEMA[c]).alias(c))
        self._cache[key] = df
        while len(self._cache) > CACHE_GROUPS:
            self._cache.popitem(last=False)
        return df

    def _groups_over(self, a: int, b: int) -> Iterator[tuple[Path, int]]:
        """The row groups whose span meets [a, b], in time order."""
        for lo, hi, p, i in self._row_groups():
            if lo > b:
                break
            if hi >= a:
                yield p, i

    def _runs(self, a: int, b: int) -> Iterator[list[tuple[Path, int]]]:
        """The row groups meeting [a, b] in time order, those whose spans
        overlap together (a run is read whole and sorted)."""
        run: list[tuple[Path, int]] = []
        hi = None
        for lo, top, p, i in self._row_groups():
            if lo > b:
                break
            if top < a:
                continue
            if run and hi is not None and lo < hi:
                run.append((p, i))  # overlaps what came before: read with it
            else:
                if run:
                    yield run
                run = [(p, i)]
            hi = top if hi is None else max(hi, top)
        if run:
            yield run

    def reads(self, a: int, b: int) -> Reads:
        """What the native attribution reads itself for [a, b] (``ktrace_attribute``'s
        ``(a, b, runs)``): each run of overlapping row groups as (file, first row,
        row after the last); nothing is read here."""
        return (a, b, [[(str(p), i * GROUP, (i + 1) * GROUP) for p, i in run] for run in self._runs(a, b)])

    def load_coded(self, a: int, b: int) -> pl.DataFrame:
        """Every event with a <= t_ns <= b, time-sorted, as stored: text
        columns are indices into ``strings`` (``event`` into ``event_names``)."""
        parts = []
        for p, i in self._groups_over(a, b):
            g = self._group(p, i)
            t = g["t_ns"]
            x, y = int(t.search_sorted(a, "left")), int(t.search_sorted(b, "right"))
            if y > x:
                parts.append(g.slice(x, y - x))
        if not parts:
            return pl.DataFrame(schema={c: (pl.Int32 if c in CODED else SCHEMA[c]) for c in STORED})
        return pl.concat(parts, how="vertical_relaxed").sort("t_ns", maintain_order=True) if len(parts) > 1 else parts[0]

    def load(self, a: int, b: int) -> pl.DataFrame:
        """Every event with a <= t_ns <= b, time-sorted, in the columns of ``SCHEMA``."""
        if self.legacy is not None:
            return self.legacy.filter(pl.col("t_ns").is_between(a, b))
        df = self.load_coded(a, b)
        return full(decode_text(df, self.strings, self.event_names)) if len(df) else pl.DataFrame(schema=SCHEMA)

    def by_event(self) -> dict[str, int]:
        """How many events of each kind the capture holds, most first: counted
        once (a read of every file's event column) and kept, since explain and
        threads ask several times of the same segments."""
        if self._by_event is None:
            self._by_event = self._count_events()
        return dict(self._by_event)

    def _count_events(self) -> dict[str, int]:
        if self.legacy is not None:
            return {r["event"]: r["len"] for r in self.legacy.group_by("event").len().sort("len", descending=True).iter_rows(named=True)}
        files = self.files()
        if not files:
            return {}
        try:
            g = pl.scan_parquet(files).group_by("event").len().collect()
        except Exception:  # noqa: BLE001 - polars raises several kinds for a damaged file: find it, count the rest
            parts = []
            for p in files:
                try:
                    parts.append(pl.scan_parquet(p).group_by("event").len().collect())
                except Exception as e:  # noqa: BLE001
                    self.quarantine(p, e)
            if not parts:
                return {}
            g = pl.concat(parts).group_by("event").agg(pl.col("len").sum())
        g = decode_text(g.sort("len", descending=True), self.strings, self.event_names)
        return {r["event"]: int(r["len"]) for r in g.iter_rows(named=True)}

    def quarantine(self, p: Path, e: Exception) -> None:
        """A segment file found damaged past its footer (a page that does not
        decode): as one unreadable at opening, its events count as lost over
        its span, and no later read takes it."""
        for s in self.segments:
            if s.get("file") and self.dir / str(s["file"]) == p and s.get("readable", True):
                s["readable"] = False
                self.problems.append(f"{s['file']}: damaged ({str(e).splitlines()[0][:120]}); its {s.get('events')} events count as lost")
                a, b = s.get("t_first_ns"), s.get("t_last_ns")
                if a is not None:
                    row = pl.DataFrame(
                        [{"cpu": -1, "start_ns": a, "end_ns": b if b is not None else a, "events": int(s.get("events") or 1)}], schema=LOST_SCHEMA
                    )
                    self.lost = pl.concat([self.lost, row])
        self._rgs = None
        self._cache.clear()

    def files(self) -> list[Path]:
        """The readable segment files."""
        return [self.dir / rel for s in self.segments if (rel := s.get("file")) and s.get("readable", True)]

    def checked_files(self) -> list[Path]:
        """The readable segment files once the events have been counted
        (``by_event``, kept): a file damaged past its footer is found by that
        count and left out, so a polars read of these meets no damaged page."""
        self.by_event()
        return self.files()

    def bytes_on_disk(self) -> int:
        return sum(p.stat().st_size for p in self.dir.rglob("*") if p.is_file())


def open_capture(run_dir: Path, cap: Capture) -> Store:
    """The capture a run.json ``kernel.captures`` entry describes."""
    fmt = cap.format
    data = run_dir / cap.data if cap.data else None
    if data is None:
        raise CaptureError("the capture recorded no data")
    if fmt is None and data.suffix == ".perf":
        return _legacy(data)
    if fmt != "tracefs-segments/1":
        raise CaptureError(f"capture format {fmt!r} is newer than this loopscope reads (it reads tracefs-segments/1 and perf.data)")
    st = open_dir(data)
    if cap.read == "imported" and cap.clock:
        st.clock = cap.clock  # a recording of another tool, on the clock it chose
    return st


def open_dir(d: Path) -> Store:
    idx = d / "segments.jsonl"
    segments: list[Segment] = []
    problems: list[str] = []
    unknown: list[str] = []
    try:
        lines = idx.read_text().splitlines()
    except OSError as e:
        raise CaptureError(f"{idx}: {e.strerror or e}") from None
    for n, line in enumerate(lines, 1):
        if not line.strip():
            continue
        try:
            segments.append(SEGMENT.validate_json(line))
        except ValidationError:
            # A line cut short by a kill: what it described is lost at an unknown time.
            problems.append(f"{idx.name} line {n} is cut short")
            unknown.append(f"{idx.name} line {n} is cut short")
    named = {s.get("file") for s in segments}
    # A file renamed into place whose index line never got written (killed in between).
    for p in sorted((d / "events").glob("*.parquet")) if (d / "events").is_dir() else []:
        rel = f"events/{p.name}"
        if rel not in named:
            try:
                t = pl.scan_parquet(p).select(pl.col("t_ns").min().alias("a"), pl.col("t_ns").max().alias("b"), pl.len().alias("n")).collect().row(0)
                segments.append({"seg": None, "reason": "index line missing", "file": rel, "t_first_ns": t[0], "t_last_ns": t[1], "events": t[2], "lost": []})
                problems.append(f"{rel} has no line in {idx.name} (the reader was killed after writing it); read it anyway")
            except Exception as e:  # noqa: BLE001 - polars raises several kinds for a damaged file
                problems.append(f"{rel}: unreadable ({str(e).splitlines()[0][:120]})")
                unknown.append(f"{rel} is unreadable and its span unknown")
    lost_rows: list[LostWindow] = []
    for s in segments:
        if fname := s.get("file"):
            p = d / fname
            try:
                pl.read_parquet_schema(p)
            except Exception as e:  # noqa: BLE001 - a cut-short or damaged file
                s["readable"] = False
                problems.append(f"{s['file']}: unreadable ({str(e).splitlines()[0][:120]}); its {s.get('events')} events count as lost")
                a, b = s.get("t_first_ns"), s.get("t_last_ns")
                if a is not None:
                    lost_rows += [{"cpu": -1, "start_ns": a, "end_ns": b if b is not None else a, "events": int(s.get("events") or 1)}]
        for w in s.get("lost") or []:
            if w["events"] < 0:
                s["lost_unknown"] = True
            lost_rows.append({"cpu": w["cpu"], "start_ns": w["start_ns"], "end_ns": w["end_ns"], "events": max(1, int(w["events"]))})
    lost = pl.DataFrame(lost_rows, schema=LOST_SCHEMA) if lost_rows else pl.DataFrame(schema=LOST_SCHEMA)
    segments.sort(key=lambda s: (s.get("t_first_ns") is None, s.get("t_first_ns") or 0))
    # The string table only grows: the longest one serves every segment.
    strings = max((s.get("strings") or [] for s in segments), key=len, default=[])
    events = max((s.get("event_names") or [] for s in segments), key=len, default=[])
    return Store(d, segments, lost, unknown, problems, strings=strings, event_names=events)


def _legacy(data: Path) -> Store:
    from loopscope.kernel import perfdata

    try:
        got = perfdata.read(data)
    except perfdata.KernelReadError as e:
        raise CaptureError(str(e)) from None
    ev = got.events
    t = ev["t_ns"]
    seg: Segment = {
        "seg": 0,
        "reason": "perf record",
        "file": None,
        "events": len(ev),
        "t_first_ns": int(t.min()) if len(t) else None,  # type: ignore[arg-type]
        "t_last_ns": int(t.max()) if len(t) else None,  # type: ignore[arg-type]
    }
    unknown = [] if got.placed or not got.lost else [f"{got.lost} kernel events lost at unknown times"]
    return Store(data.parent, [seg], got.lost_windows, unknown, [], legacy=ev)
