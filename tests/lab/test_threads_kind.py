"""The threads kind in an experiment: cyclictest, uninstrumented, measured
per phase from the kernel capture, compared and explained like any kind."""

from __future__ import annotations

import json
import shutil
import subprocess
import time
from pathlib import Path

import polars as pl
import pytest

from loopscope.kernel import capture as C
from tests.conftest import Cli
from tests.helpers import assert_clean_error

SPEC = """
name: threads
probes:
  - kind: threads
    name: cyclic
    command: cyclictest -m -p 80 -i 1000 -t 1 -q
    threads: cyclictest
    deadline_us: {deadline}
loads:
  - {{name: hog, kind: cpu, level: 2}}
phases:
  - {{name: baseline}}
  - {{name: cpu, loads: [hog]}}
duration: 2s
"""


def _needs() -> None:
    if C.tracefs() is None:
        pytest.skip("needs tracefs for the run's kernel capture")
    if shutil.which("cyclictest") is None:
        pytest.skip("needs cyclictest (rt-tests)")


def test_a_command_s_threads_are_measured_per_phase_compared_and_explained(cli: Cli, tmp_path: Path, lab: None) -> None:
    _needs()
    (tmp_path / "t.yaml").write_text(SPEC.format(deadline=40))
    r = cli("run", "t.yaml", timeout=300)
    assert r.returncode == 0, r.stderr
    run = tmp_path / r.stdout.strip().splitlines()[-1]
    rows = pl.read_parquet(run / "tables" / "threads.parquet")
    # cyclictest's measuring thread and its main thread, told apart by name
    assert set(rows["comm"].unique()) >= {"cyclictest", "cyclictest (main)"}
    meas = rows.filter(pl.col("comm") == "cyclictest")
    for phase in ("baseline", "cpu"):
        g = meas.filter(pl.col("phase") == phase)
        assert len(g) > 1500, (phase, len(g))  # 2 s at 1 kHz, less the start
        assert g["timer_lateness_ns"].null_count() < len(g) // 100 and g["timer_lateness_ns"].median() < 200_000  # type: ignore[operator]
    comp = pl.read_parquet(run / "tables" / "comparisons.parquet").filter(pl.col("probe") == "cyclic")
    assert {"cyclictest wakeup", "cyclictest timer", "cyclictest runtime"} <= set(comp["measure"].unique())
    assert len(comp.filter(pl.col("metric") == "missed")) > 0  # deadline_us gives missed deadlines
    ex = json.loads((run / "explain.json").read_text())
    groups = [g for g in ex["groups"] if g["probe"] == "cyclic"]
    assert {g["phase"] for g in groups} == {"baseline", "cpu"} and all(g["outliers"] > 0 for g in groups)
    assert "cyclic" in (run / "report.html").read_text()
    # the command is gone with its step
    assert subprocess.run(["pgrep", "-x", "cyclictest"], capture_output=True).returncode == 1


def test_threads_already_running_are_attached_by_name(cli: Cli, tmp_path: Path, lab: None) -> None:
    _needs()
    target = subprocess.Popen(["cyclictest", "-m", "-p", "70", "-i", "2000", "-t", "1", "-q"], stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
    try:
        time.sleep(0.3)
        (tmp_path / "a.yaml").write_text(f"name: attach\nprobes:\n  - kind: threads\n    name: running\n    attach: {{pid: {target.pid}}}\nduration: 1s\n")
        r = cli("run", "a.yaml", timeout=300)
        assert r.returncode == 0, r.stderr
        run = tmp_path / r.stdout.strip().splitlines()[-1]
        rows = pl.read_parquet(run / "tables" / "threads.parquet")
        g = rows.filter(pl.col("comm") == "cyclictest")
        assert len(g) > 300 and abs(int(g["period_ns"].median()) - 2_000_000) < 50_000  # type: ignore[arg-type]
        assert target.poll() is None  # attached, not stopped
    finally:
        target.terminate()
        target.wait()


def test_an_attach_target_that_matches_nothing_is_refused_before_the_run(cli: Cli, tmp_path: Path, beside: None) -> None:
    (tmp_path / "n.yaml").write_text("name: none\nprobes:\n  - kind: threads\n    attach: {comm: '^no-such-thread-here$'}\nduration: 1s\n")
    assert_clean_error(cli("check", "n.yaml"), 2, "no-such-thread-here")
    assert_clean_error(cli("run", "n.yaml"), 2, "no-such-thread-here")


def test_a_threads_probe_with_both_a_command_and_a_target_is_refused(cli: Cli, tmp_path: Path) -> None:
    (tmp_path / "b.yaml").write_text("name: both\nprobes:\n  - kind: threads\n    command: sleep 5\n    attach: {pid: 1}\nduration: 1s\n")
    assert_clean_error(cli("check", "b.yaml"), 2, "either command or attach")
