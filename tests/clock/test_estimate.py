"""The offset estimator on synthetic probes whose truth is known: what it
recovers, that its bound holds, and how it says when it cannot."""

from __future__ import annotations

import numpy as np
import pytest

from loopscope.clock import estimate as E
from loopscope.clock.sync import Pairs

T0 = 1_700_000_000_000_000_000


def probes(n: int, theta, there, back, seconds: float = 60.0, seed: int = 1):  # type: ignore[no-untyped-def]
    """Lower bounds θ − d_there and upper bounds θ + d_back at random times."""
    rng = np.random.default_rng(seed)
    t = np.sort(rng.uniform(0, seconds * 1e9, n)).astype(np.int64) + T0
    return t, (theta(t) - there(rng, n)).astype(np.int64), t, (theta(t) + back(rng, n)).astype(np.int64)


def line(off: float, ppm: float):  # type: ignore[no-untyped-def]
    return lambda t: off + ppm * 1e-6 * (t - T0)


def test_symmetric_delays_give_the_offset_and_drift_within_their_bounds() -> None:
    theta = line(3e6, 20.0)
    t_lo, lo, t_up, up = probes(1200, theta, lambda r, n: 20_000 + r.exponential(5_000, n), lambda r, n: 20_000 + r.exponential(5_000, n))
    ws = E.fit(t_lo, lo, t_up, up)
    assert [w.status for w in ws] == ["ok"]
    w = ws[0]
    assert w.drift_lo_ppm <= 20.0 <= w.drift_hi_ppm
    assert abs(w.drift_ppm - 20.0) < 0.05
    t = np.linspace(t_lo.min(), t_lo.max(), 500).astype(np.int64)
    th, b, _ = E.evaluate(ws, t)
    err = np.abs(th - theta(t))
    assert err.max() < 1_000  # symmetric minimum delays: the middle of the corridor is the truth
    assert np.all(err <= b)


def test_asymmetric_delays_bias_the_estimate_but_never_break_the_bound() -> None:
    theta = line(-5e5, -35.0)
    t_lo, lo, t_up, up = probes(800, theta, lambda r, n: 50_000 + r.exponential(10_000, n), lambda r, n: 10_000 + r.exponential(2_000, n), seed=2)
    ws = E.fit(t_lo, lo, t_up, up)
    t = np.linspace(t_lo.min(), t_lo.max(), 500).astype(np.int64)
    th, b, _ = E.evaluate(ws, t)
    err = np.abs(th - theta(t))
    assert err.min() > 10_000  # half the asymmetry of the fastest probes (≈ 20 µs) cannot be seen
    assert np.all(err <= b)


def test_a_step_splits_the_run_into_windows_that_each_fit() -> None:
    def theta(t):  # type: ignore[no-untyped-def]
        return np.where(t < T0 + 30_000_000_000, 1e6, 1e6 + 400_000)

    t_lo, lo, t_up, up = probes(1200, theta, lambda r, n: 20_000 + r.exponential(3_000, n), lambda r, n: 20_000 + r.exponential(3_000, n), seed=3)
    ws = E.fit(t_lo, lo, t_up, up)
    assert len(ws) >= 2
    ok = [w for w in ws if w.status == "ok"]
    bad = [w for w in ws if w.status != "ok"]
    # only the windows that straddle the step (down to the minimum length) fail
    assert all(w.start_ns <= T0 + 30e9 <= w.end_ns for w in bad)
    t = np.concatenate([t_lo[:100], t_lo[-100:]])
    th, b, which = E.evaluate(ok, t)
    assert np.all(np.abs(th - theta(t)) <= b)


def test_a_window_with_too_few_probes_has_no_estimate_and_places_nothing() -> None:
    w = E.fit_window(np.array([T0]), np.array([0]), np.array([T0 + 5]), np.array([10]), T0, T0 + 10)
    assert w.status == "too few probes" and w.offset_ns is None
    th, b, _ = E.evaluate([w], np.array([T0 + 1]))
    assert np.isnan(th[0]) and np.isinf(b[0])


