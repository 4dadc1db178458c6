"""Tunings in a real run on this machine: a remedy phase that moves the probe
away from a hog, disables an idle state, holds the DMA latency request and
writes a sysctl; the probe runs as the phase says, and every setting reads the
same afterwards: after the run, after Ctrl-C, after SIGKILL of the controller.
That a remedy measurably helps is what advise's follow-up proves (below)."""

from __future__ import annotations

import json
import os
import signal
import subprocess
import time
from pathlib import Path

import pytest

from loopscope.lab import state
from tests.helpers import assert_clean_error
from tests.conftest import BIN, Cli
from tests.lab.test_run import wait_for

pytestmark = [pytest.mark.needs_root, pytest.mark.needs_tool("stress-ng")]

IDLE = Path("/sys/devices/system/cpu/cpu0/cpuidle/state1/disable")
SPEC = """name: {name}
probes:
  - {{kind: timer, interval_us: 1000, cpu: [0]}}
loads:
  - {{name: hog, kind: command, command: "nice -n -20 stress-ng --cpu 1 --taskset 0 --quiet"}}
phases:
{first}  - name: remedy
    loads: [hog]
    tunings:
      - {{kind: affinity, probe: timer, cpus: [1]}}
      - {{kind: write, path: /proc/sys/kernel/timer_migration, value: {migration}}}
      - {{kind: dma_latency, us: 0}}
{idle}duration: {duration}
repetitions: {reps}
kernel: {{capture: off}}
"""


def settings() -> dict[str, str]:
    out = {"timer_migration": Path("/proc/sys/kernel/timer_migration").read_text().strip()}
    for d in sorted(Path("/sys/devices/system/cpu").glob("cpu[0-9]*/cpuidle/state*/disable")):
        out[str(d)] = d.read_text().strip()
    return out


def write_spec(tmp: Path, name: str, duration: str, reps: int, hog_first: bool = True) -> Path:
    """The hog phase, then the remedy (``hog_first=False``: the remedy alone, so it starts at once)."""
    before = settings()
    idle = "      - {kind: cpuidle, state: 1}\n" if IDLE.exists() else ""
    first = "  - {name: hog, loads: [hog]}\n" if hog_first else ""
    p = tmp / f"{name}.yaml"
    p.write_text(SPEC.format(name=name, first=first, migration=0 if before["timer_migration"] != "0" else 1, idle=idle, duration=duration, reps=reps))
    return p


def _journal(run_id: str) -> Path:
    return state.state_dir() / f"{run_id}.tunings"


def test_a_remedy_phase_runs_the_probe_as_tuned_and_every_setting_is_given_back(tmp_path: Path, lab: None) -> None:
    # (that such a remedy measurably helps is the advise test's and the zoo's: their follow-ups compare the phases)
    before = settings()
    spec = write_spec(tmp_path, "tune1", "300ms", 2)
    r = subprocess.run([str(BIN), "run", str(spec), "--run-dir", str(tmp_path / "tune1"), "--no-report"], capture_output=True, text=True, timeout=300)
    assert r.returncode == 0, r.stderr
    assert settings() == before
    run = json.loads((tmp_path / "tune1" / "run.json").read_text())
    rec = [t for t in run["tunings"] if t["phase"] == "remedy"]
    assert len(rec) == 2
    paths = {c["path"]: c for c in rec[0]["changes"]}
    assert paths["/proc/sys/kernel/timer_migration"]["old"] == before["timer_migration"]
    assert "/dev/cpu_dma_latency" in paths
    if IDLE.exists():
        assert paths[str(IDLE)]["old"] == before[str(IDLE)] and paths[str(IDLE)]["new"] == "1"
    # the probe ran where each phase put it: beside the hog on CPU 0, then moved off it by the remedy's affinity
    cpus = {(st["phase"], st["rep"]): [t["cpu"] for t in json.loads((tmp_path / "tune1" / st["json"]).read_text())["threads"]] for st in run["steps"]}
    assert cpus == {("hog", 1): [0], ("remedy", 1): [1], ("hog", 2): [0], ("remedy", 2): [1]}, cpus
    assert not _journal("tune1").exists()
    prov = json.loads((tmp_path / "tune1" / "provenance.json").read_text())
    assert prov["tunings"] == run["tunings"]


def _start(tmp: Path, spec: Path, run_dir: str) -> subprocess.Popen[str]:
    return subprocess.Popen(
        [str(BIN), "run", str(spec), "--run-dir", str(tmp / run_dir), "--no-report"], stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True
    )


def test_ctrl_c_in_a_tuned_phase_gives_every_setting_back(tmp_path: Path, lab: None) -> None:
    before = settings()
    spec = write_spec(tmp_path, "tune2", "20s", 1, hog_first=False)
    p = _start(tmp_path, spec, "tune2")
    assert wait_for(lambda: _journal("tune2").exists(), 60), "the remedy phase never started"
    assert settings() != before
    p.send_signal(signal.SIGINT)
    out, err = p.communicate(timeout=60)
    assert p.returncode == 130, err
    assert settings() == before and not _journal("tune2").exists()


def test_a_killed_controller_s_tunings_are_given_back_by_the_reaper(tmp_path: Path, cli: Cli, lab: None) -> None:
    before = settings()
    spec = write_spec(tmp_path, "tune3", "20s", 1, hog_first=False)
    p = _start(tmp_path, spec, "tune3")
    assert wait_for(lambda: _journal("tune3").exists(), 60), "the remedy phase never started"
    time.sleep(0.5)
    os.kill(p.pid, signal.SIGKILL)
    p.communicate(timeout=30)
    assert wait_for(lambda: settings() == before, 20), (settings(), before)
    assert not _journal("tune3").exists()
    r = cli("cleanup")
    assert r.returncode == 0, r.stderr


