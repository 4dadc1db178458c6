"""Runs from the command line: what a run leaves, and that every way it can
end (done, bad input, a failing probe or load, Ctrl-C, a crashed agent, a
killed controller) leaves no process, cgroup or state file behind."""

from __future__ import annotations

import json
import os
import signal
import subprocess
import time
from pathlib import Path
from typing import Callable

import pytest

from loopscope.lab import state
from loopscope.host import procs
from loopscope.host.cgroup import find_root
from loopscope.kernel import tracing
from tests.conftest import BIN, Cli
from tests.kernel.test_capture import PINGPONG

TINY = """name: tiny
probes:
  - kind: timer
    interval_us: 2000
loads:
{loads}
duration: {duration}
"""
CPU = "  - kind: cpu\n    level: 1\n"


def write_spec(tmp: Path, loads: str = CPU, duration: str = "300ms", extra: str = "", probes: str | None = None) -> Path:
    text = TINY.format(loads=loads or "  []", duration=duration) + extra
    if loads == "":
        text = text.replace("loads:\n  []\n", "loads: []\n")
    if probes is not None:
        text = text.replace("probes:\n  - kind: timer\n    interval_us: 2000\n", f"probes:\n{probes}")
    p = tmp / "spec.yaml"
    p.write_text(text)
    return p


def _described(pids: list[int]) -> list[str]:
    """Each pid with its parent and command line, for a failure message."""
    out = []
    for p in pids:
        try:
            ppid = Path(f"/proc/{p}/stat").read_text().rsplit(")", 1)[1].split()[1]
            cmd = Path(f"/proc/{p}/cmdline").read_bytes().replace(b"\0", b" ").decode(errors="replace")
        except OSError:
            ppid, cmd = "?", "(gone)"
        out.append(f"{p} (parent {ppid}): {cmd[:200]}")
    return out


def leftovers(run_id: str) -> list[str]:
    out = [f"process {d}" for d in _described(procs.pids_of_run(run_id))]
    root, _ = find_root()
    if root is not None and (root / run_id).exists():
        out.append(f"cgroup {root / run_id}")
    if (state.state_dir() / f"{run_id}.json").exists():
        out.append("state file")
    out += [f"trace instance {n}" for n in tracing.run_instances(run_id)]
    return out


def wait_for(pred: Callable[[], bool], timeout: float = 20.0) -> bool:
    end = time.monotonic() + timeout
    while time.monotonic() < end:
        if pred():
            return True
        time.sleep(0.1)
    return pred()


def test_a_run_collects_everything_and_prints_the_run_directory_last(cli: Cli, tmp_path: Path, lab: None) -> None:
    spec = write_spec(tmp_path)
    r = cli("run", str(spec), "--run-dir", "out/r1", timeout=300)
    assert r.returncode == 0, r.stderr
    assert r.stdout.strip().splitlines()[-1] == "out/r1"
    d = tmp_path / "out" / "r1"
    for f in (
        "spec.yaml",
        "spec.json",
        "provenance.json",
        "run.json",
        "index.json",
        "report.html",
        "agent.log",
        "tables/timer.parquet",
        "tables/comparisons.parquet",
    ):
        assert (d / f).exists(), f
    assert (d / "spec.yaml").read_text() == spec.read_text()
    run = json.loads((d / "run.json").read_text())
    assert run["status"] == "completed"
    assert [(s["phase"], s["probe"]) for s in run["steps"]] == [("baseline", "timer"), ("cpu-1", "timer")]
    assert len(run["loads"]) == 1 and run["loads"][0]["cpu_s"] > 0
    prov = json.loads((d / "provenance.json").read_text())["hosts"]["localhost"]
    for k in ("kernel", "cpu", "clocksource", "cpufreq", "privileges", "software", "loopscope_git"):
        assert k in prov
    index = {f["path"]: f for f in json.loads((d / "index.json").read_text())["files"]}
    assert "spec.yaml" in index and len(index["spec.yaml"]["sha256"]) == 64
    assert not (d / "scratch").exists()
    assert "report: " in r.stdout
    assert leftovers("r1") == []
    root, _ = find_root()
    assert root is None or not any(p.is_dir() for p in root.iterdir())


def test_an_existing_run_directory_is_refused_and_left_alone(cli: Cli, tmp_path: Path, beside: None) -> None:
    spec = write_spec(tmp_path)
    d = tmp_path / "taken"
    d.mkdir()
    (d / "keep.txt").write_text("mine")
    r = cli("run", str(spec), "--run-dir", str(d))
    assert r.returncode == 2 and "already exists; nothing was overwritten" in r.stderr, r.stderr
    assert [p.name for p in d.iterdir()] == ["keep.txt"]


