"""Timer-latency probe: the cyclictest measurement, with its errors and a trace.

Runs ``crates/probes/src/timer.rs`` (absolute deadlines, pre-faulted sample
arrays, missed periods counted) with the interpreter lock released, then
summarises: every quantile with its confidence interval, the probe's own
overhead (one clock read, part of every latency), the scheduling and memory
locking that actually applied (a refused SCHED_FIFO is reported, not
hidden), and the trace it wrote with one interval record per wake-up.
"""

from __future__ import annotations

import os
from dataclasses import dataclass, field
from typing import Any

from typing_extensions import TypedDict

import numpy as np

from loopscope import _native
from loopscope.stats import LatencySummary, summarize
from loopscope.errors import InputError
from loopscope.probes.common import Envelope, envelope, traced
from loopscope.probes.params import TimerParams, Launch, raise_unfit

MAX_SAMPLES_PER_THREAD = 16_000_000


class ThreadJson(TypedDict):
    index: int
    tid: int
    cpu: int | None
    sched: str
    samples: int
    missed: int
    min_ns: int | None
    p50_ns: int | None
    p99_ns: int | None
    max_ns: int | None


class TimerJson(TypedDict):
    """What ``loopscope probe timer --json`` prints (ns; None without a sample)."""

    samples: int
    missed: int
    min_ns: int | None
    avg_ns: float | None
    p50_ns: int | None
    p99_ns: int | None
    p999_ns: int | None
    max_ns: int | None
    trace: str | None
    ci95_ns: dict[str, list[float | None]]
    overhead_ns: float
    interval_ns: int
    duration_ns: int
    elapsed_ns: int
    interrupted: bool
    kept_samples: int
    mlock: str
    dma_latency: str | None
    trace_records: int | None
    trace_lost_records: int | None
    peer_note: str | None
    threads: list[ThreadJson]
    version: Envelope


@dataclass
class ThreadSummary:
    index: int
    tid: int
    cpu: int | None
    sched: str
    sched_ok: bool
    affinity_ok: bool
    wakeups: int
    missed: int
    summary: LatencySummary


@dataclass
class TimerResult:
    interval_ns: int
    duration_ns: int
    threads: list[ThreadSummary]
    summary: LatencySummary
    samples: int
    missed: int
    kept_samples: int
    overhead_ns: float
    mlock: str
    mlock_ok: bool
    dma_latency: str
    dma_latency_ok: bool
    interrupted: bool
    elapsed_ns: int
    trace: str | None
    trace_records: int | None = None
    trace_lost: int | None = None
    #: what a default changes against cyclictest, said where the number is
    peer_note: str | None = None
    latencies: np.ndarray = field(default_factory=lambda: np.zeros(0, dtype=np.int64), repr=False)

    def to_json(self) -> TimerJson:
        """The ``--json`` object: the keys the issue names first, then errors and context."""
        s = self.summary

        def ci(e: Any) -> list[float | None]:
            return [e.lo, e.hi]

        return {
            "samples": self.samples,
            "missed": self.missed,
            "min_ns": int(s.min) if s.n else None,
            "avg_ns": round(s.mean.value, 1) if s.n else None,
            "p50_ns": int(s.p50.value) if s.n else None,
            "p99_ns": int(s.p99.value) if s.n else None,
            "p999_ns": int(s.p999.value) if s.n else None,
            "max_ns": int(s.max) if s.n else None,
            "trace": self.trace,
            "ci95_ns": {"avg": ci(s.mean), "p50": ci(s.p50), "p99": ci(s.p99), "p999": ci(s.p999)},
            "overhead_ns": round(self.overhead_ns, 1),
            "interval_ns": self.interval_ns,
            "duration_ns": self.duration_ns,
            "elapsed_ns": self.elapsed_ns,
            "interrupted": self.interrupted,
            "kept_samples": self.kept_samples,
            "mlock": self.mlock,
            "dma_latency": self.dma_latency,
            "trace_records": self.trace_records,
            "trace_lost_records": self.trace_lost,
            "peer_note": self.peer_note,
            "threads": [
                {
                    "index": t.index,
                    "tid": t.tid,
                    "cpu": t.cpu,
                    "sched": t.sched,
                    "samples": t.wakeups,
                    "missed": t.missed,
                    "min_ns": int(t.summary.min) if t.summary.n else None,
                    "p50_ns": int(t.summary.p50.value) if t.summary.n else None,
                    "p99_ns": int(t.summary.p99.value) if t.summary.n else None,
                    "max_ns": int(t.summary.max) if t.summary.n else None,
                }
                for t in self.threads
            ],
            "version": envelope("timer"),
        }


def run(p: TimerParams, duration_ns: int, trace_path: str | os.PathLike[str] | None = None) -> TimerResult:
    """Run the probe; write its trace to ``trace_path`` when given."""
    raise_unfit(p)
    interval_ns = p.interval_us * 1000
    if duration_ns < interval_ns:
        raise InputError("duration: must be at least one interval long")
    cpus = list(p.cpu or [])
    with traced(trace_path, ["timer"], away_from=cpus) as tr:
        raw = _native.timer_probe(p, duration_ns, MAX_SAMPLES_PER_THREAD)
    ths = []
    all_lat = []
    for t in raw["threads"]:
        lat = t["latencies"]
        all_lat.append(lat)
        ths.append(
            ThreadSummary(
                index=t["index"],
                tid=t["tid"],
                cpu=t["cpu"],
                sched=t["sched"],
                sched_ok=t["sched_ok"],
                affinity_ok=t["affinity_ok"],
                wakeups=t["wakeups"],
                missed=t["missed"],
                summary=summarize(lat),
            )
        )
    lat = np.concatenate(all_lat) if all_lat else np.zeros(0, dtype=np.int64)
    res = TimerResult(
        interval_ns=interval_ns,
        duration_ns=duration_ns,
        threads=ths,
        summary=summarize(lat),
        samples=sum(t.wakeups for t in ths),
        missed=sum(t.missed for t in ths),
        kept_samples=len(lat),
        overhead_ns=raw["overhead_ns"],
        mlock=raw["mlock"],
        mlock_ok=raw["mlock_ok"],
        dma_latency=raw["dma_latency"],
        dma_latency_ok=raw["dma_latency_ok"],
        interrupted=raw["interrupted"],
        elapsed_ns=raw["elapsed_ns"],
        trace=tr.path,
        trace_records=tr.records,
        trace_lost=tr.lost,
        latencies=lat,
        peer_note=p.peer_note(),
    )
    return res


PARAMS = TimerParams


def launched(p: TimerParams, launch: Launch) -> TimerResult:
    """The probe as an agent starts it."""
    return run(p, launch.duration_ns, launch.trace)
