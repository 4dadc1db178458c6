"""The isolate tuning in a real run: a stray task pinned to the probe's CPU
and one started during the phase are moved off it while the phase lasts, the
IRQs, packet steering and workqueues leave it, and every thread and file
reads the same afterwards: after the run, and after kill -9 of the controller."""

from __future__ import annotations

import json
import os
import signal
import subprocess
import threading
import time
from pathlib import Path

import pytest

from loopscope.host import cpuset, isolate
from loopscope.lab import state
from tests.conftest import BIN, Cli
from tests.lab.test_run import wait_for

pytestmark = [pytest.mark.needs_root]

SPEC = """name: {name}
probes:
  - {{kind: timer, interval_us: 1000, cpu: [1]}}
phases:
  - {{name: kept, tunings: [{{kind: isolate, cpus: [1], timer_migration: true}}]}}
duration: {duration}
kernel: {{capture: off}}
"""
SPIN = ["python3", "-c", "import time\nt = time.time() + 60\nwhile time.time() < t: pass"]


def machine() -> dict[str, str]:
    """What isolate changes, as the machine says it: every thread's allowed CPUs and every file it may write."""
    return isolate.snapshot()


def same_threads(a: dict[str, str], b: dict[str, str]) -> list[str]:
    """Where ``b`` differs from ``a`` for what both hold (threads that came or went between are not the tuning's)."""
    return [f"{k}: {a[k]} -> {b[k]}" for k in a.keys() & b.keys() if a[k] != b[k]]


def _two_cpus() -> None:
    if (os.cpu_count() or 1) < 2:
        pytest.skip("needs two CPUs: one to isolate, one for the rest")


def test_an_isolated_phase_moves_strays_off_the_cpu_catches_new_ones_and_gives_everything_back(tmp_path: Path, lab: None) -> None:
    _two_cpus()
    stray = subprocess.Popen(["taskset", "-c", "1", *SPIN])
    late: subprocess.Popen[bytes] | None = None
    try:
        time.sleep(0.2)
        before = machine()
        (tmp_path / "iso.yaml").write_text(SPEC.format(name="iso1", duration="3s"))
        p = subprocess.Popen(
            [str(BIN), "run", "iso.yaml", "--run-dir", "iso1", "--no-report"], cwd=tmp_path, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True
        )
        journal = state.state_dir() / "iso1.tunings"
        assert wait_for(lambda: journal.exists() and os.sched_getaffinity(stray.pid) == {0}, 60), p.stderr.read() if p.poll() is not None else ""
        # a task started during the phase, allowed everywhere, is caught and moved too
        late = subprocess.Popen(SPIN)
        assert wait_for(lambda: os.sched_getaffinity(late.pid) == {0}, 5), os.sched_getaffinity(late.pid)  # type: ignore[union-attr]
        late_before = os.sched_getaffinity(0) | {1}  # (pytest itself was moved while the phase ran: late inherited that)
        if cpuset.v1_root() is not None:
            # the moved tasks are in the isolation's cpuset, and one born during the phase is too: nobody can put them back on CPU 1
            rest = f"/loopscope-rest-{p.pid}"
            assert cpuset.of(stray.pid) == rest and cpuset.of(late.pid) == rest, (cpuset.of(stray.pid), cpuset.of(late.pid))
            with pytest.raises(OSError):
                os.sched_setaffinity(late.pid, {1})
            assert (cpuset.V1 / f"loopscope-rt-{p.pid}" / "cpuset.cpu_exclusive").read_text().strip() == "1"
        out, err = p.communicate(timeout=120)
        assert p.returncode == 0, err
        # the lab's own probe kept its CPU: it measured there
        rec = json.loads((tmp_path / "iso1" / "run.json").read_text())
        said = [c for t in rec["tunings"] for c in t["changes"] if c["tuning"] == "isolate"]
        assert said and "moved off CPU 1" in said[0]["new"], rec["tunings"]
        assert os.sched_getaffinity(stray.pid) == {1} and os.sched_getaffinity(late.pid) == late_before
        # (the snapshot holds each thread's cpuset and the cpusets there are: both as before)
        assert same_threads(before, machine()) == [] and not journal.exists()
        assert cpuset.of(stray.pid) == cpuset.of(late.pid) == cpuset.of(os.getpid())
    finally:
        for x in (stray, late):
            if x is not None:
                x.kill()
                x.wait()


