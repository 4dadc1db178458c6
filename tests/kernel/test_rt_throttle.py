"""RT throttling: a SCHED_FIFO spinner spends its CPU's real-time share and
the kernel holds every real-time task there, a real-time probe too. explain
must name the hold (`throttled: RT`), not the idle CPU or the tasks that ran
meanwhile."""

from __future__ import annotations

import json
import subprocess
from pathlib import Path

import pytest

from loopscope.bench.zoocase import _rt_throttling_off
from loopscope.kernel import capture as C
from tests.conftest import BIN

SPIN = "import os; os.sched_setaffinity(0, [1]); os.sched_setscheduler(0, os.SCHED_FIFO, os.sched_param(10))\nwhile True: pass"

SPEC = f"""name: rt-throttle
probes:
  - {{kind: timer, name: t, interval_us: 20000, cpu: [1], priority: 80}}
loads:
  - {{name: spin, kind: command, command: [python3, -c, {json.dumps(SPIN)}]}}
phases:
  - {{name: quiet}}
  - {{name: spun, loads: [spin]}}
duration: 3s
warmup: 0.3s
"""


@pytest.mark.needs_root
def test_a_real_time_probe_held_by_rt_throttling_is_throttled_rt(tmp_path: Path, lab: None) -> None:
    if why := _rt_throttling_off():
        pytest.skip(why)
    if C.tracefs() is None:
        pytest.skip("needs tracefs")
    (tmp_path / "e.yaml").write_text(SPEC)
    r = subprocess.run([str(BIN), "run", "e.yaml", "--run-dir", "run"], cwd=tmp_path, capture_output=True, text=True, timeout=240)
    assert r.returncode == 0, r.stderr
    ex = json.loads((tmp_path / "run" / "explain.json").read_text())
    spun = next(g for g in ex["groups"] if g["phase"] == "spun")
    assert spun["causes"][0]["cause"] == "throttled: RT", spun["causes"]
    assert spun["causes"][0]["share"] > 0.5
    quiet = next(g for g in ex["groups"] if g["phase"] == "quiet")
    assert all(c["cause"] != "throttled: RT" for c in quiet["causes"])
