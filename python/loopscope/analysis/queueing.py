"""The bulk-arrival queueing model of Marcondes 2005, fitted to delays that queue inside a host.

Marcondes 2005 read the receiving host's per-packet queueing delay as an M/Er/1
system: packets arrive in bulks (one interrupt's batch), and the delay a
packet sees above the path's floor is Erlang-distributed with about as many
stages as packets per batch. ``fit`` takes such a delay sample (a pipeline
stage's kernel-to-application time, the emulator's queueing) and fits a
shifted Erlang distribution by maximum likelihood: for each candidate floor
below the smallest delay (the delay of a packet that found no queue), the
best integer number of stages k (rate k / mean), keeping the best pair. How well it fits is
the Kolmogorov–Smirnov distance D between the fitted and the empirical
distribution, with its p-value (optimistic, the parameters being estimated
from the same sample: read D), and a verdict: fits when D < 0.05.
"""

from __future__ import annotations

import math

from dataclasses import dataclass


import numpy as np
from loopscope import lazy
from loopscope.units import format_ns

MAX_STAGES = 64
MIN_SAMPLES = 200


@dataclass
class ErlangFit:
    stages: int
    rate_per_ns: float
    floor_ns: float
    mean_above_floor_ns: float
    ks_d: float
    ks_p: float
    n: int

    @property
    def fits(self) -> bool:
        return self.ks_d < 0.05

    def pdf(self, x_ns: np.ndarray) -> np.ndarray:
        """The Erlang density (k stages at the rate) above the floor, 0 below it."""
        y = np.asarray(x_ns, dtype=np.float64) - self.floor_ns
        k, lam = self.stages, self.rate_per_ns
        out = np.zeros_like(y)
        up = y > 0
        out[up] = np.exp(k * math.log(lam) + (k - 1) * np.log(y[up]) - lam * y[up] - math.lgamma(k))
        return out

    def text(self) -> str:

        verdict = "fits" if self.fits else "does not fit"
        return (
            f"M/E{self.stages}/1: Erlang with {self.stages} stage{'s' if self.stages > 1 else ''} "
            f"(≈ {self.stages} packet{'s' if self.stages > 1 else ''} per batch), mean {format_ns(self.mean_above_floor_ns)} above a floor of {format_ns(self.floor_ns)}; "
            f"KS D = {self.ks_d:.3f} ({verdict}, n = {self.n:,})"
        )


def _best_k(y: np.ndarray) -> tuple[int, float]:
    """The number of stages that maximises the Erlang likelihood of y > 0 (rate k / mean)."""
    n, mean, logs, total = len(y), float(y.mean()), float(np.log(y).sum()), float(y.sum())
    ks = np.arange(1, MAX_STAGES + 1)
    lgam = np.cumsum(np.r_[0.0, np.log(ks[:-1])])  # log (k−1)!
    lam = ks / mean
    ll = n * (ks * np.log(lam) - lgam) + (ks - 1) * logs - lam * total
    j = int(np.argmax(ll))
    return int(ks[j]), float(ll[j])


def fit(delays_ns: np.ndarray) -> ErlangFit | None:
    x = np.asarray(delays_ns, dtype=np.float64)
    x = x[np.isfinite(x)]
    if len(x) < MIN_SAMPLES:
        return None
    # The floor (the delay of a packet that found no queue) is fitted with the
    # stages: profile the likelihood over floors just below the smallest delay.
    lo = float(x.min())
    spread = float(np.median(x) - lo)
    if spread <= 0:
        return None
    best = None
    for d in np.r_[0.0, np.geomspace(1e-3 * spread, 0.9 * spread, 40)]:
        floor = lo - max(d, 1e-6 * spread)
        y = x - floor
        k, ll = _best_k(y)
        if best is None or ll > best[2]:
            best = (floor, k, ll)
    floor, k, _ = best  # type: ignore[misc]
    y = x - floor
    mean = float(y.mean())
    lam = k / mean
    d, p = ks_erlang(y, k, lam)
    return ErlangFit(stages=k, rate_per_ns=lam, floor_ns=floor, mean_above_floor_ns=mean, ks_d=d, ks_p=p, n=len(y))


def ks_erlang(y: np.ndarray, k: int, lam: float) -> tuple[float, float]:
    """The Kolmogorov–Smirnov distance of ``y`` from the Erlang distribution
    (k stages, rate ``lam``; its CDF the regularized lower incomplete gamma
    function), and its p-value by Kolmogorov's limiting distribution (the
    fit is judged by the distance alone: ``ErlangFit.fits``)."""
    sp = lazy.special()
    v = np.sort(y)
    n = len(v)
    cdf = sp.gammainc(k, lam * v)
    i = np.arange(1, n + 1)
    d = float(max(np.max(i / n - cdf), np.max(cdf - (i - 1) / n)))
    return d, float(sp.kolmogorov(math.sqrt(n) * d))
