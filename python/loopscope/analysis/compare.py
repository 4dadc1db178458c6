"""Is a phase different from the baseline? Ratios with confidence intervals.

For every metric (a quantile or the mean of a probe's samples) each phase is
compared with the baseline phase by the ratio phase / baseline, with a 95 %
confidence interval from a block bootstrap: the samples of each repetition
are resampled in blocks of consecutive samples, which keeps most of the
autocorrelation a latency series has (a disturbance lasts several periods),
so the interval is not the over-confident one an i.i.d. bootstrap would
give. A change is *significant* when the interval lies wholly outside
1 ± ``min_effect`` (2 % by default: a practical threshold, so that a
ratio of 1.000× [1.000×, 1.000×] from a fixed delay is not called a
change, however narrow its interval); a metric
with too few samples behind it (``MIN_SAMPLES``) gets no interval and is
never called significant. Batch means of
the syscall probe are independent by construction and are resampled one by
one. The Mann-Whitney U test's p-value is reported beside it as a second
opinion on whether the distributions differ at all.
"""

from __future__ import annotations

import math
from dataclasses import asdict, dataclass

import numpy as np

from loopscope import _native
from loopscope.stats import MIN_EFFECT, beyond, rank_sum_splits

QUANTILES = {"p50": 0.5, "p99": 0.99, "p999": 0.999}
METRICS = [*QUANTILES, "mean"]
# Samples a metric needs before an interval is given for it: a quantile
# needs two samples beyond it (below that the bootstrap only reshuffles
# the maximum and its interval is falsely narrow), anything at least 20.
MIN_SAMPLES = {"p50": 20, "p99": 200, "p999": 2000, "mean": 20}
#: how each metric pools a phase's repetitions (the report, ``compare`` and the dataset alike)
POOLING = {
    "p50": "quantile of every repetition's samples together",
    "p99": "quantile of every repetition's samples together",
    "p999": "quantile of every repetition's samples together",
    "mean": "mean of every repetition's samples together",
    "max": "largest sample of any repetition",
    "missed": "missed deadlines of every repetition added, over their deadlines",
}


def _stats(x: np.ndarray, metrics: list[str]) -> dict[str, np.ndarray]:
    """Metrics of each row of ``x`` (B, n), the quantiles from one partition."""
    n = x.shape[-1]
    ks = _ranks(n, metrics)
    out: dict[str, np.ndarray] = {}
    if ks:
        part = np.partition(x, sorted(set(ks.values())), axis=-1)
        for m, k in ks.items():
            out[m] = part[..., k]
    if "mean" in metrics:
        out["mean"] = x.mean(axis=-1)
    return out


def _ranks(n: int, metrics: list[str]) -> dict[str, int]:
    """The order statistic (0-based) each quantile of ``metrics`` is, of ``n`` samples."""
    return {m: min(max(math.ceil(QUANTILES[m] * n) - 1, 0), n - 1) for m in metrics if m in QUANTILES}


def _starts(lengths: list[int], b: int, block: int, rng: np.random.Generator) -> list[np.ndarray]:
    """For each series of ``lengths`` (the empty ones too, as no starts), the
    starts of ``b`` resamples' circular blocks of ``block`` (capped at the
    series' length) samples, a row per resample: enough blocks to cover it.
    A block may wrap from the end to the start, so every sample is as likely
    to be drawn as any other (a series' last samples would otherwise be
    drawn less, and a tail that sits there be missed)."""
    return [rng.integers(0, n, size=(b, math.ceil(n / max(1, min(block, n))))) if n else np.zeros((b, 0), dtype=np.int64) for n in lengths]


def block_indices(lengths: list[int], b: int, block: int, rng: np.random.Generator) -> np.ndarray:
    """``b`` resamples (rows) of series of ``lengths`` laid end to end, as
    indices into them: each series resampled in circular blocks of
    ``block`` consecutive samples (one series is one repetition; blocks
    never cross repetitions)."""
    parts = []
    off = 0
    for n, starts in zip(lengths, _starts(lengths, b, block, rng)):
        if n == 0:
            continue
        L = max(1, min(block, n))
        idx = ((starts[:, :, None] + np.arange(L)[None, None, :]) % n).reshape(b, starts.shape[1] * L)[:, :n]
        parts.append(idx + off)
        off += n
    return np.concatenate(parts, axis=1) if parts else np.zeros((b, 0), dtype=np.int64)


def block_resample(series: list[np.ndarray], b: int, block: int, rng: np.random.Generator) -> np.ndarray:
    """``b`` resamples (rows) of the concatenated series (``block_indices``)."""
    full: np.ndarray = np.concatenate(series) if series else np.zeros(0)
    out: np.ndarray = full[block_indices([len(s) for s in series], b, block, rng)]
    return out


