"""The tracefs instance a kernel capture's reader owns (``Reader``); the
draining flight recorder's memory is ``ring.py``.

``Reader`` creates the instance (and a twin for ``alternate``), reads its
buffers into segments when asked or when a CPU's buffer is half full, keeps
a window for the flight recorder, and removes the instance on close. The
process around it, its command lines and its signals, is ``drain.py``.
"""

from __future__ import annotations

import json
import os
import signal
import sys
import time
from pathlib import Path
from typing import TYPE_CHECKING

from loopscope import _native
from loopscope.errors import RunError
from loopscope.kernel import segments as S
from loopscope.kernel.ring import Ring
from loopscope.kernel.tracing import FILTERS, Drained, HalfFull, Ready, filter_for, remove_instance, timens_offset_ns

if TYPE_CHECKING:
    import polars as pl


MAX_READ = 1 << 30
#: a watching reader's pace (the monitor's tail reads the segments as they come)
WATCH_READ_S = 0.5
#: a draining flight recorder's pace: its kernel buffers need only hold this long
DRAIN_EVERY_S = 0.2


def _own_threads() -> list[int]:
    """This reader's threads (a flight recorder has started its window
    tables' pool by now: ``kept.start_pool``)."""
    try:
        return sorted(int(t) for t in os.listdir("/proc/self/task"))
    except OSError:
        return [os.getpid()]


def _timens_offset() -> int:

    return timens_offset_ns()


def _sync(path: Path) -> None:
    """Write ``path`` back to the disk now."""
    fd = os.open(path, os.O_RDONLY)
    try:
        os.fsync(fd)
    finally:
        os.close(fd)


def buffer_stats(inst: Path, cpu: int) -> dict[str, int]:
    out: dict[str, int] = {}
    try:
        for line in (inst / "per_cpu" / f"cpu{cpu}" / "stats").read_text().splitlines():
            k, _, v = line.partition(":")
            v = v.strip()
            if v.isdigit():
                out[k.strip()] = int(v)
    except OSError:
        pass
    return out


def dropped(st: dict[str, int]) -> int:
    return st.get("overrun", 0) + st.get("commit overrun", 0) + st.get("dropped events", 0)


