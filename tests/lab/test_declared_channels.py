"""Channels declared in the experiment file: the lab runs their hubs, the
programs find them by name, and every item is counted and followed."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import polars as pl
import pytest

from tests.conftest import ROOT, Cli


@pytest.mark.needs_root
def test_a_pipeline_over_declared_channels_is_counted_followed_and_split_by_item_size(cli: Cli, tmp_path: Path, lab: None) -> None:
    spec = (ROOT / "examples" / "channels.yaml").read_text()
    spec = spec.split("phases:")[0] + "phases:\n  - {name: short}\nduration: 4s\n"
    spec = spec.replace('command: "python3 sensors/', f'cwd: {ROOT / "examples"}, command: "python3 sensors/')
    (tmp_path / "c.yaml").write_text(spec)
    r = cli("run", "c.yaml", "--run-dir", "run", timeout=300)
    assert r.returncode == 0, r.stderr
    run = tmp_path / "run"
    st = json.loads((run / "run.json").read_text())["steps"][0]
    assert sorted(h["name"] for h in st["hubs"]) == ["hub-act", "hub-flt"]
    c = pl.read_parquet(run / "tables" / "channels.parquet")
    hub = {r["channel"]: r for r in c.filter(pl.col("role") == "channel").iter_rows(named=True)}
    sent = {r["channel"]: r["sent"] for r in c.filter(pl.col("role") == "producer").iter_rows(named=True)}
    # what each producer sent reached the hub that holds the channel, none lost in pieces
    assert sent["scans"] > 300 and hub["scans"]["put"] == sent["scans"]
    assert hub["estimates"]["put"] == sent["estimates"] > 300
    got = c.filter((pl.col("role") == "consumer") & (pl.col("channel") == "scans")).row(0, named=True)
    assert got["incomplete"] == 0 and got["missing"] == 0 and got["arrived"] >= sent["scans"] - hub["scans"]["dropped_no_consumer"]
    # every scan followed from the sensor through the flt hub to the filter; the 1 ms link is in its network leg
    it = pl.read_parquet(run / "tables" / "items.parquet").filter(pl.col("channel") == "scans")
    assert set(it["via"]) == {"hub-flt"} and set(it["producer"]) == {"sensor"} and set(it["consumer"]) == {"filter"}
    assert sorted(it["bytes"].unique()) == [1024, 16384, 131072]
    assert it["net_ns"].median() > 1e6 and it["net_raw_ns"].median() > 1e6
    assert (it["net_bound_ns"] >= 0).all()
    # per item size: the sensor's put of a 128 KiB scan costs more than a 1 KiB one, in messaging
    bs = pl.read_parquet(run / "tables" / "breakdown_size.parquet").filter((pl.col("process") == "sensor") & (pl.col("call") == "put"))
    m = dict(zip(bs["bytes"], bs["messaging_ns"]))
    assert m[131072] > 3 * m[1024]
    html = (run / "report.html").read_text()
    assert "Declared channels" in html and "Per item size" in html and "hub-flt" in html


def test_a_channel_on_an_unknown_host_is_bad_input(cli: Cli, tmp_path: Path) -> None:
    (tmp_path / "b.yaml").write_text(
        "name: b\nchannels:\n  - {name: x, host: nowhere}\nprobes:\n  - kind: program\n    command: 'true'\n    until: exit\nduration: 1s\n"
    )
    r = cli("check", "b.yaml")
    assert r.returncode == 2 and "channels.0.host" in r.stderr and "nowhere" in r.stderr and "Traceback" not in r.stderr


def test_a_program_asking_for_an_undeclared_channel_is_told_which_exist() -> None:
    code = "from loopscope import channels\ntry:\n    channels.producer('nosuch')\nexcept ValueError as e:\n    print(e)\n"
    env = {**os.environ, "LOOPSCOPE_CHANNELS": json.dumps({"scans": {"hub": "127.0.0.1:1", "transport": "udp"}})}
    out = subprocess.run([sys.executable, "-c", code], env=env, capture_output=True, text=True, timeout=60).stdout
    assert "no declared channel named 'nosuch'" in out and "scans" in out
