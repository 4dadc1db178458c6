"""The C header from a C program: compiled here, run, read back in Python."""

from __future__ import annotations

import subprocess
from pathlib import Path
from typing import Callable

import polars as pl
import pytest

import loopscope.trace as lt
from tests.conftest import ROOT

pytestmark = pytest.mark.needs_tool("cc")


@pytest.mark.parametrize("static", [True, False], ids=["static", "shared"])
def test_a_c_program_logs_every_kind_through_the_header(tmp_path: Path, build_c: Callable[..., Path], static: bool) -> None:
    exe = build_c("capi_test.c", static=static)
    trace = tmp_path / "c.lstrace"
    r = subprocess.run([str(exe), str(trace), str(ROOT / "tests" / "c" / "capi_test.toml")], capture_output=True, text=True, timeout=60)
    assert r.returncode == 0 and r.stdout.strip() == "ok", r.stderr
    df = lt.read(trace, sort=False)
    main = df.filter(pl.col("stream") == "main")
    ev = main.filter((pl.col("group") == "capi") & (pl.col("name") == "event"))
    assert ev["tag"].to_list() == [1, 2, 3]
    assert ev["value"].to_list() == [None, -42, None]
    assert ev["payload"].to_list() == [None, None, b"hello"]
    iv = main.filter(pl.col("name") == "interval")
    assert iv["tag"].to_list() == [4, 5] and iv["dur_ns"][1] == 250 and iv["t_ns"][1] == 1000
    ct = main.filter(pl.col("name") == "counter")
    assert ct["value"].to_list() == [10, 10] and ct["tag"].to_list() == [0, 1]
    hs = main.filter(pl.col("name") == "hist")
    assert hs["value"].to_list() == [5]
    assert main.filter(pl.col("name") == "macro")["tag"].to_list() == [6]
    # "quiet" was off until switched on at run time.
    assert main.filter(pl.col("group") == "quiet")["tag"].to_list() == [100]
    # The flight recorder was dumped once, with the 50 records before the trigger only.
    fr = df.filter(pl.col("stream") == "flight")
    assert fr["tag"].to_list() == list(range(50))
    assert main.filter(pl.col("name") == "trigger")["tag"].to_list() == [77]
    # Two threads, 1000 records each, each in order.
    wk = main.filter(pl.col("name") == "worker")
    assert wk["tid"].n_unique() == 2
    for tags in wk.group_by("tid").agg("tag")["tag"].to_list():
        assert tags == sorted(tags) and len(tags) == 1000
    inf = lt.info(trace)
    assert inf.lost_records == 0 and inf.stats["closed"]
    assert {e["name"] for e in inf.entities} >= {"event", "interval", "counter", "hist", "worker", "macro", "macro_counter"}


def test_the_header_compiles_as_cplusplus(tmp_path: Path) -> None:
    import shutil

    cxx = shutil.which("c++") or shutil.which("g++")
    if not cxx:
        pytest.skip("needs a C++ compiler")
    src = tmp_path / "t.cpp"
    src.write_text('#include <loopscope.h>\nint main() { const ls_entity *e = ls_register("a", "b", LS_KIND_EVENT, ""); ls_event(e, 1); return 0; }\n')
    r = subprocess.run([cxx, "-fsyntax-only", f"-I{ROOT / 'include'}", str(src)], capture_output=True, text=True)
    assert r.returncode == 0, r.stderr
