"""Keeping the kernel's events around outliers, and naming their causes.

The kernel records scheduler, interrupt, timer and page-fault events into
the monitor's own tracefs instance; the flight recorder holds the last
seconds of them (``monitor.reach``): by default its reader drains the
kernel's buffers every 0.2 s into its own memory (``recorder: drain``), or
the buffers overwrite and nothing reads them until a keep (``alternate``,
``pause``). When a probe's trace shows an outlier above the threshold (a
fraction of a second after it happened: the probe's trace writer flushes
four times a second in a monitor), the keeper asks
the flight recorder's reader (``loopscope.kernel.drain --flight``) for the
window around it (``MARGIN_NS`` either side, explain's margin), which lands
in ``windows/NNNNNNN/`` as a store of its own, attributes it (the same
native split as ``explain``) and appends every outlier with its causes to
``outliers.jsonl``. Outliers close together share one window. A period's
windows are then packed into one store (pack.py: a window alone costs more
in file-system blocks than in events).

What cannot be kept is counted by why, never dropped silently:
``rate`` (more than ``monitor.keep_per_minute`` windows in a minute),
``overwritten`` (the buffers no longer reached back to the window: the
outlier was seen too late, or the buffer is too small for the load),
``recorder`` (no kernel capture on this machine, or its reader failed),
``disk`` (a window could not be written, or the disk is nearly full),
``stopped`` (still queued when the monitor stopped). A window read while tracing was
paused for an earlier one is kept but marked incomplete (its causes leave
the blind time ``unexplained``).

``monitor.retain`` bounds the windows' disk: the oldest windows are
removed first; their outliers' causes stay in ``outliers.jsonl``.
"""

from __future__ import annotations

import json
import queue
import shutil
import threading
import time
from collections import deque
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Callable

import polars as pl

from loopscope.analysis.explain import attribute_store
from loopscope.kernel import capture as C
from loopscope.kernel import store as S
from loopscope.monitor import pack as P
from loopscope.rundir.monitor import OutlierLine

# Kernel events kept either side of an outlier: half of explain's 20 ms
# (runtime accounting comes at least every 4 ms tick, so 10 ms still holds
# the run that ends a window), which halves a kept window's disk.
MARGIN_NS = 10_000_000
# Events held after a read for the next keep (a read consumes the pages): an
# outlier is kept at most ~1.5 s after it happened (the probe's trace is
# flushed once a second), so the next window starts no earlier than that
# before the read; more would only cost memory (under a switch storm the
# reader held 8 s of events, 500 MB).
HOLD_NS = 3_000_000_000
# An outlier waits this long for others to share the read of the buffers.
BATCH_NS = 500_000_000
# Outliers taken at once: every one waiting, up to this many.
MAX_BATCH = 1000
# After a window's end, wait this long before taking it (the kernel's
# events of the window's last moments are then in the buffers).
SETTLE_NS = 50_000_000
# Windows are kept only while the disk holding the monitor's directory has
# this much free: below it they are counted (``disk``) and the histograms,
# periods and causes (a few kB a period) go on being written.
DISK_FLOOR = 64 << 20
# The events per second per CPU the buffers are sized for (the demo's noise
# records 5-20 k; a busy pipeline 150 k): reach x this x 40 bytes.
SIZED_FOR_EVENTS_PER_S = 50_000


@dataclass
class Outlier:
    """One window above the threshold, as a probe's trace showed it (host clock)."""

    probe: str
    host: str
    tid: int
    t_ns: int
    latency_ns: int
    span: bool
    offset_ns: int = 0  # the host's CLOCK_MONOTONIC minus the kernel's
    queued_k: int = 0  # when the keeper was handed it (kernel clock)

    @property
    def start_k(self) -> int:
        return self.t_ns - self.offset_ns

    @property
    def end_k(self) -> int:
        return self.t_ns + self.latency_ns - self.offset_ns


