"""The open period's trace, read while it is written.

``Tail`` reads the open period's trace whenever its writer has added to it
and hands each new window above the threshold to the flight recorder at
once, while the kernel's buffers still hold its events; ``LiveSource`` is
what a kind's ``windows`` hook reads of a trace still being written (only
what came after the last read). The monitor's loop (``run.py``) starts a
``Tail`` and points it at each period's step.
"""

from __future__ import annotations

import threading
from pathlib import Path
from typing import Any, Callable, Protocol

import numpy as np
import polars as pl

from loopscope.kernel import store as S
from loopscope.kinds import KINDS
from loopscope.monitor.keeper import Keeper, Outlier
from loopscope.rundir import RunRecord, Step
from loopscope.trace import reader

# How often the open period's trace is looked at for outliers (its writer
# flushes every PROBE_FLUSH_MS of run.py; a read happens only when the file has grown).
TAIL_S = 0.25


class Tailed(Protocol):
    """What the tail reads of its monitor."""

    src: "LiveSource"
    keeper: Keeper

    def note_once(self, text: str) -> None: ...

    def threshold_ns(self, open_values: np.ndarray) -> int | None: ...

    def offset(self, host: str) -> int: ...


class LiveSource:
    """What a kind's ``windows`` hook reads (``kinds.base.WindowSource``),
    over the open period's trace as far as it has been written."""

    def __init__(self, run_dir: Path, run: RunRecord, spec: dict[str, object], offset: Callable[[str], int] = lambda _h: 0) -> None:
        self.run_dir, self.run, self.spec = run_dir, run, spec
        self._offset = offset
        #: a watching capture's directory per probe (``live_capture`` kinds), and where the last read ended
        self.stores: dict[str, Path] = {}
        self.since: dict[str, int] = {}

    def after(self, since: dict[str, int]) -> "LiveSource":
        """This source for a read that needs only what came after ``since`` (per probe)."""
        c = LiveSource(self.run_dir, self.run, self.spec, self._offset)
        c.stores, c.since = self.stores, dict(since)
        return c

    def live_store(self, step: Step) -> Any:
        """The watching capture of ``step``'s probe as far as it has been read (None: none yet)."""

        d = self.stores.get(step.probe)
        if d is None or not (d / "segments.jsonl").exists():
            return None
        try:
            return S.open_dir(d)
        except S.CaptureError:
            return None

    def offset(self, host: str) -> int:
        return self._offset(host)

    def grown(self, st: Step) -> int:
        """How much of the step's files there is (the tail reads again when it grows)."""
        n = 0
        for p in (self.run_dir / st.trace if st.trace else None, self.stores[st.probe] / "segments.jsonl" if st.probe in self.stores else None):
            try:
                n += p.stat().st_size if p is not None else 0
            except OSError:
                pass
        return n

    def trace(self, rel: str) -> pl.DataFrame | None:
        got = self.trace_info(rel)
        return None if got is None else got[0]

    def trace_info(self, rel: str) -> tuple[pl.DataFrame, Any] | None:
        p = self.run_dir / rel
        if not p.exists() or p.stat().st_size == 0:
            return None
        try:
            return reader.read_with_info(p, sort=False)
        except Exception:  # noqa: BLE001 - a file its writer has only begun is read again next time
            return None

    def host_of(self, step: Step) -> str:
        return step.host or self.run.first_host

    def same_kernel(self, a: str, b: str) -> bool:
        return True  # every host of a monitor is on this machine's kernel (the monitor refuses others)


class Tail(threading.Thread):
    """Reads the open period's trace whenever its writer has added to it
    (at most every ``TAIL_S``) and hands new windows above the threshold to
    the keeper; keeps the period's values for a quantile threshold. The lock
    guards only the bookkeeping: a read never holds it, so closing a period
    never waits for one (a starved thread reading a long trace would
    otherwise hold the period's close, and its signal, for minutes)."""

    def __init__(self, mon: Tailed, name: str = "ls-tail") -> None:
        super().__init__(name=name, daemon=True)
        self.mon = mon
        self.lock = threading.Lock()
        self.wake = threading.Event()
        self.step: Step | None = None
        self.gen = 0
        self.seen: dict[str, int] = {}
        self.values: list[np.ndarray] = []
        self.size = -1
        self.stopping = False

    def watch(self, step: Step | None) -> None:
        with self.lock:
            self.step, self.gen = step, self.gen + 1
            self.seen, self.values, self.size = {}, [], -1

    def open_values(self, probe: str) -> np.ndarray | None:
        """The values of ``probe``'s open period so far (None: this tail is not watching it now)."""
        with self.lock:
            if self.step is None or self.step.probe != probe:
                return None
            return np.concatenate(self.values) if self.values else np.zeros(0, dtype=np.int64)

    def finish(self) -> pl.DataFrame:
        """Stop watching, then the period's last read (the whole trace): its windows."""
        with self.lock:
            st, gen = self.step, self.gen
            self.step = None
        if st is None:
            return pl.DataFrame()
        w = KINDS[st.kind].windows(st, self.mon.src)
        self._new(w, gen)
        return w

    def stop(self) -> None:
        self.stopping = True
        self.wake.set()

    def run(self) -> None:
        while not self.stopping:
            self.wake.wait(TAIL_S)
            with self.lock:
                st, gen = self.step, self.gen
            if st is None or self.stopping:
                continue
            try:
                size = self.mon.src.grown(st)
                if size == self.size:
                    continue  # nothing flushed since the last read
                self.size = size
                with self.lock:
                    since = dict(self.seen)
                self._new(KINDS[st.kind].windows(st, self.mon.src.after(since)), gen)
            except Exception as e:  # noqa: BLE001 - said once in the notes; the period's close reads the trace again
                self.mon.note_once(f"reading a period's trace while it ran failed: {type(e).__name__}: {e}")

    def _new(self, w: pl.DataFrame, gen: int) -> None:
        """The windows of ``w`` not seen yet (of the period ``gen``) to the keeper when above the threshold."""
        if not len(w):
            return
        fresh = []
        with self.lock:
            if gen != self.gen:
                return  # a read of a period already closed
            for (probe,), g in w.group_by(pl.col("probe").cast(pl.String), maintain_order=True):
                g = g.filter(pl.col("t_ns") > self.seen.get(str(probe), -1))
                if len(g):
                    self.seen[str(probe)] = int(g["t_ns"].max())  # type: ignore[arg-type]
                    fresh.append(g)
            if not fresh:
                return
            new = pl.concat(fresh)
            self.values.append(new["latency_ns"].to_numpy())
            values = np.concatenate(self.values)
        thr = self.mon.threshold_ns(values)
        if thr is None:
            return
        for r in new.filter(pl.col("latency_ns") > thr).iter_rows(named=True):
            self.mon.keeper.put(
                Outlier(str(r["probe"]), str(r["host"]), int(r["tid"]), int(r["t_ns"]), int(r["latency_ns"]), bool(r["span"]), self.mon.offset(str(r["host"])))
            )
