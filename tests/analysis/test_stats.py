"""Latency statistics and their confidence intervals."""

from __future__ import annotations

import math

import numpy as np
import pytest

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