@pytest.mark.needs_root
def test_a_read_only_results_directory_is_refused(cli: Cli, tmp_path: Path, beside: None) -> None:
    spec = write_spec(tmp_path)
    ro = tmp_path / "ro"
    ro.mkdir()
    subprocess.run(["mount", "-t", "tmpfs", "-o", "ro,size=1m", "tmpfs", str(ro)], check=True)
    try:
        r = cli("run", str(spec), "--results", str(ro))
        assert r.returncode == 2 and "results directory is not writable" in r.stderr, r.stderr
    finally:
        subprocess.run(["umount", str(ro)], check=False)


def test_a_command_that_is_not_installed_fails_preflight(cli: Cli, tmp_path: Path, lab: None) -> None:
    spec = write_spec(tmp_path, loads="  - kind: command\n    command: no-such-program-xyz --go\n")
    r = cli("run", str(spec), "--results", str(tmp_path / "runs"))
    assert r.returncode == 2 and "loads.0.command: 'no-such-program-xyz' is not installed" in r.stderr, r.stderr
    assert not (tmp_path / "runs").exists()


def test_a_failing_probe_stops_the_run_and_names_its_command_and_output(cli: Cli, tmp_path: Path, lab: None, beside: None) -> None:
    probes = "  - kind: syscall\n    calls: [open]\n    dir: /proc/1/nonexistent\n"
    spec = write_spec(tmp_path, probes=probes)
    r = cli("run", str(spec), "--run-dir", "fail1", timeout=300)
    assert r.returncode == 1, r.stderr
    assert "probe syscall" in r.stderr and "command:" in r.stderr and "exit code 1" in r.stderr
    assert "/proc/1/nonexistent" in r.stderr
    assert r.stdout.strip().splitlines()[-1] == "fail1"
    run = json.loads((tmp_path / "fail1" / "run.json").read_text())
    assert run["status"] == "failed"
    assert leftovers("fail1") == []


def test_a_load_that_dies_fails_the_run_with_its_exit_code(cli: Cli, tmp_path: Path, lab: None, beside: None) -> None:
    spec = write_spec(tmp_path, loads="  - name: quitter\n    kind: command\n    command: [sh, -c, 'echo giving up >&2; exit 3']\n")
    r = cli("run", str(spec), "--run-dir", "fail2", timeout=300)
    assert r.returncode == 1, r.stderr
    assert "load quitter" in r.stderr and "exit code 3" in r.stderr and "giving up" in r.stderr
    assert leftovers("fail2") == []


def _start(tmp_path: Path, spec: Path, run_dir: str) -> subprocess.Popen[str]:
    return subprocess.Popen([str(BIN), "run", str(spec), "--run-dir", run_dir], cwd=tmp_path, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)


def _running(tmp_path: Path, run_dir: str) -> bool:
    rj = tmp_path / run_dir / "run.json"
    try:
        r = json.loads(rj.read_text())
    except (OSError, json.JSONDecodeError):
        return False
    return "agent" in r or bool(r.get("steps"))


def _agent_pid(tmp_path: Path, run_dir: str) -> int:
    info = next(i for i in state.registered() if i.run_id == run_dir)
    assert info.agent_pid is not None
    return info.agent_pid


def _wait_loaded(run_id: str) -> bool:
    """True once a load worker of the run is running."""
    return wait_for(
        lambda: any(b"loopscope.loads.worker" in Path(f"/proc/{p}/cmdline").read_bytes() for p in procs.pids_of_run(run_id) if Path(f"/proc/{p}").exists()), 30
    )


def test_ctrl_c_stops_everything_and_keeps_what_was_collected(tmp_path: Path, lab: None, beside: None) -> None:
    spec = write_spec(tmp_path, duration="20s", extra="baseline: false\n")
    with _start(tmp_path, spec, "int1") as p:
        assert _wait_loaded("int1")
        p.send_signal(signal.SIGINT)
        out, err = p.communicate(timeout=60)
    assert p.returncode == 130, err
    assert "interrupted" in err
    assert out.strip().splitlines()[-1] == "int1"
    run = json.loads((tmp_path / "int1" / "run.json").read_text())
    assert run["status"] == "interrupted"
    assert (tmp_path / "int1" / "steps").exists()
    assert wait_for(lambda: leftovers("int1") == [], 10), leftovers("int1")


