"""Clock sync and the global timeline on real namespaces: hosts whose clocks
were shifted (time namespace) and skewed (the test-only virtual clock) are
placed on the reference's clock within their bounds; the Perfetto export is
well formed; a host whose probes never come back is said, not misplaced."""

from __future__ import annotations

import json
import subprocess
from pathlib import Path
from typing import Iterator

import numpy as np
import polars as pl
import pytest

from loopscope.clock import validate
from loopscope.lab import netns
from tests.conftest import BIN, Cli
from tests.lab.test_multihost import leftovers
from tests.lab.test_run import wait_for
from loopscope.kernel.capture import tracefs

pytestmark = [pytest.mark.needs_root, pytest.mark.needs_tool("ip", "ethtool")]

SKEWED = """name: skewed
hosts:
  - name: a
  - name: b
    clock_offset: 1.5s
    virtual_clock: {{offset: 2ms, drift_ppm: 30}}
{links}probes:
  - {{kind: timer, host: b, interval_us: 1000}}
  - {{kind: timer, host: a, interval_us: 1000}}
duration: {duration}
"""


@pytest.fixture(autouse=True)
def no_namespace_left(lab: None) -> Iterator[None]:
    before = set(netns.existing())
    yield
    assert wait_for(lambda: not set(netns.existing()) - before, 15), set(netns.existing()) - before


@pytest.fixture(scope="module")
def skewed(tmp_path_factory: pytest.TempPathFactory, lab: None) -> Path:
    d = tmp_path_factory.mktemp("skewed")
    (d / "s.yaml").write_text(SKEWED.format(links="", duration="4s"))
    r = subprocess.run([str(BIN), "run", "s.yaml", "--run-dir", "run", "--no-report"], cwd=d, capture_output=True, text=True, timeout=240)
    assert r.returncode == 0, r.stderr
    t = subprocess.run([str(BIN), "timeline", "run"], cwd=d, capture_output=True, text=True, timeout=120)
    assert t.returncode == 0, t.stderr
    return d / "run"


def test_a_skewed_hosts_records_land_within_their_bound_of_the_truth(skewed: Path) -> None:
    tl = pl.read_parquet(skewed / "timeline.parquet")
    b = tl.filter((pl.col("host") == "b") & (pl.col("group") == "timer") & (pl.col("name") == "wakeup"))
    assert len(b) > 2000
    assert b["t_global_ns"].null_count() == 0
    truth = validate.Truth.of_run(skewed)
    true = truth.global_of("b", b["t_ns"].to_numpy())
    err = np.abs(b["t_global_ns"].to_numpy() - true)
    bound = b["bound_ns"].to_numpy()
    assert np.all(err <= bound)
    # Unmapped, b's records would be 1.502 s off; mapped, a few µs.
    assert np.median(err) < 20_000
    assert np.median(bound) < 200_000
    # a is the reference: its records keep their time, with no error.
    a = tl.filter(pl.col("host") == "a")
    assert (a["t_global_ns"] == a["t_ns"]).all() and (a["bound_ns"] == 0).all()


def test_every_record_of_every_host_is_on_the_timeline(skewed: Path) -> None:
    from loopscope.trace import reader

    run = json.loads((skewed / "run.json").read_text())
    paths = [s["trace"] for s in run["steps"]] + [run["clocksync"]["responder"]["trace"]] + [i["trace"] for i in run["clocksync"]["initiators"].values()]
    total = sum(reader.info(skewed / p).records for p in paths)
    tl = pl.read_parquet(skewed / "timeline.parquet")
    assert len(tl) == total
    # No link asks for anything: the router's kernel forwards, no emulator runs.
    assert "emulator" not in run and run["paths"]["a->b"]["mechanism"] == "kernel"
    assert set(tl["host"].unique()) == {"a", "b"}
    summary = json.loads((skewed / "timeline.json").read_text())
    assert summary["hosts"]["b"]["not_placed"] == 0
    assert summary["checks"]["clocksync"]["b"]["negative_beyond_bound"] == 0


def test_the_estimate_finds_the_injected_drift(skewed: Path) -> None:
    clock = json.loads((skewed / "clock.json").read_text())
    ws = [w for w in clock["hosts"]["b"]["windows"] if w["offset_ns"] is not None]
    assert ws
    for w in ws:
        assert w["drift_lo_ppm"] <= 30.0 <= w["drift_hi_ppm"]
        # The time namespace shifts MONOTONIC only; the virtual clock both.
        assert abs(w["monotonic_offset_ns"] - 1.502e9) < 1e6
        assert abs(w["offset_ns"] - 2e6) < 1e6


