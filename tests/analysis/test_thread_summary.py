"""The folded activations pass (``threads`` in constant memory) against the
rows it replaces, on a recorded capture: the same counts, quantiles within
the histograms' stated precision, the same maxima and the same worst outliers."""

from __future__ import annotations

import json
import math
from pathlib import Path

import polars as pl
import pytest

from loopscope.analysis.activations import FIGURES, SIG_DIGITS
from loopscope.analysis.threads import names_in, summary_of_rows, thread_activations, thread_names, thread_summary
from loopscope.kernel import store as S

CAPTURE = Path(__file__).parent.parent / "fixtures" / "runs" / "report" / "run" / "kernel"


@pytest.fixture(scope="module")
def both() -> tuple[pl.DataFrame, pl.DataFrame, pl.DataFrame, pl.DataFrame, pl.DataFrame]:
    st = S.open_dir(CAPTURE)
    tids = sorted(thread_names(st))
    folded = thread_summary(st, tids)
    act = thread_activations(st, tids)
    rows = summary_of_rows(act)
    return folded[0].sort("tid"), folded[1], rows[0].sort("tid"), rows[1], act


def test_a_folded_pass_counts_every_threads_activations_as_the_rows_do(both: tuple[pl.DataFrame, ...]) -> None:
    f, _, r, _, _ = both
    assert len(f) > 5
    cols = ["tid", "activations", "complete", "preemptions", "migrations"]
    assert f.select(cols).equals(r.select(cols))


def test_a_folded_pass_gives_each_quantile_within_its_stated_precision_and_the_exact_maximum(both: tuple[pl.DataFrame, ...]) -> None:
    f, _, r, _, act = both
    tol = 10.0**-SIG_DIGITS
    checked = 0
    for a, b in zip(f.iter_rows(named=True), r.iter_rows(named=True)):
        mine = act.filter((pl.col("tid") == a["tid"]) & pl.col("complete"))
        for fig in FIGURES:
            assert a[f"{fig}_max"] == b[f"{fig}_max"], (a["tid"], fig)
            v = sorted(x for x in mine[fig].drop_nulls().to_list() if fig != "on_bound_ns" or x > 0)
            for q, qv in (("p50", 0.5), ("p99", 0.99)):
                x = a[f"{fig}_{q}"]
                assert (x is None) == (b[f"{fig}_{q}"] is None) == (not v), (a["tid"], fig, q)
                if x is None:
                    continue
                # the rows interpolate between the two ranks around the quantile; the histogram gives the value
                # of one of them, within its precision
                at = (len(v) - 1) * qv
                lo, hi = v[math.floor(at)], v[math.ceil(at)]
                assert lo * (1 - tol) - 1 <= x <= hi * (1 + tol) + 1, (a["tid"], fig, q, x, lo, hi)
                checked += 1
    assert checked > 20


def test_a_folded_pass_keeps_the_same_worst_outliers(both: tuple[pl.DataFrame, ...]) -> None:
    _, fw, _, rw, _ = both
    assert len(fw) > 0
    for tid in rw["tid"].unique().to_list():
        got = fw.filter(pl.col("tid") == tid)["late"].to_list()
        want = rw.filter(pl.col("tid") == tid)["late"].to_list()
        # the fold's outliers start at the p99's bucket, the rows' at the interpolated p99: the latest agree
        n = min(len(got), len(want))
        assert n > 0 and got[:n] == want[:n], tid


def test_the_names_read_a_file_at_a_time_are_those_of_the_whole_capture_read_at_once() -> None:
    st = S.open_dir(CAPTURE)
    assert thread_names(st) == names_in(st.load(st.t_first or 0, st.t_last or 0)) != {}


def test_a_thread_renamed_in_a_later_file_goes_by_its_latest_name_whichever_side_of_a_switch_gave_it(tmp_path: Path) -> None:
    strings = ["old", "new", "other", "third"]

    def segment(seg: int, rows: list[tuple[int, int, int, int, int]]) -> None:
        # (t, the task switched out and its name, the task switched in and its name)
        t, prev, pname, nxt, nname = (list(c) for c in zip(*rows))
        df = pl.DataFrame(
            {"t_ns": t, "cpu": [0] * len(t), "pid": prev, "event": [0] * len(t), "target": prev, "target_comm": pname, "next_pid": nxt, "next_comm": nname}
        )
        df = df.with_columns(*(pl.lit(None).alias(c) for c in S.STORED if c not in df.columns)).select(S.STORED)
        df = df.cast({c: (pl.Int64 if c in ("t_ns", "runtime", "expires", "softexpires") else pl.Int32) for c in S.STORED})
        w = S.write_segment(tmp_path, seg, df, sync=False)
        line = {"seg": seg, "reason": "test", "events": len(t), "t_first_ns": t[0], "t_last_ns": t[-1], "lost": [], **w}
        line |= {"strings": strings, "event_names": ["sched_switch"]} if seg == 0 else {}
        with open(tmp_path / "segments.jsonl", "a") as f:
            f.write(json.dumps(line) + "\n")

    (tmp_path / "events").mkdir()
    # 7 runs as "old", switched in as "new" later in the same file; then switched out as "old" again, then in as "third"
    segment(0, [(100, 7, 0, 8, 2), (200, 8, 2, 7, 1)])
    segment(1, [(300, 7, 0, 8, 2), (400, 9, 2, 7, 3), (500, 9, 2, 8, 2)])
    assert thread_names(S.open_dir(tmp_path)) == {7: "third", 8: "other", 9: "other"}