def test_a_tuning_that_cannot_apply_is_refused_before_anything_runs(tmp_path: Path, cli: Cli, beside: None) -> None:
    spec = tmp_path / "bad.yaml"
    spec.write_text("name: bad\nprobes: [{kind: timer}]\nphases:\n  - name: p\n    tunings: [{kind: irq, irq: 99999, cpus: [0]}]\nduration: 1s\n")
    r = cli("run", str(spec))
    assert r.returncode == 2 and "phases.0.tunings.0 (irq): /proc/irq/99999/smp_affinity_list does not exist" in r.stderr, r.stderr


HOGGED = """name: hogged
probes:
  - {kind: timer, interval_us: 1000, cpu: [0]}
loads:
  - {name: hog, kind: command, command: "nice -n -20 stress-ng --cpu 1 --taskset 0 --quiet"}
phases:
  - {name: hog, loads: [hog]}
duration: 1s
repetitions: 3
kernel: {capture: on}
"""


def test_advise_names_the_hog_and_writes_a_follow_up_of_only_the_remedy_phase(tmp_path: Path, cli: Cli, lab: None) -> None:
    from loopscope.kernel.capture import tracefs

    if tracefs() is None:
        pytest.skip("needs tracefs for the kernel capture advise reads")
    before = settings()
    (tmp_path / "hogged.yaml").write_text(HOGGED)
    r = subprocess.run([str(BIN), "run", "hogged.yaml", "--run-dir", "h1", "--no-report"], cwd=tmp_path, capture_output=True, text=True, timeout=300)
    assert r.returncode == 0, r.stderr
    a = cli("advise", str(tmp_path / "h1"), "--json", "-o", str(tmp_path / "follow.yaml"), timeout=300)
    assert a.returncode == 0, a.stderr
    j = json.loads(a.stdout)
    hog = [x for x in j["advice"] if x["cause"] == "load: hog"]
    assert hog and hog[0]["phase"] == "hog" and hog[0]["share"] > 0.3, j["advice"]
    assert (
        set(hog[0]) == {"probe", "phase", "cause", "share", "remedy", "knob", "command", "reboot", "runtime", "left_out"}
        and hog[0]["reboot"] is False
        and hog[0]["runtime"]
        and hog[0]["left_out"] is None
    )
    assert "SCHED_FIFO" in hog[0]["remedy"]  # what a real-time engineer tries first: the probe preempts the hog
    assert j["follow_up"] == str(tmp_path / "follow.yaml")
    import yaml

    text = (tmp_path / "follow.yaml").read_text()
    fu = yaml.safe_load(text)
    assert [p["name"] for p in fu["phases"]] == ["hog", "remedy"]
    assert fu["phases"][1]["compare_with"] == "hog"  # did it help: the remedy against the phase it remedies
    assert {"kind": "sched", "probe": "timer", "policy": "fifo", "priority": 80} in fu["phases"][1]["tunings"]
    # only what changed: the author's file and the remedy phase, no defaults written out
    assert len(text.splitlines()) < 30 and "clocksync" not in text and "emulator" not in text, text
    # (that such a follow-up runs and its comparisons show the remedy helped is the cause zoo's: tests/bench/test_zoo.py)
    assert settings() == before
    # advise reads the run's explain.json when it is current: one that is not what explain writes is named
    ej = tmp_path / "h1" / "explain.json"
    ej.write_text(json.dumps({**json.loads(ej.read_text()), "groups": [{"probe": "timer"}]}))
    assert_clean_error(cli("advise", str(tmp_path / "h1"), "--json"), 2, "explain.json: groups.0.phase: Field required", "loopscope explain")


LIMITED = """name: limited
probes:
  - {kind: timer, interval_us: 1000, cpu: [1]}
loads:
  - {name: busy, kind: command, command: "stress-ng --cpu 1 --taskset 0 --quiet"}
phases:
  - {name: free, loads: [busy]}
  - {name: held, loads: [busy], tunings: [{kind: limit, load: busy, cpus: 0.1}]}
duration: 2s
kernel: {capture: off}
"""


def test_a_limit_tuning_holds_a_load_to_its_cpu_budget_and_its_group_is_gone_after(tmp_path: Path, lab: None) -> None:
    from loopscope.host import cpulimit

    if why := cpulimit.missing():
        pytest.skip(why)
    (tmp_path / "e.yaml").write_text(LIMITED)
    r = subprocess.run([str(BIN), "run", "e.yaml", "--run-dir", "run", "--no-report"], cwd=tmp_path, capture_output=True, text=True, timeout=240)
    assert r.returncode == 0, r.stderr
    loads = {ld["phase"]: ld for ld in json.loads((tmp_path / "run" / "run.json").read_text())["loads"]}
    share = {ph: ld["cpu_s"] / ld["elapsed_s"] for ph, ld in loads.items()}
    assert share["free"] > 0.7, share
    # 10 ms of every 100 ms, and the load's settling before the limit applies (about a tenth of the phase here)
    assert share["held"] < 0.35 and share["held"] < share["free"] / 2.5, share
    assert not [g for g in cpulimit.leftovers() if g.name.startswith(cpulimit.LIMIT_PREFIX)]
    assert not any(p.name.startswith(cpulimit.LIMIT_PREFIX) for root in (cpulimit.V1_CPU, cpulimit.V2) if root.is_dir() for p in root.iterdir())
