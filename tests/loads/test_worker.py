"""Load workers as processes: they report their work, stop on SIGTERM and die with their parent."""

from __future__ import annotations

import json
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest

from tests.helpers import wait_gone


def worker(*args: str) -> list[str]:
    return [sys.executable, "-m", "loopscope.loads.worker", *args]


@pytest.mark.parametrize("kind", ["cpu", "memory", "io", "net", "mix"])
def test_each_kind_does_work_for_a_while_and_reports_it(kind: str, tmp_path: Path) -> None:
    extra = ["--count", "200000"] if kind == "memory" else []
    r = subprocess.run(worker(kind, "--seconds", "0.5", "--dir", str(tmp_path), *extra), capture_output=True, text=True, timeout=60)
    assert r.returncode == 0, r.stderr
    rep = json.loads(r.stdout)
    assert rep["kind"] == kind and rep["ops"] > 0 and rep["error"] is None
    assert list(tmp_path.iterdir()) == []  # its files are gone


def test_a_tcp_net_load_streams_at_its_rate_to_a_sink_of_its_own() -> None:
    r = subprocess.run(
        worker("net", "--protocol", "tcp", "--rate-bps", "8e6", "--size", "10000", "--seconds", "0.5"), capture_output=True, text=True, timeout=60
    )
    assert r.returncode == 0, r.stderr
    rep = json.loads(r.stdout)
    assert rep["unit"] == "TCP writes" and 40 <= rep["ops"] <= 60


def test_sigterm_stops_a_worker_with_its_report() -> None:
    with subprocess.Popen(worker("cpu"), stdout=subprocess.PIPE, text=True) as p:
        time.sleep(0.5)
        p.send_signal(signal.SIGTERM)
        out, _ = p.communicate(timeout=10)
    assert p.returncode == 0
    assert json.loads(out)["ops"] > 0


def test_a_duty_cycle_uses_that_share_of_a_cpu() -> None:
    r = subprocess.run(worker("cpu", "--duty", "0.25", "--seconds", "1.5"), capture_output=True, text=True, timeout=60)
    rep = json.loads(r.stdout)
    assert 0.15 < rep["busy_ns"] / rep["elapsed_ns"] < 0.35


def test_a_worker_dies_with_its_parent() -> None:
    code = (
        "import subprocess, sys, os, time\n"
        "p = subprocess.Popen([sys.executable, '-m', 'loopscope.loads.worker', 'cpu'])\n"
        "print(p.pid, flush=True)\n"
        "time.sleep(0.5)\n"
        "os._exit(0)\n"
    )
    r = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=30)
    pid = int(r.stdout.split()[0])
    assert wait_gone(pid, 5), f"worker {pid} outlived its parent"


def test_an_unusable_directory_is_a_clear_error(tmp_path: Path) -> None:
    r = subprocess.run(worker("io", "--seconds", "0.2", "--dir", "/proc/1/none"), capture_output=True, text=True, timeout=30)
    assert r.returncode == 1
    assert "/proc/1/none" in r.stderr and "Traceback" not in r.stderr
