"""Comparing runs, the arithmetic: rate ratios, Holm's correction, criteria."""

from __future__ import annotations

import re

import pytest

from loopscope.analysis.runcompare import CompareError, Criterion, Row, holm, rate_ratio


def test_a_rate_ratio_interval_covers_the_ratio_and_excludes_one_for_a_clear_change() -> None:
    point, ci, p = rate_ratio(10, 10_000, 100, 10_000)
    assert point == pytest.approx(10.0)
    assert ci is not None and ci[0] < 10 < ci[1] and ci[0] > 1
    assert p is not None and p < 1e-6


def test_equal_rates_give_an_interval_around_one() -> None:
    point, ci, p = rate_ratio(50, 10_000, 50, 10_000)
    assert point == pytest.approx(1.0) and ci is not None and ci[0] < 1 < ci[1] and p is not None and p > 0.5


def test_no_missed_deadlines_in_either_run_has_no_ratio() -> None:
    assert rate_ratio(0, 1000, 0, 1000) == (None, None, None)


def _row(p: float, ci: list[float]) -> Row:
    return Row("b", "timer", "idle", "latency", "p99", 1.0, 2.0, 2.0, ci, p)


def test_holm_multiplies_the_smallest_p_value_by_the_number_of_tests_and_keeps_the_order() -> None:
    rows = [_row(0.01, [1.1, 1.5]), _row(0.02, [1.1, 1.5]), _row(0.04, [1.1, 1.5])]
    holm(rows)
    assert [r.p_value for r in rows] == pytest.approx([0.03, 0.04, 0.04])
    assert all(r.significant for r in rows)


def test_a_row_whose_interval_covers_one_is_not_significant_whatever_its_p_value() -> None:
    rows = [_row(0.001, [0.9, 1.5])]
    holm(rows)
    assert not rows[0].significant


def test_a_criterion_trips_only_when_the_whole_interval_is_past_the_bound() -> None:
    c = Criterion.parse("timer.p99 > +10%", {"timer"})
    assert c.bound == pytest.approx(1.10)
    assert c.tripped_by([_row(0.01, [1.2, 1.5])]) and not c.tripped_by([_row(0.01, [1.05, 1.5])])
    assert Criterion.parse("mean < -5%", {"timer"}).tripped_by([Row("b", "timer", "idle", "latency", "mean", 1, 0.5, 0.5, [0.4, 0.6], 0.01)])


@pytest.mark.parametrize("text, needle", [("p99 >> 10", "write METRIC > +N%"), ("p98 > +10%", "write METRIC"), ("nope.p99 > +10%", "no probe named 'nope'")])
def test_a_bad_criterion_is_refused_saying_how_to_write_one(text: str, needle: str) -> None:
    with pytest.raises(CompareError, match=re.escape(needle)):
        Criterion.parse(text, {"timer"})


def test_bursty_missed_deadlines_widen_the_rate_interval_by_their_dispersion() -> None:
    from loopscope.analysis.runcompare import dispersion

    steady = [(10, 1000), (11, 1000), (9, 1000)]
    bursty = [(1, 1000), (28, 1000), (1, 1000)]
    assert dispersion(steady) == 1.0 and dispersion(bursty) > 10
    _, narrow, _ = rate_ratio(30, 3000, 60, 3000)
    _, wide, _ = rate_ratio(30, 3000, 60, 3000, phi=dispersion(bursty))
    assert narrow is not None and wide is not None and wide[0] < narrow[0] and wide[1] > narrow[1]


def test_a_narrow_interval_around_one_is_not_significant_however_small_its_p_value() -> None:
    rows = [Row("b", "pipe", "idle", "e2e", "p99", 1.0, 1.0002, 1.0002, [1.0001, 1.0003], 1e-9)]
    holm(rows)
    assert not rows[0].significant


def test_a_change_past_the_minimum_effect_is_significant_and_a_larger_minimum_effect_unmarks_it() -> None:
    rows = [_row(0.001, [1.05, 1.09])]
    holm(rows, 0.02)
    assert rows[0].significant
    rows = [_row(0.001, [1.05, 1.09])]
    holm(rows, 0.10)
    assert not rows[0].significant


@pytest.mark.parametrize("ci, outcome", [([1.2, 1.5], "fail"), ([0.8, 1.05], "pass"), ([1.0, 1.3], "inconclusive"), (None, "inconclusive")])
def test_a_criterion_fails_passes_or_is_inconclusive_by_where_the_interval_lies(ci: list[float] | None, outcome: str) -> None:
    c = Criterion.parse("p99 > +10%", {"timer"})
    res = c.judge([Row("b", "timer", "idle", "latency", "p99", 1.0, 1.2, 1.2, ci, 0.01)])
    assert res["outcome"] == outcome and res["tripped"] == (outcome == "fail") and res["probes"] == {"timer": outcome}
    assert bool(res["undecided"]) == (outcome == "inconclusive")