@dataclass
class Counts:
    above: int = 0
    kept: int = 0
    explained: int = 0
    windows: int = 0
    windows_removed: int = 0
    not_kept: dict[str, int] = field(default_factory=dict)
    by_cause: dict[str, int] = field(default_factory=dict)
    paused_ns: int = 0
    kept_bytes: int = 0

    def miss(self, why: str, n: int = 1) -> None:
        self.not_kept[why] = self.not_kept.get(why, 0) + n


def _bytes(d: Path) -> int:
    """What a window or pack takes on disk (allocated blocks, as du counts)."""
    return sum(f.stat().st_blocks * 512 for f in d.rglob("*")) + d.stat().st_blocks * 512


#: a draining recorder's kernel buffers: room for this long between its reads (it reads every 0.2 s) at
#: SIZED_FOR_EVENTS_PER_S; the same size as the others' (0.8 s of a context-switch storm's 470 k events a second)
DRAIN_KERNEL_NS = 8_000_000_000


def buffer_mb(reach_ns: int) -> int:
    return max(4, int(reach_ns / 1e9 * SIZED_FOR_EVENTS_PER_S * 40 / (1 << 20)) + 1)


class Keeper:
    """The flight recorder, and a thread that keeps and explains outliers as they come."""

    def __init__(
        self,
        out: Path,
        settings: Any,
        name: str,
        roles: Callable[[], dict[int, str]],
        enabled: bool = True,
        note: Callable[[str], None] | None = None,
        cpus: list[int] | None = None,
    ) -> None:
        self.out = out
        self.note = note or (lambda _t: None)
        self.disk_full = False
        self.abandon = False  # stopping: what is left is counted, not kept
        self.closed = False  # stopped: an outlier handed over later is written at once, not kept
        self.settings = settings
        self.roles = roles
        self.counts = Counts()
        self.last: deque[OutlierLine] = deque(maxlen=20)  # the last explained outliers, for the live view
        self.lock = threading.Lock()
        self.q: queue.Queue[Outlier | None] = queue.Queue()
        self.cap: C.Capture | None = None
        self.why_not: str | None = None
        self.kept_times: deque[int] = deque()
        self.windows: deque[tuple[Path, int]] = deque()  # (dir, bytes), oldest first: windows and packs of them
        self.unpacked: list[Path] = []  # kept since the last pack
        self.packed_at = time.monotonic_ns()
        self.pack_error: str | None = None
        self.seq = 0
        self.thread: threading.Thread | None = None
        self.by_probe_cause: dict[tuple[str, str], int] = {}  # for the metrics: (probe, top cause or "not kept: why")
        self.outliers = open(out / "outliers.jsonl", "a")
        self._recount()
        if enabled:
            # a draining recorder keeps the past in its own memory: the kernel's buffers hold what comes between two reads,
            # with room for a read held up (a context-switch storm wrote 19 MB a second on one CPU: 4 MiB overflowed)
            mb = buffer_mb(DRAIN_KERNEL_NS if settings.recorder == "drain" else settings.reach)
            self.cap = C.Capture(out / "kernel", buffer_mb=mb, name=name, read="flight", flight=settings.recorder, reach_ns=int(settings.reach), cpus=cpus)

    def _recount(self) -> None:
        """Windows already on disk (a resumed monitor): retained as before."""
        wd = self.out / "windows"
        P.tidy(wd)
        if wd.is_dir():
            found = sorted((r, p) for p in wd.iterdir() if p.is_dir() and (r := P.ids(p)) is not None)
            for r, d in found:
                b = _bytes(d)
                self.windows.append((d, b))
                self.counts.kept_bytes += b
                self.seq = max(self.seq, r[1] + 1)

    def start(self) -> str | None:
        """Start the recorder (None, or why there is none: outliers are then counted, not kept)."""
        if self.cap is not None:
            meta = self.cap.start()
            if meta.refused:
                self.why_not = meta.refused
                self.cap = None
            else:
                # what the recorder records, as it started: its events, the kernel filters they run under (a CPU filter
                # says which CPUs), those this kernel lacks; the record to check a named cause against
                said = meta.model_dump(
                    mode="json", include={"tool", "instance", "events", "missing_events", "filters", "unfiltered_events", "buffer_mb_per_cpu"}
                )
                (self.out / "kernel" / "recorder.json").write_text(json.dumps(said, indent=1) + "\n")
        else:
            self.why_not = "the flight recorder is off (monitor.recorder: off)"
        self.thread = threading.Thread(target=self._loop, name="ls-keeper", daemon=True)
        self.thread.start()
        return self.why_not

    def reader_tids(self) -> list[int]:
        if self.cap is None or self.cap.proc is None:
            return []
        try:
            return sorted(int(t) for t in __import__("os").listdir(f"/proc/{self.cap.proc.pid}/task"))
        except OSError:
            return []

    def put(self, o: Outlier) -> None:
        o.queued_k = time.clock_gettime_ns(time.CLOCK_MONOTONIC) - C.timens_offset_ns()
        with self.lock:
            self.counts.above += 1
            late = self.closed
            if not late:
                self.q.put(o)
        if late:  # (a tail's read that ended after the keeper stopped: counted and written, never left in the queue)
            self._write([o], None, "stopped", "the monitor stopped before this outlier's window was kept")

    def stop(self, timeout_s: float = 10.0) -> None:
        """Keep what is queued (within ``timeout_s``), then stop the recorder."""
        self.q.put(None)
        if self.thread is not None:
            self.thread.join(timeout_s)
        # what is still queued is counted (not kept: stopped), never dropped
        self.abandon = True
        if self.thread is not None:
            self.thread.join(2.0)
        with self.lock:
            self.closed = True
        left: list[Outlier] = []
        while True:
            try:
                o = self.q.get_nowait()
            except queue.Empty:
                break
            if o is not None:
                left.append(o)
        if left:
            self._write(left, None, "stopped", "the monitor stopped before this outlier's window was kept")
        alive = self.thread is not None and self.thread.is_alive()
        if not alive:
            self._pack(force=True)
        if self.cap is not None:
            self.cap.stop()
            self.cap = None
        with self.lock:
            if not self.outliers.closed:
                self.outliers.flush()
            if not alive:
                self.outliers.close()

    # ---- the keeping thread ---------------------------------------------------------

    def _loop(self) -> None:
        done = False
        while not done:
            try:
                first = self.q.get(timeout=1.0)
            except queue.Empty:
                self._pack()
                continue
            if first is None:
                break
            batch = [first]
            # what comes in the next moments is taken with it, and then
            # everything else waiting (kept slower than they come, the batch
            # grows instead of the queue): one read of the buffers serves them
            # all (a read is of the whole buffer, tens of MB under a busy scheduler)
            wait_until = time.monotonic_ns() + BATCH_NS
            while len(batch) < MAX_BATCH:
                try:
                    nxt = self.q.get(timeout=max(0.0, (wait_until - time.monotonic_ns()) / 1e9))
                except queue.Empty:
                    break
                if nxt is None:
                    done = True
                    break
                batch.append(nxt)
            batch.sort(key=lambda o: o.start_k)
            groups: list[list[Outlier]] = []
            for o in batch:
                # one window for outliers whose margins overlap; apart, each keeps its own (the time between is not worth its disk)
                if not groups or o.start_k - max(g.end_k for g in groups[-1]) > 2 * MARGIN_NS:
                    groups.append([o])
                else:
                    groups[-1].append(o)
            for i, g in enumerate(groups):
                # the read for the oldest window holds the events back to the
                # next one's start, so the later windows need no read of their own
                nxt_start = groups[i + 1][0].start_k - MARGIN_NS if i + 1 < len(groups) else None
                self._keep(g, nxt_start)
            self._pack()

    def _allowed(self) -> bool:
        """Whether the rate limit lets one more window be kept (only windows
        actually kept count against it: a failed keep costs nothing)."""
        now = time.monotonic_ns()
        while self.kept_times and self.kept_times[0] < now - 60_000_000_000:
            self.kept_times.popleft()
        return len(self.kept_times) < int(self.settings.keep_per_minute)

    def _keep(self, group: list[Outlier], hold_from: int | None = None) -> None:
        if self.abandon:
            self._write(group, None, "stopped", "the monitor stopped before this outlier's window was kept")
            return
        if self.cap is None:
            self._write(group, None, "recorder", None)
            return
        if not self._allowed():
            self._write(group, None, "rate", None)
            return
        free = shutil.disk_usage(self.out).free
        if free < DISK_FLOOR:
            if not self.disk_full:
                self.note(
                    f"the disk holding {self.out} has {free >> 20} MB free (under {DISK_FLOOR >> 20} MB): windows are no longer kept "
                    "(counted as not kept: disk); histograms, periods and outliers go on"
                )
            self.disk_full = True
            self._write(group, None, "disk", f"{free >> 20} MB free on the disk")
            return
        if self.disk_full:
            self.disk_full = False
            self.note(f"the disk holding {self.out} has room again ({free >> 20} MB free): windows are kept again")
        t0 = min(o.start_k for o in group) - MARGIN_NS
        t1 = max(o.end_k for o in group) + MARGIN_NS
        # the window's last events must have been recorded
        delay = t1 + SETTLE_NS - (time.clock_gettime_ns(time.CLOCK_MONOTONIC) - C.timens_offset_ns())
        if delay > 0:
            time.sleep(delay / 1e9)
        d = self.out / "windows" / f"{self.seq:07d}"
        self.seq += 1
        now_k = time.clock_gettime_ns(time.CLOCK_MONOTONIC) - C.timens_offset_ns()
        hold = HOLD_NS if hold_from is None else min(max(HOLD_NS, now_k - hold_from), int(self.settings.reach))
        got = self.cap.keep(t0, t1, d, hold)
        if got.get("error"):
            shutil.rmtree(d, ignore_errors=True)
            self._write(group, None, "disk" if "keeping a window" in str(got["error"]) else "recorder", str(got["error"]))
            return
        with self.lock:
            self.counts.paused_ns += int(got.get("paused_ns") or 0)
        if got.get("short"):
            # the buffers did not reach back to the window: nothing of it is worth keeping
            shutil.rmtree(d, ignore_errors=True)
            self._write(
                group, None, "overwritten", f"CPUs {', '.join(str(s['cpu']) for s in got['short'])} no longer held the window", age_ns=got.get("age_ns")
            )
            return
        self.kept_times.append(time.monotonic_ns())
        size = _bytes(d)
        att = self._attribute(d, group)
        with self.lock:
            self.counts.windows += 1
            self.counts.kept_bytes += size
            self.windows.append((d, size))
            self.unpacked.append(d)
        self._write(group, d, None, None, att, blind=bool(got.get("blind")), age_ns=got.get("age_ns"))
        self._retain()

    def _pack(self, force: bool = False) -> None:
        """Pack the windows kept since the last pack into one store (pack.py),
        once a period has passed since the first of them (or at the end)."""
        if not self.unpacked or not force and time.monotonic_ns() - self.packed_at < self.settings.period:
            return
        with self.lock:
            todo, self.unpacked = self.unpacked, []
        try:
            packs = P.pack(todo)
        except OSError as e:  # a full disk: the windows stay as they were, and still count
            self.pack_error = str(e)
            return
        finally:
            self.packed_at = time.monotonic_ns()
        gone = set(todo) - {p for p in todo if p.exists()}
        with self.lock:
            kept = [(d, b) for d, b in self.windows if d not in gone]
            self.counts.kept_bytes = sum(b for _, b in kept)
            for p in packs:
                b = _bytes(p)
                kept.append((p, b))
                self.counts.kept_bytes += b
            kept.sort(key=lambda x: P.ids(x[0]) or (0, 0))
            self.windows = deque(kept)

    def _attribute(self, d: Path, group: list[Outlier]) -> pl.DataFrame | None:
        try:
            st = S.open_dir(d)
            rows = pl.DataFrame(
                {
                    "id": list(range(len(group))),
                    "tid": [o.tid for o in group],
                    "start_k": [o.start_k for o in group],
                    "end_k": [o.end_k for o in group],
                    "span": [o.span for o in group],
                }
            )
            return attribute_store(st, rows, self.roles())
        except Exception as e:  # noqa: BLE001 - one window's failure is said in its record, the monitor goes on
            (d / "error.txt").write_text(f"{type(e).__name__}: {e}\n")
            return None

    def _write(
        self,
        group: list[Outlier],
        d: Path | None,
        why_not: str | None,
        detail: str | None,
        att: pl.DataFrame | None = None,
        blind: bool = False,
        age_ns: int | None = None,
    ) -> None:
        for i, o in enumerate(group):
            rec: OutlierLine = {
                "probe": o.probe,
                "host": o.host,
                "tid": o.tid,
                "t_ns": o.t_ns,
                "latency_ns": o.latency_ns,
                "window": d.name if d is not None else None,
                "not_kept": why_not,
            }
            if o.queued_k:
                rec["queued_after_ms"] = round((o.queued_k - o.start_k) / 1e6, 1)  # from the window's start to the keeper being handed it
            if age_ns is not None:
                rec["kept_after_ms"] = round(age_ns / 1e6, 1)  # from the window's start to its events taken out of the kernel
            if detail:
                rec["detail"] = detail
            if att is not None:
                mine = att.filter(pl.col("id") == i).sort("ns", descending=True)
                total = max(1, o.latency_ns)
                rec["causes"] = [{"cause": c, "ns": int(ns), "share": round(int(ns) / total, 4)} for c, ns in zip(mine["cause"], mine["ns"]) if ns > 0]
                rec["complete"] = bool(mine["complete"][0]) and not blind if len(mine) else False
                rec["top_cause"] = rec["causes"][0]["cause"] if rec["causes"] else None
                if len(mine) and mine["missing"][0]:
                    rec["missing"] = mine["missing"][0]
                if blind:
                    rec["missing"] = "; ".join(x for x in (rec.get("missing"), "tracing was paused inside the window to keep an earlier one") if x)
            self._line(rec)
        with self.lock:
            if not self.outliers.closed:
                self.outliers.flush()

    def add_far(self, rec: OutlierLine) -> None:
        """An outlier line of a far host's own monitor (``monitor.far``): counted and written as this keeper's own."""
        with self.lock:
            self.counts.above += 1
        self._line(rec)
        with self.lock:
            if not self.outliers.closed:
                self.outliers.flush()

    def _line(self, rec: OutlierLine) -> None:
        """An outlier's line counted (kept, explained, by cause, or why not) and written."""
        why_not = rec.get("not_kept")
        with self.lock:
            c = self.counts
            key = (rec["probe"], f"not kept: {why_not}" if why_not is not None else str(rec.get("top_cause") or "unexplained"))
            self.by_probe_cause[key] = self.by_probe_cause.get(key, 0) + 1
            if why_not is not None:
                c.miss(why_not)
            else:
                c.kept += 1
                if top := rec.get("top_cause"):
                    c.explained += 1
                    c.by_cause[top] = c.by_cause.get(top, 0) + 1
            self.last.append(rec)
            if self.outliers.closed:  # (handed over after the keeper stopped: the line is still written)
                with open(self.out / "outliers.jsonl", "a") as late:
                    late.write(json.dumps(rec) + "\n")
            else:
                self.outliers.write(json.dumps(rec) + "\n")

    def _retain(self) -> None:
        """The oldest windows go first while the kept windows exceed ``monitor.retain``."""
        while True:
            with self.lock:
                if self.counts.kept_bytes <= self.settings.retain or len(self.windows) <= 1:
                    return
                d, b = self.windows.popleft()
                self.counts.kept_bytes -= b
                self.counts.windows_removed += P.count(d)
                if d in self.unpacked:
                    self.unpacked.remove(d)
            shutil.rmtree(d, ignore_errors=True)
