"""A run's global timeline as a Perfetto trace (ui.perfetto.dev opens it).

Built from ``RUN/timeline.parquet`` (``loopscope timeline``), so every
timestamp is already on the global clock: the reference host's
CLOCK_MONOTONIC in ns. Perfetto's protobuf schema comes from the
``perfetto`` package (its generated ``perfetto_trace_pb2``); the trace is
written as a stream of ``Trace`` messages of a few thousand packets each
(concatenated protobuf messages merge, so the file is one ``Trace``).

Layout: one top-level track per host, under it one track per thread of
each trace (named ``thread [tid] — source``); intervals become slices on
their thread's track (a slice that would cross another instead of nesting
goes to a second lane, never dropped), events instants, counters counter
tracks. Each host also gets counter tracks of its clock's estimated offset
and bound. Each captured kernel gets, per CPU, a track of the tasks that ran
(from runtime accounting) and one of the interrupt handlers, around every
attributed outlier (±20 ms), so an outlier's window can be opened and seen. Every slice and instant carries ``bound_ns``, how far its true
time may be from where it is drawn. Records that could not be placed on
the global clock and histogram snapshots are counted, not drawn.
"""

from __future__ import annotations

import hashlib
from pathlib import Path
from typing import Any, BinaryIO, Callable, NamedTuple, Protocol

from typing_extensions import TypedDict

import numpy as np
import polars as pl
from loopscope.rundir import Capture, RunDir, RunRecord
from loopscope.trace import reader
from loopscope.analysis.attribution import cpu_views
from loopscope.kernel import store as S

SEQ = 0x4C53  # trusted_packet_sequence_id for every packet


def _uuid(*parts: object) -> int:
    return int.from_bytes(hashlib.blake2b("\x1f".join(map(str, parts)).encode(), digest_size=8).digest(), "little") >> 1


class _Writer:
    """Packets in batches: a caller fills each packet before asking for the next,
    so the batch is written out when the next packet is asked for."""

    def __init__(self, f: BinaryIO) -> None:
        from perfetto.protos.perfetto.trace import perfetto_trace_pb2 as pb

        self.pb = pb
        self.f = f
        self.trace = pb.Trace()
        self.n = 0

    def packet(self) -> Any:
        if len(self.trace.packet) >= 4096:
            self.close()
        p = self.trace.packet.add()
        p.trusted_packet_sequence_id = SEQ
        if self.n == 0:
            p.sequence_flags = self.pb.TracePacket.SEQ_INCREMENTAL_STATE_CLEARED
        self.n += 1
        return p

    def close(self) -> None:
        if len(self.trace.packet):
            self.f.write(self.trace.SerializeToString())
        self.trace = self.pb.Trace()


def _lanes(start: np.ndarray, end: np.ndarray) -> np.ndarray:
    """A lane per interval such that intervals in one lane nest or follow each other."""
    order = np.lexsort((-end, start))
    lanes = np.zeros(len(start), dtype=np.int64)
    stacks: list[list[int]] = []
    for i in order:
        s, e = start[i], end[i]
        for k, st in enumerate(stacks):
            while st and st[-1] <= s:
                st.pop()
            if not st or e <= st[-1]:
                st.append(e)
                lanes[i] = k
                break
        else:
            stacks.append([e])
            lanes[i] = len(stacks) - 1
    return lanes


def export(run_dir: Path, out: Path) -> Exported:
    """A run's global timeline (``RUN/timeline.parquet``), its clocks and the kernel around the outliers."""
    return _write(pl.read_parquet(run_dir / "timeline.parquet"), out, run_dir)


def export_trace(trace: Path, out: Path) -> Exported:
    """One trace file alone, on its own clock (CLOCK_MONOTONIC of the host
    that wrote it: one clock, so every bound is 0): for programs
    instrumented with the trace API and no experiment."""

    df = reader.read(trace)
    tl = df.select(
        pl.col("host").cast(pl.String),
        pl.lit(str(trace)).alias("source"),
        pl.col("thread").cast(pl.String),
        "tid",
        pl.col("group").cast(pl.String),
        pl.col("name").cast(pl.String),
        pl.col("kind").cast(pl.String),
        "tag",
        "t_ns",
        "dur_ns",
        "value",
        pl.col("t_ns").alias("t_global_ns"),
        pl.lit(0.0).alias("bound_ns"),
    )
    return _write(tl, out, None)


