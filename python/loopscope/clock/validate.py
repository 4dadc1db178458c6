"""The true global time of a record, for runs whose clock errors were injected.

On one machine every netns host shares the kernel's clocks; what differs is
injected: a time namespace adds ``clock_offset`` to a host's
CLOCK_MONOTONIC, and the test-only virtual clock (``crates/trace/src/
vclock.rs``) skews every timestamp the host's processes produce as
``t' = t + offset + drift·(t − epoch)``. Undoing both gives the machine's
CLOCK_MONOTONIC, and redoing the reference host's gives the true global
time. ``errors`` compares a run's mapping with this truth.
"""

from __future__ import annotations

import time
from pathlib import Path
from typing import Any

from typing_extensions import TypedDict

import numpy as np
from loopscope.errors import InputError
from loopscope.rundir import LabHost, RunDir


def machine_real_minus_mono() -> int:
    """CLOCK_REALTIME − CLOCK_MONOTONIC of this machine's root time namespace, narrowest of a few reads."""
    best = (1 << 62, 0)
    for _ in range(50):
        a = time.clock_gettime_ns(time.CLOCK_MONOTONIC)
        r = time.clock_gettime_ns(time.CLOCK_REALTIME)
        b = time.clock_gettime_ns(time.CLOCK_MONOTONIC)
        if b - a < best[0]:
            best = (b - a, r - (a + b) // 2)
    return best[1]


class Truth:
    """What the lab injected into each host's clocks (provenance.json's lab hosts), to check the estimate against."""

    def __init__(self, hosts: dict[str, LabHost], reference: str, real_minus_mono: int) -> None:
        self.hosts = hosts
        self.reference = reference
        self.rm = real_minus_mono

    @classmethod
    def of_run(cls, run_dir: Path, real_minus_mono: int | None = None) -> "Truth":
        rd = RunDir(run_dir)
        cs = rd.record().clocksync
        if cs is None:
            raise InputError(f"{run_dir}: the run has no clock-sync probes: nothing to check its clocks against")
        return cls(rd.provenance().lab.hosts, cs.reference, real_minus_mono if real_minus_mono is not None else machine_real_minus_mono())

    def _unskew(self, host: str, t: np.ndarray) -> np.ndarray:
        """A host's reported CLOCK_MONOTONIC → the machine's root CLOCK_MONOTONIC."""
        h = self.hosts[host]
        tns = float(h.clock_offset_ns)
        t = np.asarray(t, dtype=np.float64)
        vc = h.virtual_clock
        if vc:
            d = vc.drift_ppm * 1e-6
            epoch_mono = (vc.epoch_realtime_ns or 0) - self.rm + tns  # the host's CLOCK_MONOTONIC at the epoch
            t = epoch_mono + (t - vc.offset_ns - epoch_mono) / (1 + d)
        return t - tns

    def _skew(self, host: str, root: np.ndarray) -> np.ndarray:
        h = self.hosts[host]
        tns = float(h.clock_offset_ns)
        t = np.asarray(root, dtype=np.float64) + tns
        vc = h.virtual_clock
        if vc:
            d = vc.drift_ppm * 1e-6
            epoch_mono = (vc.epoch_realtime_ns or 0) - self.rm + tns
            t = t + vc.offset_ns + d * (t - epoch_mono)
        return t

    def global_of(self, host: str, t_ns: np.ndarray) -> np.ndarray:
        """True global time (the reference's reported CLOCK_MONOTONIC) of host times t_ns."""
        return self._skew(self.reference, self._unskew(host, t_ns))

    def offset_ns(self, host: str) -> float:
        """The injected offset of the host's timestamps against the reference's, at the epoch."""

        def f(x: LabHost) -> float:
            return float(x.clock_offset_ns) + (x.virtual_clock.offset_ns if x.virtual_clock else 0.0)

        return f(self.hosts[host]) - f(self.hosts[self.reference])

    def drift_ppm(self, host: str) -> float:
        def f(x: LabHost) -> float:
            return x.virtual_clock.drift_ppm if x.virtual_clock else 0.0

        return f(self.hosts[host]) - f(self.hosts[self.reference])


class Errors(TypedDict):
    """Mapped − true global time at some instants of a host (ns), and the mapping's bounds there."""

    n: int
    err_p50_ns: float | None
    err_p99_ns: float | None
    err_max_ns: float | None
    bound_ns: float | None
    bound_max_ns: float | None
    bound_holds: bool
    not_placed: int


def errors(run_dir: Path, clocks: Any, truth: Truth, host: str, t_ns: np.ndarray) -> Errors:
    """Mapped − true global time at host times t_ns, with the mapping's bounds."""
    g, b = clocks.map_mono(host, t_ns)
    true = truth.global_of(host, t_ns)
    err = g.astype(np.float64) - true
    ok = np.isfinite(b)
    e, bb = err[ok], b[ok]
    return {
        "n": int(ok.sum()),
        "err_p50_ns": float(np.percentile(np.abs(e), 50)) if len(e) else None,
        "err_p99_ns": float(np.percentile(np.abs(e), 99)) if len(e) else None,
        "err_max_ns": float(np.max(np.abs(e))) if len(e) else None,
        "bound_ns": float(np.median(bb)) if len(bb) else None,
        "bound_max_ns": float(np.max(bb)) if len(bb) else None,
        "bound_holds": bool(len(e) and np.all(np.abs(e) <= bb)),
        "not_placed": int((~ok).sum()),
    }