def test_one_failing_row_fails_the_criterion_whatever_the_others_say() -> None:
    c = Criterion.parse("p99 > +10%", {"timer"})
    rows = [Row("b", "timer", ph, "latency", "p99", 1.0, 1.0, 1.0, ci, 0.01) for ph, ci in (("a", [0.9, 1.05]), ("b", [1.0, 1.3]), ("c", [1.2, 1.4]))]
    assert c.judge(rows)["outcome"] == "fail"
    assert c.judge(rows[:2])["outcome"] == "inconclusive" and c.judge(rows[:1])["outcome"] == "pass"


def test_a_criterion_no_row_matches_is_inconclusive_and_says_why() -> None:
    res = Criterion.parse("missed > +10%", {"timer"}).judge([_row(0.01, [1.2, 1.5])])
    assert res["outcome"] == "inconclusive" and res["undecided"] == ["no row has missed"]


def test_a_drop_criterion_fails_only_when_the_whole_interval_is_below_its_bound() -> None:
    c = Criterion.parse("mean < -5%", {"timer"})
    row = Row("b", "timer", "idle", "latency", "mean", 1, 0.5, 0.5, [0.4, 0.6], 0.01)
    assert c.judge([row])["outcome"] == "fail"
    row.ci95 = [0.97, 1.1]
    assert c.judge([row])["outcome"] == "pass"


def test_compare_reports_the_largest_sample_as_max_and_pools_quantiles_over_repetitions() -> None:
    import numpy as np
    import polars as pl

    from loopscope.analysis.phases import Measure
    from loopscope.analysis.runcompare import RunData, compare

    rng = np.random.default_rng(3)

    def run(label: str, scale: float) -> RunData:
        reps = [rng.exponential(100.0 * scale, 60_000) for _ in range(2)]
        reps[1][12_345] = 9e6 * scale  # one stall, where thinning to 40,000 samples would likely not look
        frame = pl.DataFrame({"rep": np.repeat([1, 2], 60_000), "phase": "idle", "loads": "none", "value": np.concatenate(reps)})
        return RunData(label, label, 2, [Measure("timer", "timer", "latency", frame, ("p50", "p99", "mean"), 32)])

    a, b = run("a", 1.0), run("b", 1.0)
    rows = {r.metric: r for r in compare([a, b])}
    assert rows["max"].baseline == pytest.approx(9e6) and rows["max"].value == pytest.approx(9e6)
    every = np.concatenate([m.frame["value"].to_numpy() for m in a.measures])
    assert rows["p99"].baseline == pytest.approx(float(np.quantile(every, 0.99)), rel=1e-3)
    assert rows["p99"].ci95 is not None and rows["p99"].ci95[0] <= rows["p99"].ratio <= rows["p99"].ci95[1]
    assert rows["p99"].pooled.startswith("quantile of every repetition") and rows["max"].pooled == "largest sample of any repetition"


def test_a_run_of_one_repetition_is_cut_into_segments_that_carry_its_drift_into_the_interval() -> None:
    import numpy as np
    import polars as pl

    from loopscope.analysis.phases import Measure
    from loopscope.analysis.runcompare import RunData, compare

    rng = np.random.default_rng(5)

    def run(label: str, drift: float) -> RunData:
        # 2,000 samples whose level wanders over the run, as this machine's do between runs
        level = 100.0 * np.repeat(1 + drift * rng.standard_normal(5), 400)
        frame = pl.DataFrame({"rep": 1, "phase": "idle", "loads": "none", "value": rng.exponential(level)})
        return RunData(label, label, 1, [Measure("timer", "timer", "latency", frame, ("p50", "p99", "mean"), 32)])

    a, b = run("a", 0.15), run("b", 0.15)
    rows = {r.metric: r for r in compare([a, b])}
    assert rows["p50"].unit == "segments of a run of one repetition" and rows["p50"].within_run
    lo, hi = rows["p50"].ci95 or [1, 1]
    assert hi / lo > 1.15  # the drift between segments widens it: a bootstrap within the run would be a few per cent wide
    short = RunData("s", "s", 1, [Measure("timer", "timer", "latency", a.measures[0].frame.head(300), ("p50", "p99", "mean"), 32)])
    assert {r.unit for r in compare([short, b]) if r.metric != "missed"} == {"blocks of samples within the run"}