class Exported(TypedDict):
    """What an export wrote: slices, instants and counter values on how many tracks, what could not be placed, and where."""

    slices: int
    instants: int
    counters: int
    not_placed: int
    histograms: int
    tracks: int
    kernel_slices: int
    packets: int
    bytes: int
    path: str


class EventTypes(NamedTuple):
    """The track event types the trace uses (perfetto's protos load only when a trace is written)."""

    TYPE_SLICE_BEGIN: int
    TYPE_SLICE_END: int
    TYPE_INSTANT: int
    TYPE_COUNTER: int


class Track(Protocol):
    """Declares a track: its id, name, parent and whether it is a counter."""

    def __call__(self, uuid: int, name: str, parent: int | None = None, counter: bool = False) -> None: ...


def _write(tl: pl.DataFrame, out: Path, run_dir: Path | None) -> Exported:
    from perfetto.protos.perfetto.trace import perfetto_trace_pb2 as pb

    TE = EventTypes(pb.TrackEvent.TYPE_SLICE_BEGIN, pb.TrackEvent.TYPE_SLICE_END, pb.TrackEvent.TYPE_INSTANT, pb.TrackEvent.TYPE_COUNTER)
    counts: dict[str, int] = {"slices": 0, "instants": 0, "counters": 0, "not_placed": 0, "histograms": 0, "tracks": 0}
    placed = tl.filter(pl.col("t_global_ns").is_not_null())
    counts["not_placed"] = len(tl) - len(placed)
    counts["histograms"] = int((placed["kind"] == "histogram").sum())
    placed = placed.filter(pl.col("kind") != "histogram")
    with open(out, "wb") as f:
        w = _Writer(f)

        def track(uuid: int, name: str, parent: int | None = None, counter: bool = False) -> None:
            p = w.packet()
            p.track_descriptor.uuid = uuid
            p.track_descriptor.name = name
            if parent is not None:
                p.track_descriptor.parent_uuid = parent
            if counter:
                p.track_descriptor.counter.SetInParent()
            counts["tracks"] += 1

        hosts = placed["host"].unique(maintain_order=True).to_list()
        clock_path = run_dir / "tables" / "clock.parquet" if run_dir is not None else None
        clock = pl.read_parquet(clock_path) if clock_path is not None and clock_path.exists() else None
        if clock is not None:
            hosts += [h for h in clock["host"].unique().to_list() if h not in hosts]
        for h in hosts:
            track(_uuid("host", h), h)
        for (host, source, thread, tid), g in placed.group_by(["host", "source", "thread", "tid"], maintain_order=True):
            _thread_tracks(w, TE, track, counts, g, (host, source, thread, tid))
        if clock is not None:
            _clock_tracks(w, TE, track, counts, clock)
        counts["kernel_slices"] = _kernel_tracks(run_dir, w, track, TE) if run_dir is not None else 0
        w.close()
    counts["packets"] = w.n
    counts["bytes"] = out.stat().st_size
    return Exported(
        slices=counts["slices"],
        instants=counts["instants"],
        counters=counts["counters"],
        not_placed=counts["not_placed"],
        histograms=counts["histograms"],
        tracks=counts["tracks"],
        kernel_slices=counts.get("kernel_slices", 0),
        packets=counts["packets"],
        bytes=counts["bytes"],
        path=str(out),
    )


