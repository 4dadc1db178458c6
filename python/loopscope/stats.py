"""Latency summaries where every figure carries its error.

Quantiles are order statistics (a value that was actually measured, nearest
rank) with a distribution-free 95 % confidence interval: the ranks between
which the true quantile lies with that probability follow from the binomial
distribution of how many samples fall below it, approximated by the normal
distribution (exact enough from about 20 expected samples on either side).
When the sample is too small to bound a tail quantile from above (p99.9 of
500 samples), the upper bound is ``None`` and printed as "open", instead of
pretending the maximum bounds it. The mean's interval is the usual
normal-theory one; latencies are skewed and autocorrelated, so it is a
guide, not a guarantee, and the quantiles are the figures to trust.
"""

from __future__ import annotations

import math
from dataclasses import asdict, dataclass

import numpy as np
from loopscope import lazy

Z95 = 1.959963984540054

#: the smallest change called one: a ratio is significant only when its 95 %
#: interval excludes 1 ± this (``--min-effect``), so that a ratio of 1.000×
#: [1.000×, 1.000×] (a fixed delay measured twice) is not a change
MIN_EFFECT = 0.02


def beyond(ratio: float | None, lo: float | None, hi: float | None, min_effect: float = MIN_EFFECT) -> bool:
    """A ratio, and all of its interval, outside 1 ± ``min_effect``: a change, not noise."""
    if ratio is None or lo is None or hi is None or not all(math.isfinite(x) for x in (ratio, lo, hi)):
        return False
    up, down = 1 + min_effect, 1 - min_effect
    return (lo > up and ratio > up) or (hi < down and ratio < down)


@dataclass(frozen=True)
class Estimate:
    """A figure with its 95 % confidence interval (bounds may be open: None)."""

    value: float
    lo: float | None
    hi: float | None

    def as_dict(self) -> dict[str, float | None]:
        return asdict(self)


def quantile(sorted_x: np.ndarray, q: float) -> Estimate:
    """Nearest-rank quantile of sorted samples with a distribution-free 95 % CI."""
    n = len(sorted_x)
    if n == 0:
        return Estimate(math.nan, None, None)
    k = min(max(math.ceil(q * n) - 1, 0), n - 1)
    s = Z95 * math.sqrt(n * q * (1 - q))
    lo_rank = math.floor(n * q - s) - 1
    hi_rank = math.ceil(n * q + s) - 1
    lo = float(sorted_x[lo_rank]) if lo_rank >= 0 else None
    hi = float(sorted_x[hi_rank]) if hi_rank <= n - 1 else None
    return Estimate(float(sorted_x[k]), lo, hi)


def mean(x: np.ndarray) -> Estimate:
    n = len(x)
    if n == 0:
        return Estimate(math.nan, None, None)
    m = float(np.mean(x))
    if n < 2:
        return Estimate(m, None, None)
    half = Z95 * float(np.std(x, ddof=1)) / math.sqrt(n)
    return Estimate(m, m - half, m + half)


@dataclass(frozen=True)
class LatencySummary:
    n: int
    min: float
    mean: Estimate
    p50: Estimate
    p99: Estimate
    p999: Estimate
    max: float


def summarize(samples: np.ndarray) -> LatencySummary:
    """Summary of latency samples (any order)."""
    x = np.sort(np.asarray(samples, dtype=np.int64))
    n = len(x)
    if n == 0:
        nan = Estimate(math.nan, None, None)
        return LatencySummary(0, math.nan, nan, nan, nan, nan, math.nan)
    return LatencySummary(n=n, min=float(x[0]), mean=mean(x), p50=quantile(x, 0.50), p99=quantile(x, 0.99), p999=quantile(x, 0.999), max=float(x[-1]))


# ---- counts: missed deadlines and other events per opportunity ----


def dispersion(per_rep: list[tuple[int, int]]) -> float:
    """How much more the repetitions' counts vary than Poisson counts would
    (Pearson's chi-square over its degrees of freedom; at least 1)."""
    k = sum(x for x, _ in per_rep)
    n = sum(y for _, y in per_rep)
    if len(per_rep) < 2 or k == 0 or n == 0:
        return 1.0
    lam = k / n
    chi = sum((x - y * lam) ** 2 / (y * lam) for x, y in per_rep if y > 0)
    return max(1.0, chi / (len(per_rep) - 1))


def rate_ratio(k_a: float, n_a: float, k_b: float, n_b: float, phi: float = 1.0) -> tuple[float | None, list[float] | None, float | None]:
    """Ratio of two Poisson rates k_b/n_b over k_a/n_a: the point, the
    conditional binomial 95 % interval, the two-sided binomial test's p;
    with ``phi`` > 1 the counts are taken as ``phi`` times as variable."""
    beta, binomtest = lazy.stats().beta, lazy.stats().binomtest
    if n_a <= 0 or n_b <= 0:
        return None, None, None
    if k_a + k_b == 0:
        return None, None, None
    point_ = (k_b / n_b) / (k_a / n_a) if k_a else math.inf
    k_a, k_b, n_a, n_b = (round(k_a / phi), round(k_b / phi), n_a / phi, n_b / phi)
    k = k_a + k_b
    if k == 0:
        return point_, None, None
    point = point_
    lo_p = float(beta.ppf(0.025, k_b, k - k_b + 1)) if k_b > 0 else 0.0
    hi_p = float(beta.ppf(0.975, k_b + 1, k - k_b)) if k_b < k else 1.0

    def to_ratio(p: float) -> float:
        return math.inf if p >= 1 else p / (1 - p) * (n_a / n_b)

    pval = float(binomtest(k_b, k, n_b / (n_a + n_b)).pvalue)
    return point, [to_ratio(lo_p), to_ratio(hi_p)], pval
