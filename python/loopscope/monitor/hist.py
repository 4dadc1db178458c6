"""Latency histograms per period, in HdrHistogram's encoding and log format.

A monitor keeps, per probe, one histogram per period and one for the whole
run, in constant memory whatever the run's length: HdrHistogram's buckets
(``DIGITS`` significant decimal digits, so any value is recorded within
0.1 % of itself, from 1 ns to an hour). Each period's histogram is
appended to ``histograms/<probe>.hlog`` when it closes, in HdrHistogram's
interval-log format (its Java and Python tools, and HdrHistogram's online
plotter, read it: times in seconds since the epoch, values in ns, the
interval's maximum in ms as the format's convention has it). A killed
monitor loses only the period it had open.

Recording is done a batch at a time: values are first rounded down to
their bucket in numpy (what the histogram would do one by one), then each
distinct bucket is recorded once with its count.
"""

from __future__ import annotations

import os
import threading
from collections import deque
from pathlib import Path

import numpy as np
from hdrh.histogram import HdrHistogram
from hdrh.log import HistogramLogReader, HistogramLogWriter

LOWEST = 1
HIGHEST = 3_600_000_000_000  # an hour, in ns
DIGITS = 3
# HdrHistogram's sub-bucket count for 3 digits is 2048: a value keeps its top 11 bits
_SUB_BITS = 11


def new() -> HdrHistogram:
    return HdrHistogram(LOWEST, HIGHEST, DIGITS)


def bucketed(values: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    """Values (ns) rounded down to their bucket's lowest value: (distinct, counts)."""
    v = np.clip(np.asarray(values, dtype=np.int64), LOWEST, HIGHEST)
    if not len(v):
        return v, v
    # frexp is exact for these (below 2^53): v = m 2^e with 0.5 <= m < 1, so e is v's bit length
    shift = np.maximum(0, np.frexp(v.astype(np.float64))[1].astype(np.int64) - _SUB_BITS)
    q = (v >> shift) << shift
    return np.unique(q, return_counts=True)


def record(h: HdrHistogram, values: np.ndarray) -> None:
    for v, n in zip(*bucketed(values)):
        h.record_value(int(v), int(n))


def quantile(h: HdrHistogram, q: float) -> int | None:
    """The value at quantile ``q`` (0-1), None when empty."""
    return int(h.get_value_at_percentile(q * 100)) if h.get_total_count() else None


class LogFile:
    """One probe's interval log, appended a period at a time (and flushed to disk)."""

    def __init__(self, path: Path, probe: str) -> None:
        self.path = path
        fresh = not path.exists() or path.stat().st_size == 0
        path.parent.mkdir(parents=True, exist_ok=True)
        self.f = open(path, "a")
        self.w = HistogramLogWriter(self.f)
        if fresh:
            self.w.output_comment(f"loopscope monitor: probe {probe}, values in ns, one interval per period")
            self.w.output_log_format_version()
            self.w.output_legend()
        self.f.flush()

    def write(self, h: HdrHistogram, start_s: float, end_s: float) -> None:
        self.w.output_interval_histogram(h, start_s, end_s, max_value_unit_ratio=1e6)
        self.f.flush()
        os.fsync(self.f.fileno())

    def close(self) -> None:
        self.f.close()


def read_log(path: Path) -> list[HdrHistogram]:
    """Every interval histogram of a log, in order (a line cut short by a kill is skipped)."""
    out = []
    r = HistogramLogReader(str(path), new())
    while True:
        try:
            h = r.get_next_interval_histogram()
        except (ValueError, TypeError, IndexError):
            continue
        if h is None:
            break
        out.append(h)
    r.close()
    return out


class Recent:
    """The closed periods of the last ``span_ns`` merged, for a threshold
    that is a quantile of the last hour (the open period counts too). The
    periods are merged into ``SLOTS`` slots of a 60th of the span each (a
    histogram is ~270 kB: an hour of 10 s periods of four probes, kept one
    by one, held 390 MB); a slot counts until all of it is older than the
    span, so the span reaches back up to a slot further."""

    SLOTS = 60

    def __init__(self, span_ns: int) -> None:
        self.span_ns = span_ns
        self.slot_ns = max(1, span_ns // self.SLOTS)
        self.closed: deque[tuple[int, HdrHistogram]] = deque()
        self.lock = threading.Lock()

    def add(self, end_ns: int, h: HdrHistogram) -> None:
        slot = end_ns // self.slot_ns
        with self.lock:
            if self.closed and self.closed[-1][0] == slot:
                self.closed[-1][1].add(h)
            else:
                m = new()
                m.add(h)
                self.closed.append((slot, m))
            while self.closed and (self.closed[0][0] + 1) * self.slot_ns < end_ns - self.span_ns:
                self.closed.popleft()

    def quantile(self, q: float, open_values: np.ndarray, at_least: int) -> int | None:
        """The value at ``q`` over the last span and ``open_values``; None
        until ``at_least`` values are there (a p99.9 of 100 values is their maximum)."""
        m = new()
        with self.lock:
            for _, h in self.closed:
                m.add(h)
        record(m, open_values)
        return quantile(m, q) if m.get_total_count() >= at_least else None