def _thread_tracks(w: _Writer, TE: EventTypes, track: Track, counts: dict[str, int], g: pl.DataFrame, who: tuple[Any, Any, Any, Any]) -> None:
    """One thread's records: intervals as slices (in lanes where they
    overlap), events as instants, counters as counter tracks."""
    host, source, thread, tid = who
    parent = _uuid("host", host)
    base = f"{thread} [{tid}] — {Path(str(source)).name}"
    iv = g.filter(pl.col("kind") == "interval")
    if len(iv):
        s = iv["t_global_ns"].to_numpy()
        e = s + iv["dur_ns"].fill_null(0).to_numpy()
        lanes = _lanes(s, e)
        names = (iv["group"] + "/" + iv["name"]).to_list()
        bounds = iv["bound_ns"].fill_nan(None).fill_null(0).to_numpy()
        for lane in np.unique(lanes):
            tu = _uuid("thread", host, source, tid, lane)
            track(tu, base if lane == 0 else f"{base} (lane {lane + 1})", parent)
            sel = np.flatnonzero(lanes == lane)
            counts["slices"] += _slices(w, TE, tu, s[sel], e[sel], [names[i] for i in sel], bounds[sel])
    ins = g.filter(pl.col("kind") == "event")
    if len(ins):
        tu = _uuid("thread", host, source, tid, 0)
        if not len(iv):
            track(tu, base, parent)
        for t, grp, nm, val, tag, b in ins.select("t_global_ns", "group", "name", "value", "tag", "bound_ns").sort("t_global_ns").iter_rows():
            p = w.packet()
            p.timestamp = int(t)
            p.track_event.track_uuid = tu
            p.track_event.type = TE.TYPE_INSTANT
            p.track_event.name = f"{grp}/{nm}"
            for k, v in (("tag", tag), ("value", val), ("bound_ns", None if b is None or b != b else int(b))):
                if v is not None:
                    a = p.track_event.debug_annotations.add()
                    a.name = k
                    a.int_value = int(v)
            counts["instants"] += 1
    for (grp, nm), c in g.filter(pl.col("kind") == "counter").group_by(["group", "name"], maintain_order=True):
        cu = _uuid("counter", host, source, tid, grp, nm)
        track(cu, f"{grp}/{nm} [{tid}]", parent, counter=True)
        for t, v in c.select("t_global_ns", "value").sort("t_global_ns").iter_rows():
            p = w.packet()
            p.timestamp = int(t)
            p.track_event.track_uuid = cu
            p.track_event.type = TE.TYPE_COUNTER
            p.track_event.counter_value = int(v or 0)
            counts["counters"] += 1


def _clock_tracks(w: _Writer, TE: EventTypes, track: Track, counts: dict[str, int], clock: pl.DataFrame) -> None:
    """Each host's clock offset and its bound, as counters under the host."""
    for (host,), c in clock.group_by(["host"], maintain_order=True):
        for col, label in (("offset_ns", "clock offset vs reference, REALTIME (ns)"), ("bound_ns", "clock bound (ns)")):
            cu = _uuid("clock", host, col)
            track(cu, label, _uuid("host", host), counter=True)
            for t, v in c.select("t_global_ns", col).sort("t_global_ns").iter_rows():
                p = w.packet()
                p.timestamp = int(t)
                p.track_event.track_uuid = cu
                p.track_event.type = TE.TYPE_COUNTER
                p.track_event.double_counter_value = float(v)
                counts["counters"] += 1


def _kernel_tracks(run_dir: Path, w: _Writer, track: Track, TE: EventTypes) -> int:
    """Per CPU of each captured kernel: which task ran (from runtime accounting)
    and which interrupt handlers ran, around every attributed outlier (±20 ms;
    without attribution, the capture's first 5 s), on the global clock."""

    run = RunDir(run_dir).record()
    caps = [c for c in run.captures if c.data]
    if not caps:
        return 0
    att_path = run_dir / "tables" / "attribution.parquet"
    att = pl.read_parquet(att_path) if att_path.exists() else None
    clocks: list[Any] = []  # the run's clocks, estimated once if a capture needs them
    n = 0
    for cap in caps:
        host = cap.host
        try:
            st = S.open_capture(run_dir, cap)
        except S.CaptureError:
            continue
        if not st.events:
            continue
        merged = _merge(_spans_of_interest(run_dir, cap, att, st))
        # Only the kernel events around the windows of interest are read.
        ev = pl.concat([st.load(a - 20_000_000, b + 20_000_000) for a, b in merged]).unique(maintain_order=True)
        to_global = _to_global(run_dir, run, host, cap.timens_offset_ns or 0, clocks)
        parent = _uuid("kernel", host)
        track(parent, f"kernel of {', '.join(cap.covers)}")
        for cpu, cv in cpu_views(ev).items():
            for label, (s_arr, e_arr, names) in (("CPU", (cv.run_s, cv.run_e, cv.run_label)), ("interrupts", (cv.irq_s, cv.irq_e, cv.irq_label))):
                sel = np.zeros(len(s_arr), dtype=bool)
                for a, b in merged:
                    sel |= (e_arr > a) & (s_arr < b)
                idx = np.flatnonzero(sel)
                if not len(idx):
                    continue
                gs, ge = to_global(s_arr[idx]), to_global(e_arr[idx])
                lanes = _lanes(gs, ge)
                for lane in np.unique(lanes):
                    tu = _uuid("kcpu", host, cpu, label, lane)
                    track(tu, f"CPU {cpu} {'tasks' if label == 'CPU' else 'interrupts'}" + (f" (lane {lane + 1})" if lane else ""), parent)
                    on = np.flatnonzero(lanes == lane)
                    n += _slices(w, TE, tu, gs[on], ge[on], [names[int(idx[i])] or "?" for i in on])
        n += _lost_tracks(st, w, TE, track, host, parent, to_global)
    return n


