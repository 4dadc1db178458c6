"""The app probe: programs started across hosts in order, stopped in reverse,
each interval they log in the run's tables; the video loop as the example."""

from __future__ import annotations

import json
from pathlib import Path

import polars as pl
import pytest

from tests.conftest import ROOT, Cli


@pytest.mark.needs_root
def test_the_video_loop_runs_across_three_hosts_and_its_frames_reach_the_report(cli: Cli, tmp_path: Path, lab: None) -> None:
    spec = (ROOT / "examples" / "video-loop.yaml").read_text()
    # one short phase; the programs still start in examples/
    spec = spec.split("phases:")[0] + "phases:\n  - {name: short}\nduration: 4s\n"
    spec = spec.replace('command: "python3 video/', f'cwd: {ROOT / "examples"}, command: "python3 video/')
    spec = spec.replace("{between: [cam, trk], delay: 0,", "{between: [cam, trk], delay: 20ms, jitter: 1ms,")
    assert "delay: 20ms" in spec
    (tmp_path / "v.yaml").write_text(spec)
    r = cli("run", "v.yaml", "--run-dir", "run", timeout=300)
    assert r.returncode == 0, r.stderr
    run = tmp_path / "run"
    prog = pl.read_parquet(run / "tables" / "program.parquet")
    got = set(prog["interval"].unique())
    assert {"camera: video/render", "tracker: video/hop", "tracker: video/track", "display: video/e2e"} <= got
    hop = prog.filter(pl.col("interval") == "tracker: video/hop")["dur_ns"]
    # the emulated link is 20 ms ± 1 ms: every frame's hop includes it
    assert len(hop) > 50 and hop.median() > 19e6
    e2e = prog.filter(pl.col("interval") == "display: video/e2e")
    assert len(e2e) > 50
    steps = json.loads((run / "run.json").read_text())["steps"]
    assert [p["name"] for p in steps[0]["processes"]] == ["display", "tracker", "camera"]
    html = (run / "report.html").read_text()
    assert "Sample frames" in html and "data:image/png;base64," in html
    # every thread that used channels has its time split, the parts adding up
    assert 'id="breakdown"' in html
    b = pl.read_parquet(run / "tables" / "breakdown.parquet")
    assert set(b["process"]) == {"camera", "tracker", "display"}
    per = b.group_by("process", "tid").agg(pl.col("share").sum())
    assert ((per["share"] - 1).abs() < 1e-9).all()
    msg = b.filter((pl.col("process") == "camera") & (pl.col("category") == "messaging"))["share"].sum()
    assert msg > 0  # the camera sends 165 datagrams a frame
    # frames followed from the camera's put to the tracker's get: the network
    # part is the emulated link's 20 ms
    it = pl.read_parquet(run / "tables" / "items.parquet").filter(pl.col("channel") == "frames")
    assert len(it) > 50 and set(it["producer"]) == {"camera"} and set(it["consumer"]) == {"tracker"}
    assert 19e6 < it["net_ns"].median() < 40e6 and (it["deliver_ns"] >= 0).all()
    assert ((it["total_ns"] - it["put_ns"] - it["net_ns"] - it["deliver_ns"]) == 0).all()


FAILING = """name: failing-app
probes:
  - kind: app
    name: pair
    processes:
      - {name: server, command: "sleep 60"}
      - {name: client, command: "sh -c 'echo giving up >&2; exit 4'"}
duration: 3s
kernel: {capture: 'off'}
"""


def test_an_app_process_that_fails_stops_the_run_and_is_named(cli: Cli, tmp_path: Path, lab: None, beside: None) -> None:
    (tmp_path / "f.yaml").write_text(FAILING)
    r = cli("run", "f.yaml", "--run-dir", "run", "--no-report", timeout=120)
    assert r.returncode == 1
    assert "pair.client" in r.stderr and "exit code 4" in r.stderr and "giving up" in r.stderr


def test_an_app_command_naming_an_unknown_host_is_bad_input(cli: Cli, tmp_path: Path) -> None:
    (tmp_path / "b.yaml").write_text("name: b\nprobes:\n  - kind: app\n    processes:\n      - {name: a, command: 'ping {host:nowhere}'}\nduration: 1s\n")
    r = cli("check", "b.yaml")
    assert r.returncode == 2 and "nowhere" in r.stderr and "Traceback" not in r.stderr
