"""The segment files the native writer (crates/ktrace ``segment``) makes are
the ones the store reads: the contract between them that no import shows
until a capture outgrows a row group."""

from __future__ import annotations

from loopscope import _native
from loopscope.kernel import store as S


def test_the_native_writer_s_row_groups_are_the_size_the_store_reads_them_by() -> None:
    # the store finds a group by its index (slice(i * GROUP, GROUP)): another size would read the wrong events
    assert _native.SEGMENT_GROUP == S.GROUP