def _timer_threads(pid: int) -> list[str]:
    """The names of the timer probe's measuring threads in process ``pid`` (none while it starts up)."""
    try:
        return [c for t in Path(f"/proc/{pid}/task").iterdir() if (c := (t / "comm").read_text().strip()).startswith("ls-timer-")]
    except OSError:
        return []


def _probe_measuring(run_id: str) -> bool:
    """True once the run's timer probe measures: its threads exist (the process alone may still be importing,
    most of a second on a busy host)."""
    return wait_for(lambda: any(_timer_threads(p) for p in procs.pids_of_run(run_id)), 30)


@pytest.mark.parametrize("sig", [signal.SIGINT, signal.SIGTERM], ids=["SIGINT", "SIGTERM"])
def test_a_signal_inside_a_long_window_stops_the_run_at_once_and_keeps_what_the_probe_measured(
    tmp_path: Path, sig: signal.Signals, lab: None, beside: None
) -> None:
    spec = write_spec(tmp_path, loads="", duration="60s")
    run_id = f"cut{sig.name}"
    with _start(tmp_path, spec, run_id) as p:
        assert _probe_measuring(run_id)
        time.sleep(1.0)
        t0 = time.monotonic()
        p.send_signal(sig)
        out, err = p.communicate(timeout=60)
        took = time.monotonic() - t0
    assert p.returncode == 130, err
    # not the rest of a 60 s window: the probe was told to stop and said what it measured
    assert took < 15, took
    run = json.loads((tmp_path / run_id / "run.json").read_text())
    assert run["status"] == "interrupted"
    [step] = run["steps"]
    assert step["interrupted"] == sig.name
    result = json.loads((tmp_path / run_id / step["json"]).read_text().strip().splitlines()[-1])
    assert result["interrupted"] and result["samples"] > 100
    assert wait_for(lambda: leftovers(run_id) == [], 10), leftovers(run_id)
    if sig == signal.SIGINT:  # (one report is enough: the two signals take one path)
        r = subprocess.run([str(BIN), "report", str(tmp_path / run_id)], capture_output=True, text=True, timeout=300)
        assert r.returncode == 0, r.stderr
        assert "1 probe runs" in r.stdout and f"cut short by {sig.name}" in r.stdout, r.stdout


def test_a_crashed_agent_fails_the_run_and_leaves_nothing(tmp_path: Path, lab: None, beside: None) -> None:
    spec = write_spec(tmp_path, duration="20s", extra="baseline: false\n")
    with _start(tmp_path, spec, "crash1") as p:
        assert _wait_loaded("crash1")
        os.kill(_agent_pid(tmp_path, "crash1"), signal.SIGKILL)
        out, err = p.communicate(timeout=60)
    assert p.returncode == 1, err
    assert "the agent on localhost died" in err and "killed by SIGKILL" in err
    assert wait_for(lambda: leftovers("crash1") == [], 10), leftovers("crash1")


def test_a_killed_controller_takes_the_agent_and_loads_with_it(tmp_path: Path, cli: Cli, lab: None) -> None:
    spec = write_spec(tmp_path, duration="20s", extra="baseline: false\n")
    with _start(tmp_path, spec, "kill1") as p:
        assert _wait_loaded("kill1")
        p.send_signal(signal.SIGKILL)
        p.communicate(timeout=30)
    # The agent hears of it from the kernel (PR_SET_PDEATHSIG) and cleans up.
    assert wait_for(lambda: not procs.pids_of_run("kill1"), 20), _described(procs.pids_of_run("kill1"))
    root, _ = find_root()
    # the agent removes the cgroups once its children are gone: a moment after them
    assert root is None or wait_for(lambda: not (root / "kill1").exists(), 10)
    # Only the state file is left; cleanup marks the run abandoned and removes it.
    r = cli("cleanup")
    assert r.returncode == 0 and "run kill1" in r.stdout, r.stdout
    assert json.loads((tmp_path / "kill1" / "run.json").read_text())["status"] == "abandoned"
    assert leftovers("kill1") == []