def test_a_killed_controller_s_isolation_is_given_back_by_the_reaper(tmp_path: Path, cli: Cli, lab: None) -> None:
    _two_cpus()
    stray = subprocess.Popen(["taskset", "-c", "1", *SPIN])
    try:
        time.sleep(0.2)
        before = machine()
        (tmp_path / "iso.yaml").write_text(SPEC.format(name="iso2", duration="30s"))
        p = subprocess.Popen(
            [str(BIN), "run", "iso.yaml", "--run-dir", "iso2", "--no-report"], cwd=tmp_path, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True
        )
        journal = state.state_dir() / "iso2.tunings"
        assert wait_for(lambda: journal.exists() and os.sched_getaffinity(stray.pid) == {0}, 60), "the isolated phase never started"
        os.kill(p.pid, signal.SIGKILL)
        p.communicate(timeout=30)
        assert wait_for(lambda: os.sched_getaffinity(stray.pid) == {1} and not journal.exists(), 20), os.sched_getaffinity(stray.pid)
        assert same_threads(before, machine()) == []
        assert cli("cleanup").returncode == 0
    finally:
        stray.kill()
        stray.wait()


def test_cleanup_removes_an_isolations_cpuset_whose_maker_is_gone_and_puts_its_tasks_back_in_the_root(cli: Cli, lab: None) -> None:
    _two_cpus()
    if cpuset.v1_root() is None:
        pytest.skip("no writable cgroup v1 cpuset hierarchy here")
    dead = subprocess.Popen(["true"])
    dead.wait()
    left = cpuset.Shield(cpuset.V1, {1}, [0], str(dead.pid))
    left.make()
    sleeper = subprocess.Popen(["sleep", "60"])
    try:
        assert left.enter(sleeper.pid) and cpuset.of(sleeper.pid) == f"/{left.rest.name}"
        r = cli("cleanup")
        assert r.returncode == 0, r.stderr
        assert left.rest.name in r.stdout and left.rt.name in r.stdout, r.stdout
        assert not left.rest.exists() and not left.rt.exists() and cpuset.of(sleeper.pid) == "/"
    finally:
        sleeper.kill()
        sleeper.wait()
        cpuset.dissolve(left.paths)


def test_a_lab_process_born_while_the_mover_sweeps_keeps_the_isolated_cpu(lab: None) -> None:
    """The lab is the controller's tree as it is when each thread is listed:
    a probe started during the phase (the lab starts one at every phase) is
    never taken for a stray because it was born between the lab's walk and
    the listing of threads."""
    _two_cpus()
    moved: list[isolate.Moved] = []
    mover = isolate.Mover([1], moved.extend)
    stop = threading.Event()

    def sweeping() -> None:
        while not stop.is_set():
            mover.sweep()

    sweeper = threading.Thread(target=sweeping)
    sweeper.start()
    taken, children = [], []
    try:
        for _ in range(60):
            c = subprocess.Popen(["sleep", "0.5"])
            children.append(c)
            time.sleep(0.03)
            if 1 not in os.sched_getaffinity(c.pid):
                taken.append(c.pid)
    finally:
        stop.set()
        sweeper.join()
        problems = isolate.give_back(moved)
        for c in children:
            c.kill()
            c.wait()
    assert not taken, f"{len(taken)} of {len(children)} children of the lab were moved off CPU 1"
    assert problems == []