def _boot_stats(parts: list[np.ndarray], metrics: list[str], b: int, block: int, rng: np.random.Generator) -> dict[str, np.ndarray]:
    """``_stats`` of ``b`` block resamples of ``parts``: the same figures
    (the quantiles exactly, the mean to its last bits), selected natively
    in each replicate instead of partitioning the matrix."""
    lengths = [len(p) for p in parts]
    ks = _ranks(sum(lengths), metrics)
    order = sorted(ks.items(), key=lambda kv: kv[1])
    values = np.concatenate(parts).astype(np.float64)
    picked, means = _native.boot_select(values, lengths, _starts(lengths, b, block, rng), block, [k for _, k in order], "mean" in metrics)
    picked = picked.reshape(b, len(order))
    out = {m: picked[:, j] for j, (m, _) in enumerate(order)}
    if "mean" in metrics:
        out["mean"] = means
    return out


@dataclass(frozen=True)
class Comparison:
    metric: str
    baseline: float
    value: float
    ratio: float
    ratio_lo: float
    ratio_hi: float
    significant: bool
    p_value: float | None
    n_baseline: int
    n_value: int

    def as_dict(self) -> dict[str, float | bool | str | int | None]:
        return asdict(self)

    @property
    def change_pct(self) -> float:
        return (self.ratio - 1) * 100


class Resampled:
    """A phase's samples (one array per repetition), its metrics and their
    bootstrap replicates, computed once and shared by every comparison."""

    def __init__(
        self, series: list[np.ndarray], metrics: list[str] = METRICS, *, block: int = 32, resamples: int = 300, seed: int = 1, max_samples: int = 40_000
    ) -> None:
        full = [np.asarray(s, dtype=np.float64) for s in series]
        #: the samples, one array per repetition (a comparison's maximum and counts read them)
        self.series = full
        parts = [_thin(s, max_samples, len(series)) for s in full]
        self.all = np.concatenate(parts) if parts else np.zeros(0)
        self.n = len(self.all)
        self.metrics = metrics
        if self.n:
            # the point values of every sample; only the resampling is of the thinned ones
            self.point = {m: float(v[0]) for m, v in _stats(np.concatenate(full)[None, :], metrics).items()}
            self.boot = _boot_stats(parts, metrics, resamples, block, np.random.default_rng(seed))
        else:
            self.point = {m: float("nan") for m in metrics}
            self.boot = {}


def compare_resampled(base: Resampled, other: Resampled, metric: str, *, test: bool = True, min_effect: float = MIN_EFFECT) -> Comparison:
    """Ratio other/base of ``metric`` with its 95 % CI, significant past 1 ± ``min_effect``."""
    if base.n == 0 or other.n == 0:
        nan = float("nan")
        return Comparison(metric, nan, nan, nan, nan, nan, False, None, base.n, other.n)
    bv, ov = base.point[metric], other.point[metric]
    if min(base.n, other.n) < MIN_SAMPLES.get(metric, 20):
        with np.errstate(divide="ignore", invalid="ignore"):
            ratio = ov / bv if bv != 0 else float("inf")
        nan = float("nan")
        return Comparison(metric, bv, ov, ratio, nan, nan, False, None, base.n, other.n)
    with np.errstate(divide="ignore", invalid="ignore"):
        ratios = other.boot[metric] / base.boot[metric]
        ratio = ov / bv if bv != 0 else float("inf")
    ratios = ratios[np.isfinite(ratios)]
    lo, hi = (float(np.percentile(ratios, 2.5)), float(np.percentile(ratios, 97.5))) if len(ratios) else (float("nan"), float("nan"))
    p = None
    if test:
        a, b = np.asarray(base.all, dtype=np.float64), np.asarray(other.all, dtype=np.float64)
        # the rank-sum test, asymptotic (each side holds at least MIN_SAMPLES)
        p = rank_sum_splits(np.concatenate([a, b]), [len(a)])[0] if len(a) and len(b) else None
    sig = beyond(ratio, lo, hi, min_effect)
    return Comparison(metric, bv, ov, ratio, lo, hi, sig, p, base.n, other.n)


def compare(base: list[np.ndarray], other: list[np.ndarray], metric: str, *, block: int = 32, resamples: int = 300, seed: int = 1) -> Comparison:
    """One comparison (see Resampled for sharing work between many)."""
    b = Resampled(base, [metric], block=block, resamples=resamples, seed=seed)
    o = Resampled(other, [metric], block=block, resamples=resamples, seed=seed + 1)
    return compare_resampled(b, o, metric)


def _thin(x: np.ndarray, cap: int, parts: int) -> np.ndarray:
    """Keep the bootstrap affordable: at most ``cap`` samples over all parts,
    taken as evenly spaced runs of 256 consecutive samples so that local
    structure (what the blocks resample) is kept."""
    per = max(256, cap // max(1, parts))
    if len(x) <= per:
        return x
    run = 256
    k = per // run
    starts = (np.arange(k) * ((len(x) - run) / max(1, k - 1))).astype(np.int64)
    return np.asarray(x[(starts[:, None] + np.arange(run)[None, :]).ravel()])