def _spans_of_interest(run_dir: Path, cap: Capture, att: pl.DataFrame | None, st: S.Store) -> list[tuple[int, int]]:
    """Kernel-time spans around the capture's attributed outliers (±20 ms), or its first 5 s."""

    if att is None or not len(att):
        t0 = int(st.t_first or 0)
        return [(t0, t0 + 5_000_000_000)]
    o = att.filter(pl.col("host").is_in(cap.covers)).group_by("id").agg(pl.col("t_ns").first(), pl.col("latency_ns").first(), pl.col("host").first())
    off = RunDir(run_dir).provenance().offsets()
    return sorted(
        (int(t) - off.get(h, 0) - 20_000_000, int(t) + int(lat) - off.get(h, 0) + 20_000_000)
        for t, lat, h in o.select("t_ns", "latency_ns", "host").iter_rows()
    )


def _merge(spans: list[tuple[int, int]]) -> list[list[int]]:
    """Sorted spans with the overlapping ones joined."""
    merged: list[list[int]] = []
    for a, b in spans:
        if merged and a <= merged[-1][1]:
            merged[-1][1] = max(merged[-1][1], b)
        else:
            merged.append([a, b])
    return merged


def _to_global(run_dir: Path, run: RunRecord, host: str, off: int, clocks: list[Any]) -> Callable[[np.ndarray], np.ndarray]:
    """Kernel times of ``host``'s capture onto the run's global clock (its
    time-namespace offset, then the clock-sync estimate when the host is not the reference)."""
    ref = None
    if run.clocksync is not None and run.clocksync.reference != host:
        if not clocks:
            from loopscope.clock import sync

            clocks.append(sync.estimate_run(run_dir))
        ref = clocks[0]

    def to_global(t: np.ndarray) -> np.ndarray:
        th = np.asarray(t, dtype=np.int64) + off
        if ref is None:
            return th
        g, _ = ref.map_mono(host, th)
        return np.asarray(g)

    return to_global


def _slices(w: _Writer, TE: EventTypes, tu: int, gs: np.ndarray, ge: np.ndarray, names: list[str], bounds: np.ndarray | None = None) -> int:
    """One lane's slices (begin and end packets in time order: ends before
    begins at equal times), each with its clock bound when given; how many."""
    pts = sorted([(int(gs[i]), 1, i) for i in range(len(gs))] + [(int(ge[i]), 0, i) for i in range(len(ge))])
    for t, begin, i in pts:
        p = w.packet()
        p.timestamp = t
        p.track_event.track_uuid = tu
        if begin:
            p.track_event.type = TE.TYPE_SLICE_BEGIN
            p.track_event.name = names[i]
            if bounds is not None:
                a = p.track_event.debug_annotations.add()
                a.name = "bound_ns"
                a.int_value = int(bounds[i])
        else:
            p.track_event.type = TE.TYPE_SLICE_END
    return len(gs)


def _lost_tracks(st: S.Store, w: _Writer, TE: EventTypes, track: Track, host: str, parent: int, to_global: Callable[[np.ndarray], np.ndarray]) -> int:
    """Where the capture lost events: a slice per LOST record on its CPU."""
    lw = st.lost
    if lw is None or not len(lw):
        return 0
    n = 0
    for (cpu,), g in lw.sort("start_ns").group_by("cpu", maintain_order=True):
        tu = _uuid("klost", host, cpu)
        track(tu, f"CPU {cpu} lost kernel events", parent)
        gs, ge = to_global(g["start_ns"].to_numpy()), to_global(g["end_ns"].to_numpy())
        n += _slices(w, TE, tu, gs, np.maximum(gs, ge), [f"{k} events lost" for k in g["events"].to_list()])
    return n
