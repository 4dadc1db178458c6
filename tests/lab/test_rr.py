"""The ``rr`` probe kind in an experiment: request/response across two
network namespaces over UDP and TCP, its legs placed on the run's timeline
with their sync bound, its IPDV, its report section, and nothing left."""

from __future__ import annotations

import json
import re
import subprocess
from pathlib import Path
from typing import Iterator

import numpy as np
import polars as pl
import pytest

from loopscope.kinds.rr import ipdv
from loopscope.lab import netns
from tests.conftest import BIN
from tests.lab.test_multihost import leftovers
from tests.lab.test_run import wait_for

RR = """name: rr
hosts:
  - name: a
  - name: b
links:
  - between: [a, b]
    delay: 1ms
kernel: {{capture: {capture}}}
probes:
  - {{kind: rr, name: ping, host: a, dest: b, rate: 500pps}}
  - {{kind: rr, name: ping-tcp, host: a, dest: b, rate: 500pps, transport: tcp, port: 47301}}
duration: {duration}
"""


def test_ipdv_is_the_change_in_delay_between_consecutive_exchanges_and_skips_a_gap() -> None:
    seq = np.array([0, 1, 2, 4, 5])
    d = np.array([10.0, 13.0, 11.0, 50.0, 49.0])
    out = ipdv(seq, d)
    assert np.isnan(out[0]) and np.isnan(out[3])  # no predecessor; 3 was lost
    assert out[1] == 3 and out[2] == -2 and out[4] == -1


@pytest.fixture(scope="module")
def rr_run(tmp_path_factory: pytest.TempPathFactory, lab: None) -> tuple[Path, subprocess.CompletedProcess[str]]:
    d = tmp_path_factory.mktemp("rr")
    spec = d / "rr.yaml"
    spec.write_text(RR.format(duration="1s", capture="off"))
    r = subprocess.run([str(BIN), "run", str(spec), "--run-dir", "rr1"], cwd=d, capture_output=True, text=True, timeout=240)
    return d / "rr1", r


@pytest.fixture(autouse=True)
def no_namespace_left(lab: None) -> Iterator[None]:
    before = set(netns.existing())
    yield
    assert wait_for(lambda: not set(netns.existing()) - before, 15), set(netns.existing()) - before


@pytest.mark.needs_root
@pytest.mark.needs_tool("ip", "ethtool")
def test_an_rr_probe_across_two_namespaces_measures_rtt_both_legs_and_ipdv(rr_run: tuple[Path, subprocess.CompletedProcess[str]]) -> None:
    run_dir, r = rr_run
    assert r.returncode == 0, r.stderr
    assert r.stdout.strip().splitlines()[-1].endswith("rr1")  # the run directory is still the last line
    run = json.loads((run_dir / "run.json").read_text())
    steps = {s["probe"]: s for s in run["steps"]}
    assert steps["ping"]["server"]["host"] == "b" and steps["ping"]["server"]["answered"] > 0
    t = pl.read_parquet(run_dir / "tables" / "rr.parquet")
    for probe in ("ping", "ping-tcp"):
        g = t.filter(pl.col("probe") == probe)
        assert len(g) >= 400, probe  # 500 requests a second for 1 s
        # the 1 ms link delays each leg: the round trip is at least 2 ms
        assert g["rtt_ns"].min() >= 2_000_000
        # both legs on the run's timeline, each within its sync bound of at least 1 ms
        for leg in ("fwd", "ret"):
            v, b = g[f"{leg}_ns"], g[f"{leg}_bound_ns"]
            assert v.null_count() == 0 and b.null_count() == 0, (probe, leg)
            assert (v + b >= 1_000_000).all(), (probe, leg, v.min(), b.median())
            assert b.median() < 200_000  # the sync network's bound is far below the link delay
            assert g[f"ipdv_{leg}_ns"].drop_nulls().len() >= len(g) - 5
        # the two legs fit in the round trip (which adds both ends' stacks and the server's turnaround)
        slack = g["fwd_bound_ns"] + g["ret_bound_ns"]
        assert (g["fwd_ns"] + g["ret_ns"] + g["turnaround_ns"] <= g["rtt_ns"] + slack).all()
        assert (g["rtt_ns"] - g["fwd_ns"] - g["ret_ns"]).median() < 500_000
    comp = pl.read_parquet(run_dir / "tables" / "comparisons.parquet").filter(pl.col("kind") == "rr")
    assert {"rtt", "fwd", "ret", "ipdv_fwd", "ipdv_ret"} <= set(comp["measure"])
    html = (run_dir / "report.html").read_text()
    sec = html[html.index('id="probe-ping"') : html.index('id="probe-ping-tcp"')]
    heads = re.findall(r"<th[^>]*>([^<]*)</th>", sec)
    assert ["phase", "answered", "RTT", "a→b", "b→a", "IPDV"] == heads[:6]
    assert "±" in sec  # the legs carry their sync bound
    assert leftovers("rr1") == []


@pytest.mark.needs_root
def test_an_rr_probe_naming_an_unknown_host_is_refused_by_check(tmp_path: Path) -> None:
    spec = tmp_path / "bad.yaml"
    spec.write_text("name: bad\nhosts: [{name: a}]\nprobes:\n  - {kind: rr, host: a, dest: zz}\nduration: 1s\n")
    r = subprocess.run([str(BIN), "check", str(spec)], capture_output=True, text=True)
    assert r.returncode == 2
    assert "probes.0.dest: no host named 'zz'" in r.stderr


@pytest.mark.needs_root
@pytest.mark.needs_tool("ip", "ethtool")
def test_both_ends_of_an_rr_probe_are_explained_through_its_kinds_windows(tmp_path: Path, lab: None) -> None:
    from loopscope.analysis.explain import explain
    from loopscope.kinds import KINDS

    spec = tmp_path / "rr.yaml"
    spec.write_text(RR.format(duration="1s", capture="'on'"))
    r = subprocess.run([str(BIN), "run", str(spec), "--run-dir", "rr2", "--no-report"], cwd=tmp_path, capture_output=True, text=True, timeout=240)
    assert r.returncode == 0, r.stderr
    run = json.loads((tmp_path / "rr2" / "run.json").read_text())
    assert all(len(s["server"]["tids"]) == 1 for s in run["steps"] if s["kind"] == "rr")  # the echo server says which thread served
    ex = explain(tmp_path / "rr2", KINDS)
    assert ex is not None
    groups = {g["probe"] for g in ex["groups"]}
    for probe in ("ping", "ping-tcp"):
        assert {f"{probe} client (a)", f"{probe} server (b)"} <= groups, groups
    for g in ex["groups"]:
        # every outlier's wait is split: the causes add up to the outliers' time
        assert abs(sum(c["ns"] for c in g["causes"]) - g["outlier_ns"]) <= g["outlier_ns"] * 0.2 or len(g["causes"]) == 8
    assert leftovers("rr2") == []
