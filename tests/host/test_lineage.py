"""Children of the lab die with the process that started them, even when it
dies before they have asked the kernel to tell them.

A child names the pid that started it (``LOOPSCOPE_PDEATHSIG``); one whose
parent is already someone else when it gets to ``prctl`` (it was importing
while its parent was killed) must stop at once rather than run its whole
duration as an orphan. Here the named pid is one that is not the child's
parent, which is what the child sees after such a death.
"""

from __future__ import annotations

import os
import subprocess
import sys
import time
from pathlib import Path

from loopscope.host import procs

PY = sys.executable


def _orphaned_env(run_id: str) -> dict[str, str]:
    env = procs.child_env(run_id)
    # a pid that is alive but is not the child's parent: the child's view once its parent died
    env["LOOPSCOPE_PDEATHSIG"] = "1" if os.getpid() != 1 else str(os.getppid())
    return env


def _run(argv: list[str], env: dict[str, str]) -> tuple[subprocess.CompletedProcess[str], float]:
    t0 = time.monotonic()
    r = subprocess.run(argv, env=env, capture_output=True, text=True, timeout=60)
    return r, time.monotonic() - t0


def test_the_environment_names_this_process_as_the_parent_to_die_with() -> None:
    assert procs.child_env("procs-t0")["LOOPSCOPE_PDEATHSIG"] == str(os.getpid())


def test_a_probe_whose_parent_died_before_it_started_exits_at_once(lab: None) -> None:
    r, took = _run([PY, "-m", "loopscope.cli", "probe", "timer", "--interval-us", "2000", "--duration", "20s", "--json"], _orphaned_env("procs-t1"))
    assert r.returncode == 1, r.stderr
    assert took < 15


def test_a_load_worker_whose_parent_died_before_it_started_exits_at_once() -> None:
    r, took = _run([PY, "-m", "loopscope.loads.worker", "cpu", "--seconds", "20"], _orphaned_env("procs-t2"))
    assert r.returncode != 0
    assert "parent process exited" in r.stderr
    assert took < 15


def test_a_kernel_reader_whose_parent_died_before_it_started_exits_at_once(tmp_path: Path) -> None:
    r, took = _run(
        [PY, "-m", "loopscope.kernel.drain", "--instance", "loopscope-procs-t3", "--out", str(tmp_path), "--buffer-mb", "1", "--events", "sched:sched_switch"],
        _orphaned_env("procs-t3"),
    )
    assert r.returncode == 1, r.stderr
    assert took < 15
    assert not Path("/sys/kernel/tracing/instances/loopscope-procs-t3").exists()


def test_a_child_whose_parent_is_alive_keeps_running() -> None:
    env = procs.child_env("procs-t4")
    r, _ = _run([PY, "-m", "loopscope.loads.worker", "cpu", "--seconds", "0.2", "--duty", "0.1"], env)
    assert r.returncode == 0, r.stderr
    assert '"error": null' in r.stdout or '"error":null' in r.stdout


def test_die_with_parent_says_no_when_the_named_parent_is_not_the_parent() -> None:
    code = "from loopscope.lineage import die_with_parent; import sys; sys.exit(0 if die_with_parent(parent=1) else 3)"
    r = subprocess.run([PY, "-c", code], capture_output=True, text=True, timeout=30)
    assert r.returncode == (0 if os.getpid() == 1 else 3), r.stderr


def test_workers_a_loopscope_process_starts_itself_die_with_it_not_with_its_own_parent() -> None:
    """A process whose environment names its own parent (a lab started it)
    passes on its own pid, not that stale one: its workers run."""
    code = (
        "import time; from loopscope.model import node\n"
        "ps = node._start_workers('cpu', 1, '/tmp', None)\n"
        "time.sleep(1.5)\n"
        "alive = ps[0].poll() is None\n"
        "ps[0].terminate(); ps[0].wait()\n"
        "print(alive)\n"
    )
    r = subprocess.run([PY, "-c", code], env=_orphaned_env("procs-t6"), capture_output=True, text=True, timeout=60)
    assert r.stdout.strip() == "True", r.stderr
