"""A thread's time split by the channel runtime's own records, innermost first."""

from __future__ import annotations

import polars as pl

from loopscope.analysis.breakdown import split_thread


def _rec(name: str, t: int, d: int, group: str = "chan", kind: str = "interval") -> dict[str, object]:
    return {"t_ns": t, "dur_ns": d, "group": group, "name": name, "kind": kind}


def test_each_nanosecond_goes_to_the_innermost_layer_that_covers_it() -> None:
    df = pl.DataFrame(
        [
            _rec("work", 0, 100, group="app"),  # application
            _rec("get", 100, 60),  # a get: 100-160
            _rec("block", 110, 40),  # waiting 110-150 inside it
            _rec("recv", 120, 10),  # the pump read an item 120-130 while waiting
            _rec("alloc", 125, 2),  # its buffer 125-127
            _rec("put", 200, 20),  # a put 200-220
            _rec("send", 205, 10),  # its send 205-215
            _rec("lock", 201, 2),  # a lock it waited for 201-203
            _rec("work", 220, 30, group="app"),  # application to 250
        ]
    )
    got = split_thread(df)
    assert got == {
        "messaging: alloc": 2,
        "messaging": 8 + 10,
        "runtime: lock": 2,
        "blocking": 40 - 10,
        "runtime": (60 - 40) + (20 - 10 - 2),
        "application": 250 - 60 - 20,
    }
    assert sum(got.values()) == 250


def test_a_thread_without_channel_records_is_all_application() -> None:
    df = pl.DataFrame([_rec("work", 0, 100, group="app")])
    got = split_thread(df)
    assert got["application"] == 100 and sum(got.values()) == 100


def test_each_put_and_get_call_splits_into_the_layers_inside_it() -> None:
    from loopscope.analysis.breakdown import split_calls

    df = pl.DataFrame(
        [
            {**_rec("get:frames", 100, 60), "tag": 7},
            {**_rec("block", 110, 40), "tag": 0},
            {**_rec("recv", 120, 10), "tag": 0},
            {**_rec("alloc", 125, 2), "tag": 0},
            {**_rec("put:out", 200, 20), "tag": 8},
            {**_rec("send:out", 205, 10), "tag": 8},
            {**_rec("lock", 201, 2), "tag": 0},
        ]
    )
    c = split_calls(df).sort("t_ns")
    assert c["channel"].to_list() == ["frames", "out"] and c["ts"].to_list() == [7, 8]
    get, put = c.row(0, named=True), c.row(1, named=True)
    assert (get["blocking"], get["messaging"], get["messaging: alloc"], get["runtime"]) == (30, 8, 2, 20)
    assert (put["messaging"], put["runtime: lock"], put["runtime"], put["blocking"]) == (10, 2, 8, 0)
