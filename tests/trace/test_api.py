"""The Python instrumentation API, end to end through a real trace file."""

from __future__ import annotations

import threading
from pathlib import Path

import polars as pl
import pytest

import loopscope.trace as lt
from loopscope.errors import InputError


def test_every_kind_reads_back_with_its_fields(tmp_path: Path) -> None:
    p = tmp_path / "k.lstrace"
    with lt.open(p):
        ev = lt.event("py", "ev", "an event")
        iv = lt.interval("py", "iv")
        ct = lt.counter("py", "ct")
        hs = lt.histogram("py", "hs", linear=(0, 100, 10))
        ev(1)
        ev.event(2, value=-5)
        ev.event(3, payload=b"\x00abc")
        t0 = lt.now()
        iv.interval(t0, 4)
        iv.interval_ns(5_000, 250, 5)
        ct.add(7)
        ct.add(3)
        ct.log()
        ct.reset()
        for v in (1, 15, 15, 200, -1):
            hs.add(v)
        hs.log()
    df = lt.read(p, sort=False)
    assert df["kind"].to_list() == ["event"] * 3 + ["interval"] * 2 + ["counter"] * 2 + ["histogram"]
    assert df["tag"].to_list()[:6] == [1, 2, 3, 4, 5, 0]
    assert df["value"].to_list() == [None, -5, None, None, None, 10, 10, 5]
    assert df["payload"].to_list()[2] == b"\x00abc"
    assert df["payload"].null_count() == 7
    assert df["dur_ns"].to_list()[4] == 250 and df["t_ns"].to_list()[4] == 5_000
    assert df["dur_ns"][3] >= 0
    assert df["group"].cast(pl.String).unique().to_list() == ["py"]
    h = lt.histograms(p)
    inner = h.filter(pl.col("lo").is_not_null())
    assert inner["lo"].to_list() == [0, 10] and inner["count"].to_list() == [1, 2]
    assert h.filter(pl.col("bucket") == "under")["count"].item() == 1
    assert h.filter(pl.col("bucket") == "over")["count"].item() == 1
    assert h["sum"][0] == 230 and h["min"][0] == -1 and h["max"][0] == 200


def test_the_frame_has_the_documented_columns(tmp_path: Path) -> None:
    p = tmp_path / "c.lstrace"
    with lt.open(p):
        lt.event("cols", "e")(1)
    df = lt.read(p)
    assert df.columns == ["t_ns", "host", "thread", "tid", "stream", "dump", "group", "name", "kind", "tag", "dur_ns", "value", "payload"]
    assert df.schema["t_ns"] == pl.Int64


def test_records_from_threads_carry_their_thread_names(tmp_path: Path) -> None:
    p = tmp_path / "t.lstrace"
    ev = lt.event("thr", "e")

    def work(k: int) -> None:
        for i in range(1000):
            ev(k * 10_000 + i)

    with lt.open(p):
        ts = [threading.Thread(target=work, args=(k,), name=f"w{k}") for k in range(3)]
        for t in ts:
            t.start()
        for t in ts:
            t.join()
    df = lt.read(p)
    assert len(df) == 3000
    assert df["t_ns"].is_sorted()
    assert df["tid"].n_unique() == 3
    per = df.group_by("tid").agg(pl.col("tag").sort_by("t_ns"))
    for tags in per["tag"].to_list():
        assert tags == sorted(tags)


def test_groups_from_the_open_call_select_what_is_written(tmp_path: Path) -> None:
    p = tmp_path / "g.lstrace"
    a = lt.event("keep", "a")
    b = lt.event("drop", "b")
    with lt.open(p, groups=["keep"]):
        assert a.enabled and not b.enabled
        a(1)
        b(2)
        lt.enable_group("drop")
        b(3)
        lt.enable_group("keep", False)
        a(4)
    df = lt.read(p)
    assert df["tag"].to_list() == [1, 3]
    assert [(c["group"], c["enabled"]) for c in lt.info(p).changes] == [("drop", True), ("keep", False)]