def test_cleanup_removes_what_survives_a_killed_controller_and_agent(tmp_path: Path, cli: Cli, lab: None) -> None:
    # An external program does not die with its parent: only its cgroup (or
    # its run id in the environment) finds it again.
    spec = write_spec(tmp_path, duration="30s", loads="  - name: sleeper\n    kind: command\n    command: sleep 600\n", extra="baseline: false\n")
    with _start(tmp_path, spec, "kill2") as p:
        assert wait_for(lambda: any(b"sleep" in Path(f"/proc/{q}/cmdline").read_bytes() for q in procs.pids_of_run("kill2") if Path(f"/proc/{q}").exists()), 30)
        agent = _agent_pid(tmp_path, "kill2")
        os.kill(agent, signal.SIGSTOP)  # so it cannot clean up when its parent dies
        p.send_signal(signal.SIGKILL)
        p.communicate(timeout=30)
        os.kill(agent, signal.SIGKILL)
    assert wait_for(lambda: not Path(f"/proc/{agent}").exists(), 10)
    assert procs.pids_of_run("kill2"), "the external load should have survived"
    r = cli("cleanup")
    assert r.returncode == 0, r.stderr
    assert "run kill2" in r.stdout
    assert wait_for(lambda: leftovers("kill2") == [], 10), leftovers("kill2")
    assert cli("cleanup").stdout.strip() == "nothing to clean up"


def test_no_kernel_capture_on_the_command_line_turns_the_capture_off_and_says_so(tmp_path: Path, cli: Cli, lab: None, beside: None) -> None:
    spec = write_spec(tmp_path, loads="", extra="kernel: {capture: on}\n")
    r = cli("run", str(spec), "--run-dir", str(tmp_path / "nk"), "--no-report", "--no-kernel-capture")
    assert r.returncode == 0, r.stderr
    run = json.loads((tmp_path / "nk" / "run.json").read_text())
    assert not run.get("kernel")
    assert any("no kernel capture" in n for n in run["notes"]), run["notes"]
    assert json.loads((tmp_path / "nk" / "spec.json").read_text())["kernel"]["capture"] == "off"


def test_a_capture_buffer_filling_in_a_window_is_said_and_the_run_completes(tmp_path: Path, cli: Cli, lab: None) -> None:
    # 1 MiB per CPU against two threads switching as fast as they can: the
    # kernel wakes the reader when a buffer is half full, inside the probe's
    # windows; the run keeps each such read (when, for how long, in which step).
    from loopscope.kernel.capture import tracefs

    if tracefs() is None:
        pytest.skip("needs tracefs for a kernel capture")
    (tmp_path / "pingpong.py").write_text(PINGPONG)
    load = f"  - {{name: switch, kind: command, command: [{json.dumps(str(BIN.parent / 'python'))}, {json.dumps(str(tmp_path / 'pingpong.py'))}]}}\n"
    spec = write_spec(tmp_path, loads=load, duration="2s", extra="kernel: {capture: on, buffer_mb: 1}\n")
    r = cli("run", str(spec), "--run-dir", str(tmp_path / "hf"), "--no-report")
    assert r.returncode == 0, r.stderr
    run = json.loads((tmp_path / "hf" / "run.json").read_text())
    cap = run["kernel"]["captures"][0]
    assert cap["reader"]["reads_half_full"] > 0, cap["reader"]
    assert len(cap["reader_ran_during"]) == cap["reader"]["reads_half_full"]
    inside = [x for x in cap["reader_ran_during"] if x["step"]]
    assert inside and all(x["read_ms"] > 0 and x["at_s"] >= 0 for x in inside), cap["reader_ran_during"][:3]
    assert any("filled to half" in n for n in run["notes"]), run["notes"]


def test_a_bug_in_the_controller_fails_the_run_naming_it_and_keeps_the_traceback_beside_the_record(tmp_path: Path) -> None:
    from loopscope.kinds import KINDS
    from loopscope.lab.session import Session, execute
    from loopscope.spec.load import parse

    exp = parse("name: bug\nprobes: [{kind: timer}]\nduration: 1s\n", "bug.yaml", KINDS)

    class Broken:
        """A loop whose plan has a bug."""

        def __init__(self) -> None:
            self.session = Session(exp, "name: bug\n", tmp_path / "run", lambda _m: None, [], {h.name: "local" for h in exp.hosts})

        def plan(self) -> None:
            raise ValueError("a value nobody expected")

        def teardown(self) -> None:
            self.session.teardown()

    out = execute(Broken())
    assert out.status == "failed" and "ValueError: a value nobody expected" in (out.error or "") and "loopscope's bug" in (out.error or "")
    tb = (tmp_path / "run" / "controller-error.txt").read_text()
    assert "Traceback" in tb and "raise ValueError" in tb
    rec = json.loads((tmp_path / "run" / "run.json").read_text())
    assert rec["failed"]["component"] == "controller"