def test_times_outside_the_windows_use_the_nearest_with_a_growing_bound() -> None:
    theta = line(0, 10.0)
    t_lo, lo, t_up, up = probes(600, theta, lambda r, n: 5_000 + r.exponential(1_000, n), lambda r, n: 5_000 + r.exponential(1_000, n))
    ws = E.fit(t_lo, lo, t_up, up)
    inside = np.array([ws[0].t_center_ns])
    later = np.array([ws[-1].end_ns + 600_000_000_000])
    _, b_in, _ = E.evaluate(ws, inside)
    th, b_out, which = E.evaluate(ws, later)
    assert which[0] == len(ws) - 1
    assert b_out[0] > b_in[0]
    assert abs(th[0] - theta(later)[0]) <= b_out[0]


def test_hulls_keep_only_the_bounds_that_can_touch_a_line() -> None:
    t = np.array([0, 1, 2, 3, 4], dtype=np.int64)
    v = np.array([0, 5, 1, 5, 0], dtype=np.int64)
    assert sorted(t[E.hull_lower_bounds(t, v)].tolist()) == [0, 1, 3, 4]
    assert sorted(t[E.hull_upper_bounds(t, -v)].tolist()) == [0, 1, 3, 4]


@pytest.mark.parametrize("step_ns", [5_000_000, -2_000_000])
def test_a_realtime_step_between_calibration_pairs_is_found(step_ns: int) -> None:
    mono = np.arange(0, 20) * 1_000_000_000 + 5_000_000_000
    real = mono + 1_700_000_000_000_000_000
    real[10:] += step_ns
    p = Pairs.of([{"mono_ns": int(m), "realtime_ns": int(r), "realtime_err_ns": 30} for m, r in zip(mono, real)])
    assert len(p.steps) == 1
    assert p.steps[0]["step_ns"] == step_ns
    assert p.steps[0]["after_mono_ns"] == int(mono[9])


def test_a_slewed_realtime_is_not_a_step() -> None:
    mono = np.arange(0, 20) * 1_000_000_000
    real = mono + (mono * 200e-6).astype(np.int64)  # 200 ppm slew
    p = Pairs.of([{"mono_ns": int(m), "realtime_ns": int(r), "realtime_err_ns": 30} for m, r in zip(mono, real)])
    assert p.steps == []


def test_the_max_margin_line_is_the_linear_programs_optimum() -> None:
    """The search over break points finds what a general LP solver (HiGHS)
    finds for (a, b, m), consistent and inconsistent bounds alike."""
    from scipy.optimize import linprog

    rng = np.random.default_rng(7)
    for k in range(300):
        n = int(rng.integers(3, 40))
        xl, xu = np.sort(rng.uniform(-30, 30, n)), np.sort(rng.uniform(-30, 30, n))
        off, drift = rng.uniform(-1e6, 1e6), rng.uniform(-5e4, 5e4)
        there = rng.exponential(rng.uniform(1e3, 1e5), n) - (rng.uniform(0, 3e4) if k % 3 == 0 else 0.0)
        lo, up = off + drift * xl - there, off + drift * xu + rng.exponential(rng.uniform(1e3, 1e5), n)
        A = np.vstack([np.column_stack([-xl, -np.ones(n), np.ones(n)]), np.column_stack([xu, np.ones(n), np.ones(n)])])
        r = linprog([0.0, 0.0, -1.0], A_ub=A, b_ub=np.concatenate([-lo, up]) / 1e6, bounds=[(None, None)] * 3, method="highs")
        got = E._fit(xl, lo, xu, up)
        assert got is not None and r.status == 0
        assert np.allclose(got, r.x * 1e6, rtol=1e-7, atol=1e-3), (k, got, r.x * 1e6)


def test_bounds_that_never_cross_in_time_have_no_max_margin_line() -> None:
    """Every lower bound after every upper one: the margin grows without end."""
    x = np.array([-3.0, -2.0, -1.0])
    assert E._fit(x + 10, np.zeros(3), x, np.ones(3)) is None
