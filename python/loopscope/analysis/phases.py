"""Every phase of a run against its baseline, for every probe's measures.

A *measure* is one kind of sample a probe produces: the timer's wake-up
latency, the sched probe's wake-up delay and burst completion time (the same
work in every phase, sized once on the idle machine), the
syscall probe's per-call cost of each call, each interval (``group/name``) a
``program`` probe's own instrumentation logged. For each measure and phase the
samples of each repetition are kept apart (the bootstrap resamples within a
repetition), summarised by p50, p99 and the mean (syscall: the mean of its
batch means), each with a 95 % interval, and divided by the baseline phase's
figure, with the interval of that ratio and whether it lies outside 1 ± the minimum effect: the shape
of Tables 2 and 3 of Carlinet et al. 2000, with an error on every cell.

The tail goes beside them wherever a measure has quantiles: p99.9 (its
interval once a phase has 2,000 samples), the maximum (of every sample, no
interval: one sample has none) and, for a probe with deadlines, the missed
ones (metric ``missed``: the value columns hold counts, ``n`` the deadlines;
the ratio is of the two rates, its interval the conditional binomial one
widened by how much more the repetitions' counts vary than Poisson counts).

Every row says how its metric pools the repetitions (``pooled``: the
samples of all of them together; the largest of any; the counts added) and
is marked significant only when its interval lies wholly outside
1 ± ``min_effect`` (a practical threshold, 2 % unless asked otherwise).
"""

from __future__ import annotations

import os
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass

import numpy as np
import polars as pl

from loopscope.analysis.compare import MIN_SAMPLES, POOLING, Resampled, compare_resampled
from loopscope.stats import MIN_EFFECT, beyond
from loopscope.stats import dispersion, rate_ratio

ORDER = ("p50", "p99", "p999", "max", "mean")