def test_groups_come_from_the_environment(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("LOOPSCOPE_GROUPS", "envkeep")
    p = tmp_path / "e.lstrace"
    a = lt.event("envkeep", "a")
    b = lt.event("envdrop", "b")
    with lt.open(p):
        a(1)
        b(2)
    assert lt.read(p)["tag"].to_list() == [1]


def test_a_config_file_sets_the_streams(tmp_path: Path) -> None:
    cfg = tmp_path / "s.toml"
    cfg.write_text('[[stream]]\nname = "main"\ngroups = ["cf*"]\n\n[[stream]]\nname = "fr"\nkind = "ring"\ngroups = ["ring*"]\n')
    p = tmp_path / "cf.lstrace"
    a = lt.event("cfa", "x")
    r = lt.event("ringx", "y")
    with lt.open(p, config=cfg):
        a(1)
        for i in range(10):
            r(i)
        lt.trigger("fr", 5)
    df = lt.read(p)
    assert df.filter(pl.col("stream") == "main")["tag"].to_list() == [1]
    assert df.filter(pl.col("stream") == "fr")["tag"].to_list() == list(range(10))
    assert set(df.filter(pl.col("stream") == "fr")["dump"].to_list()) == {1}


def test_a_flight_recorder_keeps_the_records_that_led_to_the_trigger(tmp_path: Path) -> None:
    p = tmp_path / "fr.lstrace"
    e = lt.event("fr", "x")
    with lt.open(p, groups=["loopscope"], ring_groups=["fr"]):
        for i in range(200_000):  # far more than the 1 MiB ring holds
            e(i)
        lt.trigger("ring", 3)
        lt.flush()
        e(999_999)  # after the dump, never written
    df = lt.read(p)
    tags = df.filter(pl.col("name") == "x")["tag"].to_list()
    assert tags[-1] == 199_999
    assert tags == list(range(tags[0], 200_000))
    assert 20_000 < len(tags) < 65_537
    trig = df.filter((pl.col("group") == "loopscope") & (pl.col("name") == "trigger"))
    assert trig["tag"].to_list() == [3]
    assert lt.info(p).dumps[0]["overwritten_bytes"] > 0


def test_without_a_trigger_a_flight_recorder_writes_nothing(tmp_path: Path) -> None:
    p = tmp_path / "nt.lstrace"
    e = lt.event("fr2", "x")
    with lt.open(p, groups=[], ring_groups=["fr2"]):
        for i in range(1000):
            e(i)
    assert lt.info(p).records == 0


def test_misuse_is_refused_with_the_entity_named(tmp_path: Path) -> None:
    lt.event("mis", "e")
    with pytest.raises(InputError, match="mis/e is registered as event, not counter"):
        lt.counter("mis", "e")
    with pytest.raises(InputError, match="not valid"):
        lt.event("a/b", "c")
    with pytest.raises(InputError, match="buckets"):
        lt.histogram("mis", "h", max=1 << 62, sub_bits=12)
    e = lt.event("mis", "e")
    with pytest.raises(InputError, match="is a event, not a interval|is a event"):
        e.interval(0, 1)
    with pytest.raises(InputError, match="value or a payload, not both"):
        e.event(1, value=2, payload=b"x")


def test_a_second_open_is_refused_while_one_is_open(tmp_path: Path) -> None:
    with lt.open(tmp_path / "a.lstrace"):
        with pytest.raises(InputError, match="already open"):
            lt.open(tmp_path / "b.lstrace")


def test_an_unwritable_path_fails_at_open_naming_the_file(tmp_path: Path) -> None:
    with pytest.raises(InputError, match=r"nodir/x\.lstrace: cannot create the trace file"):
        lt.open(tmp_path / "nodir" / "x.lstrace")


def test_a_file_that_cannot_take_the_header_fails_at_open() -> None:
    with pytest.raises(InputError, match="/dev/full: offset 0: cannot write the trace file: No space left"):
        lt.open("/dev/full")


def test_timed_blocks_become_intervals(tmp_path: Path) -> None:
    p = tmp_path / "tm.lstrace"
    iv = lt.interval("tm", "blk")
    with lt.open(p):
        with lt.timed(iv, tag=9):
            sum(range(10_000))
    df = lt.read(p)
    assert df["tag"].to_list() == [9] and df["dur_ns"][0] > 0


def test_oversized_payloads_are_counted_as_lost(tmp_path: Path) -> None:
    from loopscope import _native

    p = tmp_path / "big.lstrace"
    e = lt.event("big", "e")
    with lt.open(p) as s:
        e.event(1, payload=b"x" * _native.MAX_PAYLOAD)
        e.event(2, payload=b"x" * (_native.MAX_PAYLOAD + 1))
    assert s.summary is not None and s.summary.lost_records == 1
    inf = lt.info(p)
    assert inf.records == 1 and inf.lost_records == 1
