"""The M/Er/1 fit of Marcondes 2005: the number of stages and the floor of a known
Erlang sample come back, and a sample that is not Erlang is said not to fit."""

from __future__ import annotations

import numpy as np
import pytest

from loopscope.analysis import queueing as Q


@pytest.mark.parametrize("k", [1, 3, 8])
def test_an_erlang_sample_gives_back_its_stages_and_floor(k: int) -> None:
    rng = np.random.default_rng(k)
    x = 4_000 + rng.gamma(k, 2_000 / k, 20_000)  # 4 µs floor, mean 2 µs above it
    f = Q.fit(x)
    assert f is not None
    assert abs(f.stages - k) <= max(1, k // 4)
    assert f.floor_ns == pytest.approx(4_000, abs=600)
    assert f.fits and f.ks_d < 0.05
    assert f"M/E{f.stages}/1" in f.text()


def test_a_bimodal_sample_does_not_fit() -> None:
    rng = np.random.default_rng(3)
    x = np.concatenate([1_000 + rng.gamma(4, 200, 10_000), 50_000 + rng.gamma(4, 200, 10_000)])
    f = Q.fit(x)
    assert f is not None
    assert not f.fits and "does not fit" in f.text()


def test_too_few_samples_are_not_fitted() -> None:
    assert Q.fit(np.arange(50.0)) is None


def test_the_erlang_density_and_ks_distance_are_scipys() -> None:
    from scipy import stats

    rng = np.random.default_rng(7)
    k, lam, floor = 3, 1 / 2_000.0, 10_000.0
    x = floor + rng.gamma(k, 1 / lam, 5_000)
    f = Q.fit(x)
    assert f is not None
    grid = np.linspace(floor - 1_000, floor + 40_000, 200)
    want = stats.gamma.pdf(grid - f.floor_ns, a=f.stages, scale=1 / f.rate_per_ns)
    assert np.allclose(f.pdf(grid), want, rtol=1e-9, atol=1e-300)
    y = x - f.floor_ns
    ks = stats.kstest(y, stats.gamma(a=f.stages, scale=1 / f.rate_per_ns).cdf, method="asymp")
    assert f.ks_d == pytest.approx(ks.statistic, rel=1e-9)
    assert f.ks_p == pytest.approx(ks.pvalue, rel=1e-6)