class Reader:
    def __init__(
        self, tf: Path, name: str, out: Path, buffer_mb: int, events: list[str], continuously: bool = False, flight: str | None = None, watch: bool = False
    ) -> None:
        self.continuously = continuously or watch
        #: record only the threads in set_event_pid (and those they start)
        self.watch = watch
        #: flight recorder: "alternate" (two instances, one recording while the other is read), "pause" (one, paused while read)
        #: or "drain" (one, read all the time into ``ring``)
        self.flight = flight
        self.ring: Ring | None = None
        self.reach_ns = 8_000_000_000
        #: only what concerns these CPUs is recorded ([]: every CPU)
        self.cpus: list[int] = []
        # flight recorder: the events of the last read after its window (a read consumes
        # the pages), and the pauses so far (kernel ns)
        self.held: pl.DataFrame | None = None
        self.pauses: list[tuple[int, int]] = []
        self.k_strings: list[str] = []
        self.k_events: list[str] = []
        # the flight recorder's instances: (directory, per-CPU fds), the one recording, each one's
        # overrun counters at its last read, and when each last started recording (kernel ns)
        self.pair: list[tuple[Path, dict[int, int]]] = []
        self.active = 0
        self.bases: list[dict[int, int]] = []
        self.since: list[int] = []
        self.tf = tf
        self.inst = tf / "instances" / name
        self.out = out
        self.buffer_mb = buffer_mb
        self.events = events
        self.missing: list[str] = []
        self.filters: dict[str, str] = {}  # event → the filter the kernel records it under
        self.unfiltered: list[str] = []  # events recorded for every thread: this kernel refused the per-thread filter
        self.fds: dict[int, int] = {}
        self.seg = 0
        self.totals = {
            "segments": 0,
            "events": 0,
            "lost_events": 0,
            "lost_unknown_windows": 0,
            "bytes_read": 0,
            "bytes_written": 0,
            "damaged_pages": 0,
            "unknown_records": 0,
            "reads_asked": 0,
            "reads_half_full": 0,
            "read_ns": 0,
            "write_errors": 0,
        }
        self.half_full: list[HalfFull] = []
        self.n_strings = -1

    def _w(self, rel: str, value: str) -> None:
        (self.inst / rel).write_text(value)

    def create(self) -> Ready:

        if self.inst.exists():
            raise RuntimeError(f"a trace instance {self.inst.name} exists already (another capture, or a killed run: loopscope cleanup removes it)")
        self.inst.mkdir()
        self._w("tracing_on", "0")
        self._w("trace_clock", "mono")
        self._w("buffer_size_kb", str(self.buffer_mb * 1024))
        # 50: the kernel wakes the reader's poll only when a buffer is half
        # full; 0 (read continuously): whenever there is anything to read.
        self._w("buffer_percent", "0" if self.continuously else "50")
        try:
            self._w("options/overwrite", "1")
        except OSError:
            pass
        if self.watch:
            # one pid no task has: an empty list would record every thread until the probe adds its own
            self._w("set_event_pid", str(int(Path("/proc/sys/kernel/pid_max").read_text()) - 1))
            self._w("options/event-fork", "1")
        fmt_dir = self.out / "formats"
        fmt_dir.mkdir(parents=True, exist_ok=True)
        header = (self.tf / "events" / "header_page").read_text()
        (fmt_dir / "header_page").write_text(header)
        formats = []
        own = _own_threads()
        for e in self.events:
            sub, name = e.split(":", 1)
            try:
                flt = filter_for(e, own, self.cpus)
                if flt:
                    try:
                        self._w(f"events/{sub}/{name}/filter", flt)
                        self.filters[e] = flt
                    except OSError:
                        # a kernel without COMM or glob filters: only the event's own filter
                        self.unfiltered.append(e)
                        if e in FILTERS:
                            self._w(f"events/{sub}/{name}/filter", FILTERS[e])
                            self.filters[e] = FILTERS[e]
                self._w(f"events/{sub}/{name}/enable", "1")
                text = (self.tf / "events" / sub / name / "format").read_text()
            except OSError:
                self.missing.append(e)
                continue
            (fmt_dir / sub).mkdir(exist_ok=True)
            (fmt_dir / sub / f"{name}.format").write_text(text)
            formats.append((sub, text))
        sub_kb = self.inst / "buffer_subbuf_size_kb"
        self.page_size = int(sub_kb.read_text().strip()) * 1024 if sub_kb.exists() else os.sysconf("SC_PAGE_SIZE")
        self.decoder = _native.KtraceDecoder(header, formats, self.page_size)
        cpus = sorted(int(p.name[3:]) for p in (self.inst / "per_cpu").iterdir() if p.name[3:].isdigit())
        for c in cpus:
            self.fds[c] = os.open(self.inst / "per_cpu" / f"cpu{c}" / "trace_pipe_raw", os.O_RDONLY | os.O_NONBLOCK)
        self.base = {c: dropped(buffer_stats(self.inst, c)) for c in cpus}
        self.pair = [(self.inst, self.fds)]
        if self.flight == "alternate":
            self.pair.append(self._twin(cpus))
        self.bases = [{c: dropped(buffer_stats(d, c)) for c in cpus} for d, _ in self.pair]
        (self.out / "events").mkdir(exist_ok=True)
        # segments written as the import writes them (zstd level 1: the reader's CPU before the bytes on disk)
        self.writer = _native.KtraceSegments(str(self.out), 1)
        self.index = open(self.out / "segments.jsonl", "a")
        self._w("tracing_on", "1")
        self.started_k = time.clock_gettime_ns(time.CLOCK_MONOTONIC) - _timens_offset()
        self.last_k: int = self.started_k
        self.since = [self.started_k for _ in self.pair]
        return {
            "ready": True,
            "page_size": self.page_size,
            "cpus": cpus,
            "missing": self.missing,
            "filters": self.filters,
            "unfiltered": self.unfiltered,
            "buffer_kb": int((self.inst / "buffer_size_kb").read_text().split()[0]),
            # its start and set-up so far: the interpreter, the instance, and the kernel zeroing its ring buffers
            "setup_cpu_s": time.process_time(),
        }

    def _twin(self, cpus: list[int]) -> tuple[Path, dict[int, int]]:
        """The flight recorder's second instance, set up as the first, not recording."""
        d = self.tf / "instances" / f"{self.inst.name}-b"
        if d.exists():
            raise RuntimeError(f"a trace instance {d.name} exists already (a killed monitor: loopscope cleanup removes it)")
        d.mkdir()
        for rel, v in (("tracing_on", "0"), ("trace_clock", "mono"), ("buffer_size_kb", str(self.buffer_mb * 1024))):
            (d / rel).write_text(v)
        try:
            (d / "options/overwrite").write_text("1")
        except OSError:
            pass
        for e in self.events:
            if e in self.missing:
                continue
            sub, name = e.split(":", 1)
            if e in self.filters:
                (d / "events" / sub / name / "filter").write_text(self.filters[e])
            # enabled now, not at the switch: turning events on waits for the
            # kernel to patch its tracepoints on every CPU, which under a
            # busy scheduler took seconds and every keep overran its window
            (d / "events" / sub / name / "enable").write_text("1")
        return d, {c: os.open(d / "per_cpu" / f"cpu{c}" / "trace_pipe_raw", os.O_RDONLY | os.O_NONBLOCK) for c in cpus}

    def drain(self, reason: str, label: str = "") -> Drained:
        """Read every CPU's buffer, decode, write one segment. The events stay
        native from the pages to the file (the import's writer: zstd level 1,
        the same layout), so the reader's cost is the decoder's and the
        writer's, not a table's."""
        t0 = time.monotonic_ns()
        nbytes, dec_ns = self._read_buffers()
        t_read = time.monotonic_ns()
        got = self.decoder.take_batch()
        n = got["n"]
        lost = S.lost_list(got)
        now_k = time.clock_gettime_ns(time.CLOCK_MONOTONIC) - _timens_offset()
        # The buffers' own counters: what the pages did not place is placed
        # over the segment on its CPU, with the counter's number.
        self._place_counted(lost, now_k)
        self.last_k = now_k
        cut = self.writer.cut(got["batch"], None) if n else None
        t_frame = time.monotonic_ns()
        seg: S.Segment = {
            "seg": self.seg,
            "reason": reason,
            "label": label,
            "read_start_mono_ns": t0,
            "read_ns": t_read - t0,
            "bytes_read": nbytes,
            "decode_ns": dec_ns,
            "frame_ns": t_frame - t_read,
            "events": n,
            "t_first_ns": got["t_min"],
            "t_last_ns": got["t_max"],
            "lost": lost,
            "file": None,
            "counts": got["counts"],
        }
        if len(got["strings"]) != self.n_strings:
            seg["strings"], seg["event_names"] = got["strings"], got["events"]
            self.n_strings = len(got["strings"])
        if cut is not None:
            try:
                written = self.writer.write(cut, self.seg)
                # written back now, between windows, not by the kernel's flusher inside a later one
                _sync(self.out / str(written["file"]))
                seg["file"], seg["groups"], seg["bytes"] = written["file"], written["groups"], written["bytes"]
                self.totals["bytes_written"] += seg["bytes"]
            except (RunError, OSError) as e:
                self.totals["write_errors"] += 1
                seg["write_error"] = str(e)
                unwritten: list[S.LostWindow] = [
                    {"cpu": c, "start_ns": a, "end_ns": b, "events": k, "why": f"the segment could not be written: {e}"} for c, a, b, k in got["by_cpu"]
                ]
                seg["lost"] = [*lost, *unwritten]
        seg["write_ns"] = time.monotonic_ns() - t_frame
        self.seg += 1
        self._count(seg, got["counts"], nbytes, reason, t0, label)
        return {
            "seg": self.seg - 1,
            "events": n,
            "lost_events": sum(max(0, w["events"]) for w in seg["lost"]),
            "read_ns": seg["read_ns"] + seg["frame_ns"] + seg["write_ns"],
            "bytes_read": nbytes,
        }

    def _read_buffers(self) -> tuple[int, int]:
        """Every CPU's buffer read and its pages given to the decoder: the bytes read and the ns spent decoding."""
        nbytes = 0
        dec_ns = 0
        # What each buffer held now bounds this read (see ktrace_read).
        held = {c: buffer_stats(self.inst, c).get("bytes", 0) for c in self.fds}
        for c, fd in self.fds.items():
            bound = (held[c] // max(1, self.page_size - 64) + 2) * self.page_size
            # read and decoded a few pages at a time: the bytes are not held whole
            n, ns = self.decoder.read_pages(fd, c, min(bound, MAX_READ))
            nbytes += n
            dec_ns += ns
        return nbytes, dec_ns

    def _place_counted(self, lost: list[S.LostWindow], now_k: int) -> None:
        """The buffers' own counters: what the pages did not place is placed
        over the segment on its CPU, with the counter's number."""
        for c in self.fds:
            total = dropped(buffer_stats(self.inst, c))
            delta, self.base[c] = total - self.base[c], total
            mine = [w for w in lost if w["cpu"] == c]
            known = sum(w["events"] for w in mine if w["events"] >= 0)
            unknown = [w for w in mine if w["events"] < 0]
            rest = delta - known
            if unknown and rest > 0:
                for i, w in enumerate(unknown):
                    w["events"] = rest // len(unknown) + (1 if i < rest % len(unknown) else 0)
                    w["why"] += "; count from the buffer's overrun counter"
            elif rest > 0:
                lost.append(
                    {
                        "cpu": c,
                        "start_ns": self.last_k if self.seg else self.started_k,
                        "end_ns": now_k,
                        "events": rest,
                        "why": "the buffer's overrun counter (no page said where)",
                    }
                )

    def _count(self, seg: S.Segment, counts: dict[str, int], nbytes: int, reason: str, t0: int, label: str) -> None:
        """A written segment added to the totals, and its line appended to segments.jsonl (synced)."""
        t = self.totals
        t["segments"] += 1
        t["events"] += seg["events"]
        t["lost_events"] += sum(max(0, w["events"]) for w in seg["lost"])
        t["lost_unknown_windows"] += sum(1 for w in seg["lost"] if w["events"] < 0)
        t["bytes_read"] += nbytes
        t["damaged_pages"] = counts["damaged_pages"]
        t["unknown_records"] = counts["unknown_type"]
        t["read_ns"] += seg["read_ns"] + seg["frame_ns"] + seg["write_ns"]
        t["reads_asked" if reason == "asked" else "reads_half_full"] += 1
        if reason == "half full":
            self.half_full.append(
                {"mono_ns": t0, "kernel_ns": t0 - _timens_offset(), "read_ns": seg["read_ns"] + seg["frame_ns"] + seg["write_ns"], "after": label}
            )
        try:
            self.index.write(json.dumps(seg) + "\n")
            self.index.flush()
            os.fsync(self.index.fileno())
        except OSError as e:
            t["write_errors"] += 1
            sys.stderr.write(f"ls-kcapture: segments.jsonl: {e}\n")

    def pull(self) -> None:
        """A draining recorder's read: every CPU's new pages into the ring,
        and what the kernel overwrote since the last read as a gap."""

        if self.ring is None:
            self.ring = Ring(self.reach_ns, self.page_size)
        t0 = time.monotonic_ns()
        now_k = time.clock_gettime_ns(time.CLOCK_MONOTONIC) - _timens_offset()
        inst, fds = self.pair[0]
        for c, fd in fds.items():
            st = buffer_stats(inst, c)
            bound = (st.get("bytes", 0) // max(1, self.page_size - 64) + 2) * self.page_size
            buf = _native.ktrace_read(fd, self.page_size, min(bound, MAX_READ))
            if buf:
                self.ring.add(c, buf)
            total = dropped(st)
            if total > self.bases[0].get(c, 0):
                self.ring.gaps.append((c, self.last_k, now_k, total - self.bases[0].get(c, 0)))
                self.bases[0][c] = total
            self.totals["bytes_read"] += len(buf)
        self.last_k = now_k
        self.ring.trim(now_k)
        self.totals["reads_half_full"] += 1  # reads of its own (not asked)
        self.totals["read_ns"] += time.monotonic_ns() - t0

    def close(self) -> None:

        # Stopping already: a second signal (the parent's death after its
        # stop line) must not cut the removal short and leave an instance behind.
        for sig in (signal.SIGTERM, signal.SIGINT):
            signal.signal(sig, signal.SIG_IGN)

        for d, fds in self.pair or [(self.inst, self.fds)]:
            for fd in fds.values():
                try:
                    os.close(fd)
                except OSError:
                    pass
            fds.clear()
            if d.is_dir():
                remove_instance(d.name)
