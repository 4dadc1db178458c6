"""A CPU limit (cgroup bandwidth) on a periodic program's group, spent by a
busy sibling: loopscope must see the whole wait the program sees, and name
the limit as its cause."""

from __future__ import annotations

import json
import os
import re
import shutil
import subprocess
from collections.abc import Iterator
from pathlib import Path

import pytest

from loopscope import cbuild
from loopscope.host import cpulimit
from loopscope.kernel import capture as C
from tests.conftest import Cli

HERE = Path(__file__).resolve().parent.parent


@pytest.fixture
def limited() -> Iterator[Path]:
    """A cgroup v1 ``cpu`` group allowed 20 ms of every 100 ms, removed after."""
    if os.geteuid() != 0:
        pytest.skip("needs root (a cgroup of its own, a kernel capture)")
    if not (cpulimit.V1_CPU / "cpu.cfs_quota_us").exists():
        pytest.skip("needs the cgroup v1 cpu controller (this machine's layout)")
    if C.tracefs() is None:
        pytest.skip("needs tracefs")
    g = cpulimit.V1_CPU / f"ls-test-throttle-{os.getpid()}"
    g.mkdir()
    try:
        (g / "cpu.cfs_period_us").write_text("100000")
        (g / "cpu.cfs_quota_us").write_text("20000")
        yield g
    finally:
        for t in (g / "tasks").read_text().split():
            try:
                os.kill(int(t), 9)
            except ProcessLookupError:
                pass
        for _ in range(50):
            try:
                g.rmdir()
                break
            except OSError:
                import time

                time.sleep(0.05)


def test_a_thread_held_by_its_groups_cpu_limit_is_as_late_as_it_says_and_the_limit_is_named(limited: Path, cli: Cli, tmp_path: Path, lab: None) -> None:
    if shutil.which("taskset") is None:
        pytest.skip("needs taskset")
    prog = cbuild.build([HERE / "c" / "periodic.c"], tmp_path / "periodic")
    own = tmp_path / "self.txt"
    busy = subprocess.Popen(["sh", "-c", f"echo $$ > {limited}/tasks; exec taskset -c 1 sh -c 'while :; do :; done'"])
    try:
        r = cli("probe", "threads", "--json", "--", "sh", "-c", f"echo $$ > {limited}/tasks; exec taskset -c 1 {prog} 1000 > {own}")
    finally:
        busy.kill()
        busy.wait()
    assert r.returncode == 0, r.stderr
    m = re.search(r"p99 (\d+)", own.read_text())
    assert m, own.read_text()
    theirs = int(m.group(1))
    t = next(x for x in json.loads(r.stdout)["threads"] if x["comm"] == "periodic")
    assert theirs > 20_000_000, theirs  # the limit held it for tens of ms
    ours = t["timer_lateness_ns"]["p99"]
    assert abs(ours - theirs) <= 0.1 * theirs, (ours, theirs)
    assert t["causes"][0]["cause"] == f"throttled: /{limited.name}" and t["causes"][0]["share"] >= 0.5, t["causes"]


def test_cleanup_gives_back_a_cpu_limited_group_a_killed_bench_left(cli: Cli, lab: None) -> None:
    if os.geteuid() != 0 or cpulimit.missing():
        pytest.skip(f"needs root and a cpu controller: {cpulimit.missing()}")
    g = cpulimit.make("ls-zoo-throttle", 20_000, 100_000)
    sleeper = subprocess.Popen(["sleep", "30"])
    try:
        (g / ("tasks" if (g / "tasks").exists() else "cgroup.procs")).write_text(str(sleeper.pid))
        r = cli("cleanup")
        assert r.returncode == 0, r.stderr
        assert "ls-zoo-throttle" in r.stdout and not g.exists()
        assert cpulimit.limit_of(sleeper.pid) is None  # its task is back at the root, unlimited
    finally:
        sleeper.kill()
        sleeper.wait()
        if g.exists():
            cpulimit.remove(g)