SCHEMA = {
    "probe": pl.String,
    "kind": pl.String,
    "measure": pl.String,
    "metric": pl.String,
    "phase": pl.String,
    "loads": pl.String,
    "baseline_phase": pl.String,
    "value_ns": pl.Float64,
    "value_lo_ns": pl.Float64,
    "value_hi_ns": pl.Float64,
    "baseline_ns": pl.Float64,
    "ratio": pl.Float64,
    "ratio_lo": pl.Float64,
    "ratio_hi": pl.Float64,
    "significant": pl.Boolean,
    "p_value": pl.Float64,
    "n": pl.Int64,
    "n_baseline": pl.Int64,
    "reps": pl.Int64,
    "pooled": pl.String,
    "min_effect": pl.Float64,
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


def metrics_of(m: Measure) -> list[str]:
    """The measure's own metrics, with p99.9 and the maximum where it has quantiles, in table order."""
    tail = {"p999", "max"} if "p99" in m.metrics else set()
    return [x for x in ORDER if x in m.metrics or x in tail] + [x for x in m.metrics if x not in ORDER]


def _max_row(ser: list[np.ndarray], base_ser: list[np.ndarray], is_base: bool) -> dict[str, object]:
    v = max((float(x.max()) for x in ser if len(x)), default=float("nan"))
    b = max((float(x.max()) for x in base_ser if len(x)), default=float("nan"))
    nan = float("nan")
    r = 1.0 if is_base else (v / b if b else float("inf"))
    return {
        "value_ns": v,
        "value_lo_ns": nan,
        "value_hi_ns": nan,
        "baseline_ns": b,
        "ratio": r,
        "ratio_lo": 1.0 if is_base else nan,
        "ratio_hi": 1.0 if is_base else nan,
        "significant": False,
        "p_value": None,
    }


def missed_rows(
    m: Measure, per_phase: dict[str, list[tuple[int, int]]], present: list[str], against: dict[str, str] | None = None, min_effect: float = MIN_EFFECT
) -> list[dict[str, object]]:
    """The missed deadlines of ``m``'s probe in each phase, against the baseline's (or the phase ``against`` names)."""
    here = [p for p in present if p in per_phase]
    if not here:
        return []
    default = baseline_of(here)
    loads_of = dict(m.frame.select("phase", "loads").unique().iter_rows())
    rows = []
    for ph in here:
        ref = (against or {}).get(ph)
        base_name = ref if ref in here and ref != ph else default
        base = per_phase[base_name]
        ka, na = sum(k for k, _ in base), sum(n for _, n in base)
        reps = per_phase[ph]
        kb, nb = sum(k for k, _ in reps), sum(n for _, n in reps)
        is_base = ph == base_name
        r, ci, p = (1.0, [1.0, 1.0], None) if is_base else rate_ratio(ka, na, kb, nb, max(dispersion(base), dispersion(reps)))
        nan = float("nan")
        lo, hi = ci if ci else (nan, nan)
        rows.append(
            {
                "probe": m.probe,
                "kind": m.kind,
                "measure": m.name,
                "metric": "missed",
                "phase": ph,
                "loads": loads_of.get(ph, ""),
                "baseline_phase": base_name,
                "value_ns": float(kb),
                "value_lo_ns": nan,
                "value_hi_ns": nan,
                "baseline_ns": float(ka),
                "ratio": nan if r is None else r,
                "ratio_lo": lo,
                "ratio_hi": hi,
                "significant": bool(not is_base and ci is not None and beyond(r, lo, hi, min_effect)),
                "p_value": p,
                "n": nb,
                "n_baseline": na,
                "reps": len(reps),
                "pooled": POOLING["missed"],
                "min_effect": min_effect,
            }
        )
    return rows


def _resampled(measures: list[Measure], phase_order: list[str], against: dict[str, str] | None) -> dict[tuple[int, str, int], Resampled]:
    """The bootstrap replicates every comparison of ``compare_phases`` needs,
    keyed (measure, phase, seed), computed side by side: the resampling and
    its partitions are numpy's, which lets go of the interpreter lock, so two
    CPUs take about 0.6 of the time (the same seeds: the same figures)."""
    jobs: dict[tuple[int, str, int], tuple[Measure, list[str]]] = {}
    for k, m in enumerate(measures):
        present = [p for p in phase_order if p in set(m.frame["phase"].unique().to_list())]
        if not present:
            continue
        boot_metrics = [x for x in metrics_of(m) if x != "max"]
        base_name = baseline_of(present)
        jobs[(k, base_name, 7)] = (m, boot_metrics)
        for i, ph in enumerate(present):
            ref = (against or {}).get(ph)
            against_ph = ref if ref is not None and ref in present and ref != ph else base_name
            if against_ph != base_name:
                jobs[(k, against_ph, 7 + present.index(against_ph))] = (m, boot_metrics)
            if ph != against_ph:
                jobs[(k, ph, 11 + i)] = (m, boot_metrics)

    def one(key: tuple[int, str, int]) -> Resampled:
        m, bm = jobs[key]
        return Resampled(_series(m.frame, key[1]), bm, block=m.block, seed=key[2])

    keys = list(jobs)
    with ThreadPoolExecutor(max(1, min(2, os.cpu_count() or 1)), thread_name_prefix="ls-compare") as pool:
        return dict(zip(keys, pool.map(one, keys)))


def compare_phases(
    measures: list[Measure],
    phase_order: list[str],
    missed: dict[str, dict[str, list[tuple[int, int]]]] | None = None,
    against: dict[str, str] | None = None,
    min_effect: float = MIN_EFFECT,
) -> pl.DataFrame:
    """Every measure (each probe kind says which it has) in every phase
    against the baseline phase, or the phase ``against`` names for it (a
    remedy phase against the phase it remedies); ``missed``: per probe, per
    phase, each repetition's (missed deadlines, deadlines), shown with the
    probe's first measure; a change is significant past 1 ± ``min_effect``."""
    rows = []
    seen: set[str] = set()
    boots = _resampled(measures, phase_order, against)
    for k, m in enumerate(measures):
        present = [p for p in phase_order if p in set(m.frame["phase"].unique().to_list())]
        if not present:
            continue
        base_name = baseline_of(present)
        loads_of = dict(m.frame.select("phase", "loads").unique().iter_rows())
        metrics = metrics_of(m)
        default = (base_name, boots[(k, base_name, 7)])
        for i, ph in enumerate(present):
            base_name, base = default
            ref = (against or {}).get(ph)
            if ref is not None and ref in present and ref != ph:
                base_name, base = ref, boots[(k, ref, 7 + present.index(ref))]
            other = base if ph == base_name else boots[(k, ph, 11 + i)]
            base_ser, ser = base.series, other.series
            for metric in metrics:
                if metric == "max":
                    rows.append(
                        {
                            "probe": m.probe,
                            "kind": m.kind,
                            "measure": m.name,
                            "metric": metric,
                            "phase": ph,
                            "loads": loads_of.get(ph, ""),
                            "baseline_phase": base_name,
                            **_max_row(ser, base_ser, ph == base_name),
                            "n": sum(len(x) for x in ser),
                            "n_baseline": sum(len(x) for x in base_ser),
                            "reps": len(ser),
                            "pooled": POOLING["max"],
                            "min_effect": min_effect,
                        }
                    )
                    continue
                c = compare_resampled(base, other, metric, test=ph != base_name, min_effect=min_effect)
                boot = other.boot.get(metric)
                enough = other.n >= MIN_SAMPLES.get(metric, 20)
                vlo, vhi = (
                    (float(np.percentile(boot, 2.5)), float(np.percentile(boot, 97.5))) if enough and boot is not None and len(boot) else (np.nan, np.nan)
                )
                rows.append(
                    {
                        "probe": m.probe,
                        "kind": m.kind,
                        "measure": m.name,
                        "metric": metric,
                        "phase": ph,
                        "loads": loads_of.get(ph, ""),
                        "baseline_phase": base_name,
                        "value_ns": c.value,
                        "value_lo_ns": vlo,
                        "value_hi_ns": vhi,
                        "baseline_ns": c.baseline,
                        "ratio": c.ratio if ph != base_name else 1.0,
                        "ratio_lo": c.ratio_lo if ph != base_name else 1.0,
                        "ratio_hi": c.ratio_hi if ph != base_name else 1.0,
                        "significant": c.significant if ph != base_name else False,
                        "p_value": c.p_value,
                        "n": c.n_value,
                        "n_baseline": c.n_baseline,
                        "reps": len(ser),
                        "pooled": POOLING.get(metric, "every repetition's samples together"),
                        "min_effect": min_effect,
                    }
                )
        if missed and m.probe in missed and m.probe not in seen:
            rows += missed_rows(m, missed[m.probe], present, against, min_effect)
        seen.add(m.probe)
    return pl.DataFrame(rows, schema=SCHEMA) if rows else pl.DataFrame(schema=SCHEMA)
