"""A thread's time split by the channel runtime's own records, innermost first."""

from __future__ import annotations

import polars as pl

from loopscope.analysis.breakdown import split_thread


def _rec(name: str, t: int, d: int, group: str = "chan", kind: str = "interval") -> dict[str, object]:
    return {"t_ns": t, "dur_ns": d, "group": group, "name": name, "kind": kind}


def test_each_nanosecond_goes_to_the_innermost_layer_that_covers_it() -> None:
    df = pl.DataFrame([
        _rec("work", 0, 100, group="app"),   # application
        _rec("get", 100, 60),                # a get: 100-160
        _rec("block", 110, 40),              # waiting 110-150 inside it
        _rec("recv", 120, 10),               # the pump read an item 120-130 while waiting
        _rec("alloc", 125, 2),               # its buffer 125-127
        _rec("put", 200, 20),                # a put 200-220
        _rec("send", 205, 10),               # its send 205-215
        _rec("lock", 201, 2),                # a lock it waited for 201-203
        _rec("work", 220, 30, group="app"),  # application to 250
    ])
    got = split_thread(df)
    assert got == {
        "messaging: alloc": 2, "messaging": 8 + 10, "runtime: lock": 2, "blocking": 40 - 10,
        "runtime": (60 - 40) + (20 - 10 - 2), "application": 250 - 60 - 20,
    }
    assert sum(got.values()) == 250


def test_a_thread_without_channel_records_is_all_application() -> None:
    df = pl.DataFrame([_rec("work", 0, 100, group="app")])
    got = split_thread(df)
    assert got["application"] == 100 and sum(got.values()) == 100
