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


def _tables(frames: dict, spec: dict, run: dict | None = None):  # type: ignore[no-untyped-def]
    import polars as pl

    from loopscope.report.tables import RunTables
    from loopscope.rundir import Provenance, RunRecord

    return RunTables(
        run=RunRecord.model_validate({"run_id": "r", "name": "sweep", "status": "completed", **(run or {})}),
        spec=spec,
        provenance=Provenance(),
        frames=frames,
        loads=pl.DataFrame(),
        steps=pl.DataFrame(),
    )


def test_a_load_sweep_fits_the_main_measure_each_kind_names() -> None:
    import polars as pl

    from loopscope.kinds import KINDS

    rng = np.random.default_rng(2)
    rows = [(ph, float(v)) for ph, lv in (("baseline", 0), ("cpu-1", 1), ("cpu-2", 2), ("cpu-4", 4)) for v in 50_000 + 20_000 * lv + rng.normal(0, 500, 200)]
    timer = pl.DataFrame({"probe": ["t"] * len(rows), "phase": [r[0] for r in rows], "latency_ns": [r[1] for r in rows]})
    fits = S.fit(_tables({"timer": timer}, {"sweep": {"kind": ["cpu"]}, "probes": [{"kind": "timer", "name": "t"}]}), KINDS)
    assert [(f["probe"], f["kind"], f["unit"]) for f in fits] == [("t", "cpu", "processes")]
    assert next(x for x in fits[0]["fits"] if x.stat == "mean").best == "linear"


def test_a_link_sweep_fits_every_interval_a_program_logged() -> None:
    import polars as pl

    from loopscope.kinds import KINDS

    delays = {"d1": 1_000_000, "d2": 2_000_000, "d4": 4_000_000}
    rows = [(ph, iv, float(d * k + i)) for ph, d in delays.items() for iv, k in (("loop/rtt", 2), ("loop/work", 0)) for i in range(50)]
    prog = pl.DataFrame({"probe": ["p"] * len(rows), "phase": [r[0] for r in rows], "interval": [r[1] for r in rows], "dur_ns": [r[2] for r in rows]})
    run = {"phase_links": {ph: [{"name": "ab", "delay_ns": d}] for ph, d in delays.items()}}
    fits = S.fit(_tables({"program": prog}, {"probes": [{"kind": "program", "name": "p"}]}, run), KINDS)
    assert [f["probe"] for f in fits] == ["p loop/rtt", "p loop/work"] and all(f["kind"] == "link ab delay" for f in fits)
