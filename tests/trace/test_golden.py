"""Golden trace: the checked-in file written through the C header reads back
in Python as tests/fixtures/golden-v1.json says (the Rust reader checks the
same pair), and today's C writer still produces the same records."""

from __future__ import annotations

import json
import subprocess
from pathlib import Path
from typing import Any, Callable

import polars as pl
import pytest

import loopscope.trace as lt
from tests.conftest import ROOT

FIX = ROOT / "tests" / "fixtures"


def records(path: Path) -> list[dict[str, Any]]:
    out = []
    for r in lt.read(path, sort=False).iter_rows(named=True):
        d: dict[str, Any] = {"group": r["group"], "name": r["name"], "kind": r["kind"], "tag": r["tag"]}
        if r["value"] is not None:
            d["value"] = r["value"]
        if r["payload"] is not None:
            d["payload_hex"] = r["payload"].hex()
        if r["kind"] == "interval":
            d["t_ns"] = r["t_ns"]
            d["dur_ns"] = r["dur_ns"]
        out.append(d)
    return out


def buckets(path: Path) -> list[dict[str, Any]]:
    h = lt.histograms(path)
    return [{"bucket": r["bucket"], "lo": r["lo"], "hi": r["hi"], "count": r["count"]} for r in h.iter_rows(named=True)]


def test_the_golden_trace_reads_back_as_recorded() -> None:
    want = json.loads((FIX / "golden-v1.json").read_text())
    path = FIX / "golden-v1.lstrace"
    inf = lt.info(path)
    assert list(inf.version) == want["format_version"]
    assert [
        {k: e[k] for k in ("id", "group", "name", "kind", "desc")} | ({"histogram": e["histogram"]} if e.get("histogram") else {}) for e in inf.entities
    ] == want["entities"]
    assert records(path) == want["records"]
    assert buckets(path) == want["histogram_buckets"]
    h = lt.histograms(path)
    assert {"sum": h["sum"][0], "min": h["min"][0], "max": h["max"][0]} == want["histogram_summary"]
    assert inf.lost_records == want["lost_records"] and inf.stats["closed"] == want["closed"]


@pytest.mark.needs_tool("cc")
def test_todays_c_writer_produces_the_golden_records(tmp_path: Path, build_c: Callable[..., Path]) -> None:
    exe = build_c("golden_writer.c")
    fresh = tmp_path / "g.lstrace"
    subprocess.run([str(exe), str(fresh)], check=True, timeout=60)
    want = json.loads((FIX / "golden-v1.json").read_text())
    assert records(fresh) == want["records"]
    assert buckets(fresh) == want["histogram_buckets"]
    assert lt.read(fresh).filter(pl.col("kind") == "event")["tid"].n_unique() == 1
