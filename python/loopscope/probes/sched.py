"""Scheduler-responsiveness probe (Paul et al. 2003): front end of ``crates/probes/src/sched.rs``.

Two threads spin; a third alternates sleeping ``sleep`` and computing a
burst that takes ``work`` alone. Reported: the third thread's wake-up delay
past each deadline and each burst's extra completion time over the fastest
burst measured alone (before the spinners started), each summarised with
confidence intervals, and the total extra time over the run: how much later
the third thread finished its work than it would have on an idle machine.
"""

from __future__ import annotations

import os
from dataclasses import dataclass, field

from typing_extensions import TypedDict

import numpy as np

from loopscope import _native
from loopscope.stats import LatencySummary, summarize
from loopscope.errors import InputError
from loopscope.probes.common import TracedRunJson, envelope, traced
from loopscope.probes.params import SchedParams, Launch, raise_unfit


class LatencyJson(TypedDict, total=False):
    """A summary of one measure (ns); only ``n`` when there was no sample."""

    n: int
    min_ns: int
    avg_ns: float
    p50_ns: int
    p99_ns: int
    p999_ns: int
    max_ns: int
    ci95_ns: dict[str, list[float | None]]


class SchedJson(TracedRunJson):
    """What ``loopscope probe sched --json`` prints."""

    cycles: int
    calibrated_here: bool
    wake_delay: LatencyJson
    extra_completion: LatencyJson
    total_extra_ns: int
    alone_ns: int
    work_iters: int
    busy_threads: int
    busy_ops: list[int]
    sleep_ns: int
    work_ns: int
    duration_ns: int


@dataclass
class SchedResult:
    duration_ns: int
    busy_threads: int
    sleep_ns: int
    work_ns: int
    work_iters: int
    alone_ns: int
    cycles: int
    wake: LatencySummary
    extra: LatencySummary
    total_extra_ns: int
    busy_ops: list[int]
    elapsed_ns: int
    interrupted: bool
    trace: str | None
    calibrated_here: bool = True
    trace_records: int | None = None
    trace_lost: int | None = None
    wake_delay_ns: np.ndarray = field(default_factory=lambda: np.zeros(0, dtype=np.int64), repr=False)
    extra_ns: np.ndarray = field(default_factory=lambda: np.zeros(0, dtype=np.int64), repr=False)

    def to_json(self) -> SchedJson:
        def summ(s: LatencySummary) -> LatencyJson:
            if not s.n:
                return {"n": 0}
            return {
                "n": s.n,
                "min_ns": int(s.min),
                "avg_ns": round(s.mean.value, 1),
                "p50_ns": int(s.p50.value),
                "p99_ns": int(s.p99.value),
                "p999_ns": int(s.p999.value),
                "max_ns": int(s.max),
                "ci95_ns": {"avg": [s.mean.lo, s.mean.hi], "p50": [s.p50.lo, s.p50.hi], "p99": [s.p99.lo, s.p99.hi]},
            }

        return {
            "cycles": self.cycles,
            "calibrated_here": self.calibrated_here,
            "wake_delay": summ(self.wake),
            "extra_completion": summ(self.extra),
            "total_extra_ns": self.total_extra_ns,
            "alone_ns": self.alone_ns,
            "work_iters": self.work_iters,
            "busy_threads": self.busy_threads,
            "busy_ops": self.busy_ops,
            "sleep_ns": self.sleep_ns,
            "work_ns": self.work_ns,
            "duration_ns": self.duration_ns,
            "elapsed_ns": self.elapsed_ns,
            "interrupted": self.interrupted,
            "trace": self.trace,
            "trace_records": self.trace_records,
            "trace_lost_records": self.trace_lost,
            "version": envelope("sched"),
        }


PARAMS = SchedParams


def run(
    p: SchedParams,
    duration_ns: int,
    *,
    work_iters: int | None = None,
    alone_ns: int | None = None,
    calibrate_only: bool = False,
    trace_path: str | os.PathLike[str] | None = None,
) -> SchedResult:
    """Run the probe. ``work_iters``/``alone_ns`` (from an earlier
    ``calibrate_only`` run, e.g. on the idle machine) fix the burst, so that
    runs under different loads do the same work against the same reference."""
    raise_unfit(p)
    if duration_ns < 10 * (p.sleep_us + p.work_us) * 1000:
        raise InputError("duration: must hold at least 10 sleep/work cycles")
    if (work_iters is None) != (alone_ns is None):
        raise InputError("work_iters and alone_ns go together (both come from one calibration run)")
    with traced(None if calibrate_only else trace_path, ["sched"], away_from=list(p.cpu or [])) as tr:
        raw = _native.sched_probe(p, duration_ns, work_iters, alone_ns, calibrate_only)
    wake = np.asarray(raw["wake_delay_ns"])
    extra = np.asarray(raw["extra_ns"])
    return SchedResult(
        duration_ns=duration_ns,
        busy_threads=p.busy_threads,
        sleep_ns=p.sleep_us * 1000,
        work_ns=p.work_us * 1000,
        work_iters=int(raw["work_iters"]),
        alone_ns=int(raw["alone_ns"]),
        cycles=len(wake),
        wake=summarize(wake),
        extra=summarize(extra),
        total_extra_ns=int(wake.sum() + extra.sum()),
        busy_ops=list(raw["busy_ops"]),
        elapsed_ns=int(raw["elapsed_ns"]),
        interrupted=bool(raw["interrupted"]),
        trace=tr.path,
        calibrated_here=work_iters is None,
        trace_records=tr.records,
        trace_lost=tr.lost,
        wake_delay_ns=wake,
        extra_ns=extra,
    )


def launched(p: SchedParams, launch: Launch) -> SchedResult:
    """The probe as an agent starts it: calibrating, or with the burst its calibration found."""
    c = launch.calibration
    return run(p, launch.duration_ns, work_iters=c.get("work_iters"), alone_ns=c.get("alone_ns"), calibrate_only=launch.calibrate, trace_path=launch.trace)
