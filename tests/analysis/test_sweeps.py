"""Sweep fits: a variance growing with the square of the level is called
quadratic, a mean growing in proportion linear."""

from __future__ import annotations

import numpy as np

from loopscope.analysis import sweeps as S


def test_a_quadratic_growth_is_called_quadratic() -> None:
    x = np.array([0.0, 1, 2, 3, 4, 5])
    y = 1000 + 50 * x + 400 * x**2 + np.array([5, -8, 6, -3, 4, -6])
    f = S.fit_xy("standard deviation", x, y)
    assert f.best == "quadratic" and f.p_quadratic is not None and f.p_quadratic < 0.01
    assert "faster than linearly" in S.statement(f)


def test_a_proportional_growth_is_called_linear() -> None:
    rng = np.random.default_rng(1)
    x = np.array([0.0, 1, 2, 3, 4, 5])
    y = 1000 + 300 * x + rng.normal(0, 20, len(x))
    f = S.fit_xy("mean", x, y)
    assert f.best == "linear"
    assert "linear is enough" in S.statement(f)


def test_three_levels_fit_but_do_not_test_the_quadratic_term() -> None:
    f = S.fit_xy("p99", np.array([0.0, 1, 2]), np.array([1.0, 4, 9]))
    assert f.p_quadratic is None and "four levels" in S.statement(f)


def test_a_phase_name_gives_its_level() -> None:
    assert S.level_value("cpu-4") == 4.0
    assert S.level_value("io-50pct") == 50.0
    assert S.level_value("baseline") is None
