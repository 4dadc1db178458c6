"""The segment files the native writer (crates/ktrace ``segment``) makes are
the ones the store reads: the contract between them that no import shows
until a capture outgrows a row group."""

from __future__ import annotations

import shutil
from pathlib import Path

import duckdb

from loopscope import _native
from loopscope.analysis.threads import thread_names
from loopscope.kernel import store as S

FIXTURE = Path(__file__).parent.parent / "fixtures" / "runs" / "report" / "run" / "kernel"


def test_the_native_writer_s_row_groups_are_the_size_the_store_reads_them_by() -> None:
    # the store finds a group by its index (slice(i * GROUP, GROUP)): another size would read the wrong events
    assert _native.SEGMENT_GROUP == S.GROUP


def _damage_event_pages(p: Path) -> None:
    """Bytes flipped in the event column's pages (where DuckDB's reading of the footer says they lie), past their
    headers: the footer stays whole."""
    at, size = duckdb.sql(f"select data_page_offset, total_compressed_size from parquet_metadata('{p}') where path_in_schema = 'event'").fetchall()[0]
    b = bytearray(p.read_bytes())
    for i in range(at + 24, at + size - 8, 7):
        b[i] ^= 0x5A
    p.write_bytes(bytes(b))


def test_a_segment_damaged_past_its_footer_is_found_as_it_is_read_and_its_span_counts_as_lost(tmp_path: Path) -> None:
    # a flipped page decodes to an error (zstd: data corruption) only when read: the count of events finds it, says
    # it, and no later read (the native passes' row ranges) takes the file
    shutil.copytree(FIXTURE, tmp_path / "kernel")
    st = S.open_dir(tmp_path / "kernel")
    whole = st.by_event()
    seg = max((s for s in st.segments if s.get("file")), key=lambda s: int(s.get("events") or 0))
    p = tmp_path / "kernel" / str(seg["file"])
    _damage_event_pages(p)
    st = S.open_dir(tmp_path / "kernel")
    assert not st.problems and st.lost_events == 0  # the footer is whole: nothing seen at opening
    got = st.by_event()
    assert sum(got.values()) == sum(whole.values()) - int(seg["events"])
    assert any(str(seg["file"]) in q and "damaged" in q for q in st.problems)
    assert st.lost_events == int(seg["events"]) and p not in st.files()
    _, _, runs = st.reads(-(2**63), 2**63 - 1)
    assert runs and all(f != str(p) for run in runs for f, _, _ in run)


def test_a_reader_of_switches_that_did_not_count_the_events_first_still_meets_no_damaged_page(tmp_path: Path) -> None:
    # thread_names reads every switch through polars: the damaged file is found and left out, never raised
    shutil.copytree(FIXTURE, tmp_path / "kernel")
    whole = thread_names(S.open_dir(tmp_path / "kernel"))
    seg = max((s for s in S.open_dir(tmp_path / "kernel").segments if s.get("file")), key=lambda s: int(s.get("events") or 0))
    p = tmp_path / "kernel" / str(seg["file"])
    _damage_event_pages(p)
    st = S.open_dir(tmp_path / "kernel")
    got = thread_names(st)
    assert got and set(got) <= set(whole)
    assert any(str(seg["file"]) in q and "damaged" in q for q in st.problems)
