"""Every phase of a run against its baseline, for every probe's measures.

A *measure* is one kind of sample a probe produces: the timer's wake-up
latency, the sched probe's wake-up delay and burst completion time (the same
work in every phase, sized once on the idle machine), the
syscall probe's per-call cost of each call, each interval (``group/name``) a
``program`` probe's own instrumentation logged. For each measure and phase the
samples of each repetition are kept apart (the bootstrap resamples within a
repetition), summarised by p50, p99 and the mean (syscall: the mean of its
batch means), each with a 95 % interval, and divided by the baseline phase's
figure, with the interval of that ratio and whether it excludes 1: the shape
of Tables 2 and 3 of Carlinet et al. 2000, with an error on every cell.
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np
import polars as pl

from loopscope.analysis.compare import MIN_SAMPLES, Resampled, compare_resampled

SCHEMA = {
    "probe": pl.String, "kind": pl.String, "measure": pl.String, "metric": pl.String, "phase": pl.String, "loads": pl.String,
    "baseline_phase": pl.String, "value_ns": pl.Float64, "value_lo_ns": pl.Float64, "value_hi_ns": pl.Float64, "baseline_ns": pl.Float64,
    "ratio": pl.Float64, "ratio_lo": pl.Float64, "ratio_hi": pl.Float64, "significant": pl.Boolean, "p_value": pl.Float64,
    "n": pl.Int64, "n_baseline": pl.Int64, "reps": pl.Int64,
}


@dataclass(frozen=True)
class Measure:
    probe: str
    kind: str
    name: str
    frame: pl.DataFrame  # rows of this measure: rep, phase, loads, value
    metrics: tuple[str, ...]
    block: int


def _series(frame: pl.DataFrame, phase: str) -> list[np.ndarray]:
    f = frame.filter(pl.col("phase") == phase)
    return [g["value"].to_numpy().astype(np.float64) for _, g in f.group_by("rep", maintain_order=True)]


def baseline_of(phases: list[str]) -> str:
    return "baseline" if "baseline" in phases else phases[0]


def compare_phases(measures: list[Measure], phase_order: list[str]) -> pl.DataFrame:
    """Every measure (each probe kind says which it has) in every phase
    against the baseline phase."""
    rows = []
    for m in measures:
        present = [p for p in phase_order if p in set(m.frame["phase"].unique().to_list())]
        if not present:
            continue
        base_name = baseline_of(present)
        loads_of = dict(m.frame.select("phase", "loads").unique().iter_rows())
        base = Resampled(_series(m.frame, base_name), list(m.metrics), block=m.block, seed=7)
        for i, ph in enumerate(present):
            ser = _series(m.frame, ph)
            other = base if ph == base_name else Resampled(ser, list(m.metrics), block=m.block, seed=11 + i)
            for metric in m.metrics:
                c = compare_resampled(base, other, metric, test=ph != base_name)
                boot = other.boot.get(metric)
                enough = other.n >= MIN_SAMPLES.get(metric, 20)
                vlo, vhi = (float(np.percentile(boot, 2.5)), float(np.percentile(boot, 97.5))) if enough and boot is not None and len(boot) else (np.nan, np.nan)
                rows.append(
                    {
                        "probe": m.probe, "kind": m.kind, "measure": m.name, "metric": metric, "phase": ph, "loads": loads_of.get(ph, ""),
                        "baseline_phase": base_name, "value_ns": c.value, "value_lo_ns": vlo, "value_hi_ns": vhi, "baseline_ns": c.baseline,
                        "ratio": c.ratio if ph != base_name else 1.0, "ratio_lo": c.ratio_lo if ph != base_name else 1.0,
                        "ratio_hi": c.ratio_hi if ph != base_name else 1.0, "significant": c.significant if ph != base_name else False,
                        "p_value": c.p_value, "n": c.n_value, "n_baseline": c.n_baseline, "reps": len(ser),
                    }
                )
    return pl.DataFrame(rows, schema=SCHEMA) if rows else pl.DataFrame(schema=SCHEMA)
