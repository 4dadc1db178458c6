"""fork() after ls_open: a pre-forking C server (tests/c/prefork.c), its
parent logging from two threads while it forks, its workers with and
without traces of their own. One writer per file, always."""

from __future__ import annotations

import os
import subprocess
from pathlib import Path
from typing import Callable

import polars as pl
import pytest

import loopscope.trace as lt

pytestmark = pytest.mark.needs_tool("cc")

ENV = {**os.environ, "LOOPSCOPE_GROUPS": "*"}


def _tags(path: Path) -> list[int]:
    return lt.read(path, sort=False).filter(pl.col("name") == "request")["tag"].to_list()


def test_workers_forked_after_open_never_write_into_the_parent_s_trace(tmp_path: Path, build_c: Callable[..., Path]) -> None:
    exe = build_c("prefork.c", static=False)
    r = subprocess.run([str(exe), "srv.lstrace", "8", "none"], cwd=tmp_path, capture_output=True, text=True, timeout=60, env=ENV)
    assert r.returncode == 0, r.stderr
    tags = _tags(tmp_path / "srv.lstrace")
    main = [t for t in tags if t < 100000]
    assert main == list(range(200))  # the parent's own, in order, none of the workers' 1000..
    assert len(tags) - len(main) > 0  # its logging thread went on through the forks
    info = lt.info(tmp_path / "srv.lstrace")
    assert info.stats["closed"] and info.lost_records == 0
    assert {int(p) for p in r.stdout.split()} and not list(tmp_path.glob("worker-*.lstrace"))


def test_a_worker_that_opens_a_trace_of_its_own_gets_one_named_by_its_pid(tmp_path: Path, build_c: Callable[..., Path]) -> None:
    exe = build_c("prefork.c", static=True)
    r = subprocess.run([str(exe), "srv.lstrace", "6", "own", "worker-%p.lstrace"], cwd=tmp_path, capture_output=True, text=True, timeout=60, env=ENV)
    assert r.returncode == 0, r.stderr
    pids = [int(p) for p in r.stdout.split()]
    assert len(pids) == 6
    assert [t for t in _tags(tmp_path / "srv.lstrace") if t < 100000] == list(range(200))
    for pid in pids:
        f = tmp_path / f"worker-{pid}.lstrace"
        assert _tags(f) == list(range(2000, 2200)), f  # its own records only: none from before its open, none of the parent's
        info = lt.info(f)
        assert info.pid == pid and info.stats["closed"]