def test_the_perfetto_export_is_a_well_formed_trace(skewed: Path, cli: Cli) -> None:
    from perfetto.protos.perfetto.trace import perfetto_trace_pb2 as pb

    kernel = tracefs() is not None
    if kernel:
        r = cli("explain", str(skewed))
        assert r.returncode == 0, r.stderr
    r = cli("export", "perfetto", str(skewed))
    assert r.returncode == 0, r.stderr
    t = pb.Trace()
    t.ParseFromString((skewed / "trace.perfetto-trace").read_bytes())
    declared: dict[int, str] = {}
    parent: dict[int, int] = {}
    open_slices: dict[int, list[int]] = {}
    kinds = {"begin": 0, "end": 0, "instant": 0, "counter": 0, "kernel_begin": 0}
    TE = pb.TrackEvent
    for p in t.packet:
        assert p.trusted_packet_sequence_id
        if p.HasField("track_descriptor"):
            d = p.track_descriptor
            assert d.uuid not in declared, "a track is declared twice"
            assert not d.HasField("parent_uuid") or d.parent_uuid in declared
            declared[d.uuid] = d.name
            if d.HasField("parent_uuid"):
                parent[d.uuid] = d.parent_uuid
        elif p.HasField("track_event"):
            e = p.track_event
            assert e.track_uuid in declared, "an event on an undeclared track"
            assert p.timestamp > 0
            st = open_slices.setdefault(e.track_uuid, [])
            if e.type == TE.TYPE_SLICE_BEGIN:
                st.append(p.timestamp)
                on_kernel = declared.get(parent.get(e.track_uuid, 0), "").startswith("kernel of")
                kinds["kernel_begin" if on_kernel else "begin"] += 1
                # a thread's interval carries its clock bound; a kernel slice has none of its own
                assert [a.name for a in e.debug_annotations] == ([] if on_kernel else ["bound_ns"])
            elif e.type == TE.TYPE_SLICE_END:
                assert st and st[-1] <= p.timestamp, "a slice ends before it begins or without one"
                st.pop()
                kinds["end"] += 1
            elif e.type == TE.TYPE_INSTANT:
                kinds["instant"] += 1
            elif e.type == TE.TYPE_COUNTER:
                kinds["counter"] += 1
    assert all(not s for s in open_slices.values()), "slices left open"
    tl = pl.read_parquet(skewed / "timeline.parquet")
    assert kinds["begin"] + kinds["kernel_begin"] == kinds["end"]
    assert kinds["begin"] == int(((tl["kind"] == "interval") & tl["t_global_ns"].is_not_null()).sum())
    if kernel:
        # the kernel's CPUs around the outliers, on the same clock
        assert kinds["kernel_begin"] > 0
        assert any(n.startswith("CPU ") for n in declared.values())
    assert kinds["instant"] == int(((tl["kind"] == "event") & tl["t_global_ns"].is_not_null()).sum())
    assert {"a", "b"} <= set(declared.values())
    assert any(n.startswith("clock offset") for n in declared.values())


def test_the_report_shows_each_hosts_clock(skewed: Path, cli: Cli) -> None:
    r = cli("report", str(skewed))
    assert r.returncode == 0, r.stderr
    html = (skewed / "report.html").read_text()
    sec = html[html.index('id="clocks"') :]
    sec = sec[: sec.index("<h2", 10)]
    assert "reference" in sec and "+1.50" in sec and "<svg" in sec
    assert "ppm" in sec


def test_a_host_whose_probes_never_come_back_is_said_and_not_placed(tmp_path: Path, cli: Cli, lab: None) -> None:
    cut = "links:\n  - {between: [a, b], loss: 100%}\nclocksync: {network: experiment}\n"
    (tmp_path / "s.yaml").write_text(SKEWED.format(links=cut, duration="2s"))
    r = subprocess.run([str(BIN), "run", "s.yaml", "--run-dir", "run", "--no-report"], cwd=tmp_path, capture_output=True, text=True, timeout=240)
    assert r.returncode == 0, r.stderr
    t = cli("timeline", str(tmp_path / "run"))
    assert t.returncode == 0, t.stderr
    assert "never reached the reference" in t.stdout
    summary = json.loads((tmp_path / "run" / "timeline.json").read_text())
    assert summary["hosts"]["b"]["placed"] == 0 and summary["hosts"]["b"]["not_placed"] > 1000
    tl = pl.read_parquet(tmp_path / "run" / "timeline.parquet")
    assert tl.filter(pl.col("host") == "b")["t_global_ns"].null_count() == summary["hosts"]["b"]["records"]
    assert leftovers("run") == []


def test_the_timeline_of_a_directory_that_is_no_run_is_a_clear_error(tmp_path: Path, cli: Cli) -> None:
    r = cli("timeline", str(tmp_path))
    assert r.returncode == 2
    assert "not a run directory" in r.stderr and "Traceback" not in r.stderr
    (tmp_path / "run.json").write_text('{"name": "cut sh')
    r = cli("timeline", str(tmp_path))
    assert r.returncode == 2 and "run.json: cannot be read" in r.stderr and "damaged" in r.stderr, r.stderr
    assert "Traceback" not in r.stderr


def test_a_host_cut_off_on_the_experiment_network_stays_on_the_timeline_through_the_sync_network(tmp_path: Path, cli: Cli, lab: None) -> None:
    (tmp_path / "s.yaml").write_text(SKEWED.format(links="links:\n  - {between: [a, b], loss: 100%}\n", duration="2s"))
    r = subprocess.run([str(BIN), "run", "s.yaml", "--run-dir", "run", "--no-report"], cwd=tmp_path, capture_output=True, text=True, timeout=240)
    assert r.returncode == 0, r.stderr
    run = json.loads((tmp_path / "run" / "run.json").read_text())
    b = run["clocksync"]["initiators"]["b"]
    assert b["network"] == "sync" and b["result"]["lost"] == 0 and b["result"]["answered"] > 0
    t = cli("timeline", str(tmp_path / "run"))
    assert t.returncode == 0, t.stderr
    summary = json.loads((tmp_path / "run" / "timeline.json").read_text())
    assert summary["hosts"]["b"]["not_placed"] == 0 and summary["hosts"]["b"]["placed"] > 1000
    assert leftovers("run") == []
