"""What the report's sections read besides the tables (analysis/inputs.py):
the worst outliers of each probe and phase, ranked once for all of them."""

from __future__ import annotations

import polars as pl

from loopscope.analysis.inputs import SectionInputs


def _attribution() -> pl.DataFrame:
    rows = []
    # probe p, phase a: outliers 1..6, latency 100·id µs, two causes each; phase b: one outlier; probe q: one outlier
    for i in range(1, 7):
        lat = 100_000 * i
        rows += [("p", "a", i, lat, "CPU idle", lat // 4), ("p", "a", i, lat, "load: cpu", lat - lat // 4)]
    rows += [("p", "b", 7, 50_000, "timer interrupt", 50_000), ("q", "a", 8, 9_000_000, "thread: x", 9_000_000)]
    df = pl.DataFrame(rows, schema=["probe", "phase", "id", "latency_ns", "cause", "ns"], orient="row")
    return df.with_columns(
        rep=pl.lit(1), t_ns=pl.col("id") * 1_000, cpu=pl.lit(0), span=pl.lit(False), migrations=pl.lit(0), page_faults=pl.lit(0), complete=pl.col("id") != 3
    )


def test_the_worst_outliers_of_a_probe_and_phase_are_its_largest_first_each_with_its_causes_largest_first() -> None:
    inputs = SectionInputs(_attribution())
    w = inputs.worst("p", "a", 3)
    assert [x["id"] for x in w] == [6, 5, 4]
    assert w[0]["causes"] == [("load: cpu", 450_000), ("CPU idle", 150_000)]
    assert [x["latency_ns"] for x in w] == [600_000, 500_000, 400_000]
    assert [x["complete"] for x in inputs.worst("p", "a", 6)] == [True, True, True, False, True, True]


def test_the_worst_outliers_of_one_probe_and_phase_hold_none_of_anothers() -> None:
    inputs = SectionInputs(_attribution())
    assert [x["id"] for x in inputs.worst("p", "b", 20)] == [7]
    assert [x["id"] for x in inputs.worst("q", "a", 20)] == [8]
    assert inputs.worst("q", "b", 20) == []
    assert SectionInputs(None).worst("p", "a") == []
