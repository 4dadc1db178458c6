"""Latency statistics and their confidence intervals."""

from __future__ import annotations

import math

import numpy as np
import pytest

from loopscope import stats as S
from loopscope.stats import mean, quantile, summarize


def test_quantiles_are_measured_values_with_an_interval_around_them() -> None:
    x = np.arange(1, 10_001)
    q = quantile(x, 0.5)
    assert q.value == 5000
    assert q.lo is not None and q.hi is not None and q.lo < 5000 < q.hi
    assert 4800 < q.lo and q.hi < 5200


def test_a_tail_quantile_of_a_small_sample_has_an_open_upper_bound() -> None:
    q = quantile(np.arange(500), 0.999)
    assert q.value == 499 and q.hi is None and q.lo is not None


def test_the_interval_covers_the_true_quantile_about_95_percent_of_the_time() -> None:
    rng = np.random.default_rng(7)
    true_p99 = -math.log(0.01)  # exponential(1)
    hits = 0
    trials = 400
    for _ in range(trials):
        x = np.sort(rng.exponential(size=2000))
        q = quantile(x, 0.99)
        hits += q.lo is not None and q.hi is not None and q.lo <= true_p99 <= q.hi
    assert 0.90 <= hits / trials <= 0.99


def test_the_mean_interval_shrinks_with_more_samples() -> None:
    rng = np.random.default_rng(1)
    a = mean(rng.normal(size=100))
    b = mean(rng.normal(size=10_000))
    assert a.lo is not None and a.hi is not None and b.lo is not None and b.hi is not None
    assert (b.hi - b.lo) < (a.hi - a.lo) / 5


@pytest.mark.parametrize("n", [0, 1])
def test_tiny_samples_give_nan_or_open_intervals_not_errors(n: int) -> None:
    s = summarize(np.arange(n))
    assert s.n == n
    if n == 0:
        assert math.isnan(s.p50.value)
    else:
        assert s.p50.value == 0 and s.mean.lo is None


@pytest.mark.parametrize("seed", [1, 2, 3])
def test_the_rank_sum_test_of_each_cut_is_scipys_mann_whitney_u(seed: int) -> None:
    from scipy.stats import mannwhitneyu

    rng = np.random.default_rng(seed)
    # a warm-up's series: a slow head, ties from a coarse clock
    v = np.r_[rng.normal(120, 20, 300), rng.normal(100, 20, 3000)].round()
    cuts = [20, 150, 299, 700]
    got = S.rank_sum_splits(v, cuts)
    for c, p in zip(cuts, got):
        want = mannwhitneyu(v[:c], v[c:], alternative="two-sided", method="asymptotic").pvalue
        assert p == pytest.approx(want, rel=1e-9, abs=1e-300), c


def test_the_median_absolute_deviation_is_scipys() -> None:
    from scipy.stats import median_abs_deviation

    v = np.random.default_rng(4).exponential(10, 999)
    assert S.mad(v) == pytest.approx(median_abs_deviation(v))


def test_a_line_fit_is_scipys_linregress() -> None:
    from scipy.stats import linregress

    rng = np.random.default_rng(5)
    x = rng.uniform(0, 10, 40)
    for y in (2 * x + rng.normal(0, 3, 40), rng.normal(0, 1, 40)):
        want = linregress(x, y)
        slope, r, p = S.line_fit(x, y)
        assert (slope, r, p) == pytest.approx((want.slope, want.rvalue, want.pvalue), rel=1e-9)


def test_theil_sen_s_slope_is_scipys_and_its_interval_holds_it_at_scipys_ranks_or_the_next() -> None:
    from scipy.stats import theilslopes

    rng = np.random.default_rng(6)
    x = np.arange(60, dtype=np.float64)
    y = (0.5 * x + rng.normal(0, 4, 60)).round()  # ties in y
    want = theilslopes(y, x)
    slope, lo, hi = S.theil_sen(x, y)
    assert slope == pytest.approx(want.slope)
    i, j = np.triu_indices(60, 1)
    slopes = np.sort((y[j] - y[i]) / (x[j] - x[i]))
    assert lo < slope < hi
    assert abs(np.searchsorted(slopes, lo) - np.searchsorted(slopes, want.low_slope)) <= 1
    assert abs(np.searchsorted(slopes, hi) - np.searchsorted(slopes, want.high_slope)) <= 1


@pytest.mark.parametrize(("x", "n", "p"), [(3, 40, 0.5), (30, 40, 0.5), (0, 25, 0.3), (25, 25, 0.3), (7, 1000, 0.002), (120, 300, 0.33), (2, 5, 0.4)])
def test_the_binomial_test_is_scipys(x: int, n: int, p: float) -> None:
    from scipy.stats import binomtest

    assert S.binomial_p(x, n, p) == pytest.approx(binomtest(x, n, p).pvalue, rel=1e-9)


def test_a_rate_ratio_s_interval_is_clopper_pearson_on_scipys_beta() -> None:
    from scipy.stats import beta

    _, ci, _ = S.rate_ratio(10, 1000, 30, 1000)
    assert ci is not None
    lo_p, hi_p = beta.ppf(0.025, 30, 40 - 30 + 1), beta.ppf(0.975, 31, 10)
    assert ci == pytest.approx([lo_p / (1 - lo_p), hi_p / (1 - hi_p)], rel=1e-9)


def test_welch_s_interval_and_the_sweeps_f_test_use_scipys_distributions() -> None:
    from scipy import stats

    from loopscope.analysis.runcompare import welch_log_ratio

    rng = np.random.default_rng(8)
    a, b = rng.lognormal(3, 0.3, 12), rng.lognormal(3.2, 0.5, 9)
    got = welch_log_ratio(a, b)
    assert got is not None
    ci, p = got
    w = stats.ttest_ind(np.log(b), np.log(a), equal_var=False)
    assert p == pytest.approx(w.pvalue, rel=1e-9)
    lo = w.confidence_interval(0.95).low
    assert ci[0] == pytest.approx(math.exp(lo), rel=1e-9)
