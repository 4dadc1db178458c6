"""Scratch directories named for their maker (host/scratch.py): removed by
the maker on its way out, and by ``loopscope cleanup`` when the maker was
killed before it could."""

from __future__ import annotations

import os
import tempfile
from pathlib import Path

import pytest

from loopscope.host import scratch


@pytest.fixture
def tmp(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Path:
    monkeypatch.setattr(tempfile, "tempdir", str(tmp_path))
    return tmp_path


def _dead_pid() -> int:
    pid = 4_000_000
    while Path(f"/proc/{pid}").exists():
        pid += 1
    return pid


def test_a_scratch_directory_is_named_for_its_maker_and_gone_after_its_block(tmp: Path) -> None:
    with scratch.directory("bench-isolate") as d:
        assert Path(d).parent == tmp and Path(d).name.startswith(f"ls-bench-isolate-{os.getpid()}-")
        (Path(d) / "fsync.dat").write_bytes(b"x")
        assert scratch.leftovers() == []  # its maker (this test) is alive
    assert not Path(d).exists()


def test_the_scratch_directory_of_a_maker_that_is_gone_is_a_leftover_and_nothing_else_is(tmp: Path) -> None:
    dead = _dead_pid()
    left = tmp / f"ls-audit-{dead}-abcd_123"
    (left / "kernel").mkdir(parents=True)
    mine = tmp / f"ls-audit-{os.getpid()}-abcd_123"
    mine.mkdir()
    kept = [tmp / f"loopscope-zoo-{dead}", tmp / "ls-audit-2126sqo3", tmp / f"ls-bench-{dead}-short"]
    for k in kept:
        k.mkdir()
    (tmp / f"ls-file-{dead}-abcd_123").write_text("a file, not a directory")
    assert scratch.leftovers() == [left]
    scratch.remove(left)
    assert not left.exists() and mine.exists() and all(k.exists() for k in kept)
