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


def mad(x: np.ndarray) -> float:
    """The median absolute deviation from the median (unscaled)."""
    return float(np.median(np.abs(x - np.median(x)))) if len(x) else 0.0


def rank_sum_splits(v: np.ndarray, cuts: list[int]) -> list[float]:
    """Two-sided p-values of the Wilcoxon–Mann–Whitney rank-sum test of
    ``v[:c]`` against ``v[c:]``, for each cut ``c`` (0 < c < len(v)): the
    normal approximation with the tie and continuity corrections (scipy's
    ``mannwhitneyu``, method "asymptotic"). The samples are one series cut
    in two, so it is ranked once for every cut (a warm-up's search tries 30)."""
    n = len(v)
    # tied values share their mean rank, so the order among them is moot: the default sort, 6x a stable one here
    order = np.argsort(v)
    xs = v[order]
    starts = np.flatnonzero(np.r_[True, xs[1:] != xs[:-1]])
    ties = np.diff(np.r_[starts, n]).astype(np.float64)
    ranks = np.empty(n, dtype=np.float64)
    ranks[order] = np.repeat(starts + (ties + 1) / 2, ties.astype(np.int64))
    below = np.r_[0.0, np.cumsum(ranks)]
    tie_term = float(np.sum(ties**3 - ties)) / (n * (n - 1)) if n > 1 else 0.0
    out = []
    for c in cuts:
        n1, n2 = c, n - c
        u1 = below[c] - n1 * (n1 + 1) / 2
        sd = math.sqrt(n1 * n2 / 12 * ((n + 1) - tie_term)) if n1 and n2 else 0.0
        z = (abs(u1 - n1 * n2 / 2) - 0.5) / sd if sd > 0 else 0.0
        out.append(min(1.0, math.erfc(max(z, 0.0) / math.sqrt(2))))
    return out


def line_fit(x: np.ndarray, y: np.ndarray) -> tuple[float, float, float]:
    """Least squares: the slope of ``y`` on ``x``, the correlation r and the
    two-sided p-value of r = 0 (Student's t with n − 2 degrees of freedom)."""
    n = len(x)
    dx, dy = x - x.mean(), y - y.mean()
    sxx, syy, sxy = float(dx @ dx), float(dy @ dy), float(dx @ dy)
    if n < 3 or sxx == 0 or syy == 0:
        return (sxy / sxx if sxx else 0.0), 0.0, 1.0
    r = max(-1.0, min(1.0, sxy / math.sqrt(sxx * syy)))
    df = n - 2
    if abs(r) >= 1:
        return sxy / sxx, r, 0.0
    t = r * math.sqrt(df / (1 - r * r))
    return sxy / sxx, r, float(2 * lazy.special().stdtr(df, -abs(t)))


def theil_sen(x: np.ndarray, y: np.ndarray) -> tuple[float, float, float]:
    """The median of the slopes between every pair of points (Theil 1950,
    Sen 1968) and its 95 % interval: the order statistics of the slopes
    around the median that Kendall's tau's normal approximation gives
    (Sen's variance, corrected for ties in x and in y)."""
    i, j = np.triu_indices(len(x), 1)
    dx = x[j] - x[i]
    ok = dx != 0
    slopes = np.sort((y[j] - y[i])[ok] / dx[ok])
    if not len(slopes):
        return 0.0, 0.0, 0.0

    def tied(v: np.ndarray) -> float:
        k = np.unique(v, return_counts=True)[1].astype(np.float64)
        return float(np.sum(k * (k - 1) * (2 * k + 5)))

    n, big = len(x), len(slopes)
    sd = math.sqrt(max(0.0, (n * (n - 1) * (2 * n + 5) - tied(x) - tied(y)) / 18))
    lo = min(max(int(round((big - Z95 * sd) / 2)) - 1, 0), big - 1)
    hi = min(max(int(round((big + Z95 * sd) / 2)), 0), big - 1)
    return float(np.median(slopes)), float(slopes[lo]), float(slopes[hi])


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
    sp = lazy.special()
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
    # Clopper-Pearson: the beta distribution's quantiles
    lo_p = float(sp.betaincinv(k_b, k - k_b + 1, 0.025)) if k_b > 0 else 0.0
    hi_p = float(sp.betaincinv(k_b + 1, k - k_b, 0.975)) if k_b < k else 1.0

    def to_ratio(p: float) -> float:
        return math.inf if p >= 1 else p / (1 - p) * (n_a / n_b)

    return point, [to_ratio(lo_p), to_ratio(hi_p)], binomial_p(k_b, k, n_b / (n_a + n_b))


def binomial_p(x: int, n: int, p: float) -> float:
    """The two-sided exact binomial test of ``x`` successes in ``n`` trials
    at ``p``: the probability of every outcome no likelier than ``x``
    (with scipy's relative tolerance of 1e-7 for ties in likelihood)."""
    sp = lazy.special()
    if n <= 0 or p <= 0 or p >= 1:
        return 1.0

    def pmf(i: int) -> float:
        return math.exp(math.lgamma(n + 1) - math.lgamma(i + 1) - math.lgamma(n - i + 1) + i * math.log(p) + (n - i) * math.log1p(-p))

    def cdf(i: int) -> float:
        return float(sp.bdtr(i, n, p)) if i >= 0 else 0.0

    def sf(i: int) -> float:
        return float(sp.bdtrc(i, n, p)) if i < n else 0.0

    d, mode = pmf(x) * (1 + 1e-7), n * p
    if x == mode:
        return 1.0
    # the other tail: the outcomes beyond the mode no likelier than x (the pmf falls away from the mode)
    if x < mode:
        lo, hi = math.ceil(mode), n
        while lo < hi:
            mid = (lo + hi) // 2
            lo, hi = (lo, mid) if pmf(mid) <= d else (mid + 1, hi)
        return min(1.0, cdf(x) + (sf(lo - 1) if pmf(lo) <= d else 0.0))
    lo, hi = 0, math.floor(mode)
    while lo < hi:
        mid = (lo + hi + 1) // 2
        lo, hi = (mid, hi) if pmf(mid) <= d else (lo, mid - 1)
    return min(1.0, sf(x - 1) + (cdf(lo) if pmf(lo) <= d else 0.0))
