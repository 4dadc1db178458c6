"""Each detector on a synthetic series with a known answer, and on noise,
where none may fire."""

from __future__ import annotations

import numpy as np
import pytest

from loopscope.analysis import detectors as D

RNG = np.random.default_rng(7)


def series(n: int = 20_000, dt_ns: float = 1e6, base: float = 50_000.0, noise: float = 5_000.0) -> tuple[np.ndarray, np.ndarray]:
    t = np.arange(n) * dt_ns
    v = base + RNG.gamma(2.0, noise / 2, n)
    return t, v


def kinds(fs: list[D.Finding]) -> set[str]:
    return {f.kind for f in fs}


@pytest.mark.parametrize("seed", [1, 2, 3])
def test_noise_alone_fires_no_detector(seed: int) -> None:
    global RNG
    RNG = np.random.default_rng(seed)
    t, v = series()
    assert D.detect(t, v) == []


def test_a_warm_up_is_found_with_its_length() -> None:
    t, v = series()
    v[:1000] += 200_000 * np.exp(-np.arange(1000) / 400)  # a chaotic start decaying over ~1 s
    f = D.warmup(t, v)
    assert f is not None
    assert 0.2 <= f.values["seconds"] <= 3.0
    assert "warm-up" in f.text


def test_a_periodic_burst_gives_its_period_and_amplitude() -> None:
    t, v = series(n=60_000)  # 60 s at 1 kHz
    hit = (t % 2.5e9) < 20e6  # every 2.5 s, 20 ms of +1.8 ms
    v[hit] += 1_800_000
    f = D.periodic(t, v)
    assert f is not None
    assert f.values["period_s"] == pytest.approx(2.5, rel=0.03)
    assert f.values["amplitude_ns"] == pytest.approx(1_800_000, rel=0.3)
    assert "every 2.500 s" in f.text


def test_regular_gaps_are_counted_with_their_period() -> None:
    t, v = series(n=30_000)
    keep = ~(((t % 8e9) > 1e9) & ((t % 8e9) < 1.015e9))  # 15 ms without records every 8 s
    f = D.gaps(t[keep], v[keep])
    assert f is not None
    assert f.values["count"] == 4
    assert f.values["period_s"] == pytest.approx(8.0, rel=0.01)
    assert f.values["min_ns"] >= 14e6


def test_latencies_at_multiples_of_5_ms_are_called_quantized() -> None:
    t, _ = series(n=5_000)
    v = RNG.integers(1, 6, len(t)) * 5e6 + RNG.normal(0, 50_000, len(t))
    f = D.quantization(t, v)
    assert f is not None
    assert f.values["step_ns"] == 5e6
    assert D.quantization(*series(n=5_000)) is None
    # one narrow cluster is not quantization, whatever step it sits on
    t, _ = series(n=5_000)
    assert D.quantization(t, 5.6e6 + RNG.normal(0, 50_000, len(t))) is None


def test_a_slope_that_resets_is_the_parallel_lines_pattern() -> None:
    t, v = series(n=60_000, noise=2_000)
    v += ((t % 30e9) / 1e9) * 20_000  # +20 µs per s, reset every 30 s
    f = D.drift(t, v)
    assert f is not None
    assert f.values.get("period_s") == pytest.approx(30, rel=0.1)
    assert f.values["slope_ns_per_s"] == pytest.approx(20_000, rel=0.25)


def test_short_series_are_left_alone() -> None:
    t, v = series(n=100)
    v[:20] += 1e6
    assert D.detect(t, v) == []
