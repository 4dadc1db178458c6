"""Timestamps: TSC records land on CLOCK_MONOTONIC, and the mono fallback works."""

from __future__ import annotations

import subprocess
import sys
import time
from pathlib import Path

import polars as pl

import loopscope.trace as lt
from loopscope import _native


def test_tsc_records_convert_to_the_monotonic_clock_within_microseconds(tmp_path: Path) -> None:
    p = tmp_path / "c.lstrace"
    marks = []
    with lt.open(p):
        e = lt.event("clk", "e")
        for i in range(200):
            before = _native.mono_ns()
            e(i)
            after = _native.mono_ns()
            marks.append((before, after))
            if i % 50 == 0:
                time.sleep(0.02)  # spread the records over several calibration pairs
    t = lt.read(p, sort=False).filter(pl.col("name") == "e")["t_ns"].to_list()
    # Each record's time lies between the clock reads around it, give or take
    # the calibration's uncertainty (a few hundred ns).
    worst = max(max(b - x, x - a, 0) for x, (b, a) in zip(t, marks))
    assert worst < 5_000, worst


MONO = """
import sys, loopscope.trace as lt
from loopscope import _native
with lt.open(sys.argv[1]):
    e = lt.event("clk", "m")
    a = _native.mono_ns(); e(1); b = _native.mono_ns()
print(a, b)
"""


def test_without_an_invariant_tsc_records_carry_monotonic_time(tmp_path: Path) -> None:
    p = tmp_path / "m.lstrace"
    r = subprocess.run(
        [sys.executable, "-c", MONO, str(p)], capture_output=True, text=True, env={"LOOPSCOPE_CLOCK": "mono", "PATH": "/usr/bin:/bin"}, timeout=60
    )
    assert r.returncode == 0, r.stderr
    a, b = map(int, r.stdout.split())
    inf = lt.info(p)
    assert inf.clock == "mono" and "LOOPSCOPE_CLOCK=mono" in inf.clock_reason
    t = lt.read(p)["t_ns"][0]
    assert a <= t <= b
