"""The exec host kind: agents started by a launcher, here ``ip netns exec``
and ``nsenter`` into a fleet of namespaces on one switch (``bench/fleet.py``),
so every part is real: the launcher's stdio is the agent's channel, the
agents' files come home through it, one kernel capture covers the hosts of
one kernel, and a host killed mid-run is lost (``on_host_failure``)."""

from __future__ import annotations

import json
import os
import signal
import subprocess
from pathlib import Path
from typing import Iterator

import pytest

from loopscope.bench.fleet import Fleet, agent_in
from loopscope.host.statedir import state_dir
from tests.conftest import BIN, Cli
from tests.lab.test_multihost import leftovers
from tests.lab.test_run import wait_for

pytestmark = [pytest.mark.needs_root, pytest.mark.needs_tool("ip", "nsenter")]


@pytest.fixture(scope="module")
def fleet() -> Iterator[Fleet]:
    with Fleet(3) as f:
        yield f
    assert not any(Path("/run/netns", n).exists() for n in f.namespaces)


def hosts(f: Fleet, n: int = 2, **extra: str) -> str:
    out = ["hosts:"]
    for i in range(1, n + 1):
        # both launchers: ip netns exec (which mounts a sysfs of its own) and nsenter (which does not)
        launcher = f"[ip, netns, exec, {f.ns(i)}]" if i % 2 else f"[nsenter, '--net=/run/netns/{f.ns(i)}']"
        more = "".join(f", {k}: {v}" for k, v in extra.items())
        out.append(f"  - {{name: h{i}, kind: exec, launcher: {launcher}, address: {f.address(i)}{more}}}")
    return "\n".join(out) + "\n"


def test_a_run_on_exec_hosts_brings_their_files_home_through_the_agents_with_one_capture_for_their_kernel(
    fleet: Fleet, tmp_path: Path, cli: Cli, lab: None, beside: None
) -> None:
    spec = tmp_path / "exec.yaml"
    spec.write_text(
        "name: exec\n" + hosts(fleet) + "probes:\n  - {kind: timer, host: h2, interval_us: 2000}\n  - {kind: rr, host: h1, dest: h2, rate: 200pps}\n"
        "loads:\n  - {kind: cpu, host: h2}\nduration: 500ms\n"
    )
    r = cli("run", str(spec), "--run-dir", "execrun", timeout=240)
    assert r.returncode == 0, r.stderr
    d = tmp_path / "execrun"
    run = json.loads((d / "run.json").read_text())
    assert run["hosts"] == {"h1": "exec", "h2": "exec"}
    for phase in ("baseline", "cpu-1"):
        assert (d / "hosts" / "h2" / "steps" / f"r01-{phase}" / "timer.lstrace").stat().st_size > 0
        assert (d / "hosts" / "h1" / "steps" / f"r01-{phase}" / "rr.lstrace").stat().st_size > 0
    # Both hosts run on this machine's kernel: one capture records for both, and its files came home too.
    caps = run["kernel"]["captures"]
    assert len(caps) == 1 and sorted(caps[0]["covers"]) == ["h1", "h2"], caps
    if not caps[0].get("refused"):
        assert (d / caps[0]["data"] / "segments.jsonl").exists()
    prov = json.loads((d / "provenance.json").read_text())
    assert prov["lab"]["hosts"]["h1"]["launcher"][:3] == ["ip", "netns", "exec"]
    assert prov["hosts"]["h1"]["boot_id"] == Path("/proc/sys/kernel/random/boot_id").read_text().strip()
    assert "timer latency" in r.stdout and "rr rtt" in r.stdout
    # nothing is left where the agents wrote, nor running
    assert not (Path("/tmp/loopscope-runs") / "execrun").exists()
    assert wait_for(lambda: leftovers("execrun") == [], 15), leftovers("execrun")


def _run_and_kill(f: Fleet, tmp: Path, name: str, policy: str) -> tuple[subprocess.CompletedProcess[str], Path]:
    spec = tmp / f"{name}.yaml"
    spec.write_text(
        f"name: {name}\non_host_failure: {policy}\n"
        + hosts(f, 3)
        + "probes:\n  - {kind: timer, name: t1, host: h1, interval_us: 2000}\n  - {kind: timer, name: t2, host: h2, interval_us: 2000}\n"
        "  - {kind: rr, host: h1, dest: h3, rate: 200pps}\nloads:\n  - {kind: cpu, host: h2}\nduration: 400ms\n"
    )
    with subprocess.Popen([str(BIN), "run", str(spec), "--run-dir", name], cwd=tmp, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True) as p:
        assert wait_for(lambda: (tmp / name / "hosts" / "h2" / "agent.log").exists() and json.loads((tmp / name / "run.json").read_text()).get("steps"), 90)
        pid = agent_in(f.ns(2))
        assert pid is not None
        os.kill(pid, signal.SIGKILL)
        out, err = p.communicate(timeout=180)
    return subprocess.CompletedProcess(p.args, p.returncode, out, err), tmp / name


def test_a_host_killed_mid_run_under_continue_is_named_and_the_others_complete(fleet: Fleet, tmp_path: Path, lab: None, beside: None) -> None:
    r, d = _run_and_kill(fleet, tmp_path, "lostrun", "continue")
    assert r.returncode == 0, r.stderr
    assert "LOST HOST h2" in r.stdout and "died" in r.stdout
    run = json.loads((d / "run.json").read_text())
    assert run["status"] == "completed"
    lost = run["lost_hosts"]
    assert [lh["host"] for lh in lost] == ["h2"] and lost[0]["at_utc"] and "killed by SIGKILL" in lost[0]["why"]
    # the other hosts' steps are all there; h2's are marked, none recorded as measured
    done = {(s["rep"], s["phase"], s["probe"]) for s in run["steps"]}
    for phase in ("baseline", "cpu-1"):
        assert (1, phase, "t1") in done and (1, phase, "rr") in done
    assert "r01-cpu-1/t2" in lost[0]["steps"] and not any(s["probe"] == "t2" and s["phase"] == "cpu-1" for s in run["steps"])
    html = (d / "report.html").read_text()
    assert "Hosts lost mid-run" in html and "h2" in html
    assert wait_for(lambda: leftovers("lostrun") == [], 15), leftovers("lostrun")


def test_a_host_killed_mid_run_under_stop_fails_the_run_saying_which_when_and_why(fleet: Fleet, tmp_path: Path, lab: None, beside: None) -> None:
    r, d = _run_and_kill(fleet, tmp_path, "stoprun", "stop")
    assert r.returncode == 1, r.stderr
    assert "the agent on h2 died" in r.stderr and "command: nsenter --net=/run/netns/" in r.stderr
    failed = json.loads((d / "run.json").read_text())["failed"]
    assert failed["host"] == "h2" and failed["at_utc"] and failed["during"] and "SIGKILL" in failed["why"]
    assert wait_for(lambda: leftovers("stoprun") == [], 15), leftovers("stoprun")


@pytest.mark.parametrize(
    ("launcher", "said"),
    [
        ("[no-such-launcher, x]", "its launcher 'no-such-launcher' is not installed"),
        ("[/bin/false]", "the launcher `/bin/false` failed (exit code 1)"),
        ("[echo, hello]", "printed something that is not loopscope"),
        ("[sh, -c, 'echo cannot reach node n7 >&2; exit 3', x]", "cannot reach node n7"),
    ],
)
def test_a_launcher_that_is_missing_fails_or_is_not_loopscope_stops_the_run_at_preflight(
    launcher: str, said: str, tmp_path: Path, cli: Cli, beside: None
) -> None:
    spec = tmp_path / "bad.yaml"
    spec.write_text(f"name: bad\nhosts:\n  - {{name: n7, kind: exec, launcher: {launcher}, address: 10.9.9.9}}\nprobes:\n  - {{kind: timer}}\nduration: 1s\n")
    r = cli("run", str(spec))
    assert r.returncode == 2, r.stderr
    assert "host n7:" in r.stderr and said in r.stderr, r.stderr
    assert "Traceback" not in r.stderr


def test_an_exec_host_without_an_address_or_a_launcher_is_refused(tmp_path: Path, cli: Cli) -> None:
    spec = tmp_path / "bad.yaml"
    spec.write_text(
        "name: bad\nhosts:\n  - {name: a, kind: exec, launcher: [srun]}\n  - {name: b, kind: exec, address: 10.0.0.2}\n  - {name: c, kind: ssh, address: x, launcher: [srun]}\n"
        "probes:\n  - {kind: timer}\nduration: 1s\n"
    )
    r = cli("check", str(spec))
    assert r.returncode == 2
    assert "hosts.0.address: exec host 'a' needs an address" in r.stderr
    assert "hosts.1.launcher: exec host 'b' needs a launcher" in r.stderr
    assert "hosts.2.launcher: only exec hosts take a launcher" in r.stderr


def test_an_agent_of_another_version_refuses_naming_both(tmp_path: Path) -> None:
    import loopscope

    p = subprocess.run(
        [str(BIN.parent / "python"), "-m", "loopscope.agent"],
        input='{"id": 1, "op": "hello", "run_id": "v", "run_dir": "%s", "cgroups": false, "controller_version": "9.9.9"}\n' % tmp_path,
        capture_output=True,
        text=True,
        timeout=60,
    )
    reply = json.loads(p.stdout.splitlines()[0])
    assert reply["ok"] is False
    assert f"this host's loopscope is {loopscope.__version__}" in reply["error"] and "the controller's is 9.9.9" in reply["error"]
    assert "loopscope hosts install" in reply["error"]


@pytest.mark.skipif(
    __import__("loopscope.spec.inventory", fromlist=["tool"]).tool() is None, reason="needs ansible-core's ansible-inventory (Debian: ansible-core)"
)
def test_a_run_on_hosts_from_an_ansible_inventory_reaches_them_through_their_launchers(fleet: Fleet, tmp_path: Path, cli: Cli, lab: None, beside: None) -> None:
    lines = ["all:", "  children:", "    fleet:", "      hosts:"]
    for i in (1, 2):
        lines += [
            f"        node{i}:",
            f"          ansible_host: {fleet.address(i)}",
            f"          loopscope_launcher: [nsenter, '--net=/run/netns/{fleet.ns(i)}']",
        ]
    (tmp_path / "fleet.yml").write_text("\n".join(lines) + "\n")
    spec = tmp_path / "inv.yaml"
    spec.write_text(
        "name: inv\nhosts: {inventory: fleet.yml, group: fleet, kind: exec}\nprobes:\n  - {kind: rr, host: node1, dest: node2, rate: 200pps}\nduration: 500ms\nbaseline: true\n"
        "kernel: {capture: off}\n"
    )
    r = cli("run", str(spec), "--run-dir", "invrun", "--no-report", timeout=240)
    assert r.returncode == 0, r.stderr
    run = json.loads((tmp_path / "invrun" / "run.json").read_text())
    assert run["hosts"] == {"node1": "exec", "node2": "exec"}
    assert run["agents"]["node2"]["address"] == fleet.address(2)
    assert (tmp_path / "invrun" / "hosts" / "node1" / "steps" / "r01-baseline" / "rr.lstrace").stat().st_size > 0
    assert wait_for(lambda: leftovers("invrun") == [], 15), leftovers("invrun")


def test_cleanup_deletes_a_fleet_whose_process_is_gone_and_keeps_a_live_one(cli: Cli, lab: None) -> None:
    dead = subprocess.Popen(["true"])
    dead.wait()
    gone, kept = f"lsf{dead.pid}-h1", f"lsf{os.getpid()}-h99"
    for n in (gone, kept):
        subprocess.run(["ip", "netns", "add", n], check=True)
    try:
        r = cli("cleanup")
        assert r.returncode == 0, r.stderr
        assert gone in r.stdout and not Path("/run/netns", gone).exists()
        assert Path("/run/netns", kept).exists()
    finally:
        for n in (gone, kept):
            subprocess.run(["ip", "netns", "delete", n], capture_output=True)


#: tests only: every ssh or exec host counts as a kernel of its own, so what another machine's kernel takes (its capture, its tunings) goes through its agent
APART = {"LOOPSCOPE_APART_KERNELS": "1"}
SWAPPINESS = Path("/proc/sys/vm/swappiness")


def _tuned_spec(f: Fleet, tmp: Path, name: str, tuning: str, extra: str = "") -> Path:
    spec = tmp / f"{name}.yaml"
    spec.write_text(
        f"name: {name}\n{extra}" + hosts(f, 1) + "probes:\n  - {kind: timer, host: h1, interval_us: 2000}\nphases:\n"
        f"  - {{name: tuned, tunings: [{tuning}]}}\nduration: 1500ms\nkernel: {{capture: off}}\n"
    )
    return spec


def _agent_journals(run_id: str) -> list[Path]:
    return sorted(state_dir().glob(f"{run_id}.agent*.tunings"))


def _start_swappiness_run(f: Fleet, tmp: Path, name: str, extra: str = "") -> tuple[str, str, subprocess.Popen[str]]:
    """A run on exec host h1, counted as another kernel, whose phase writes vm.swappiness: the value before, the phase's, the controller."""
    was = SWAPPINESS.read_text().strip()
    new = "13" if was != "13" else "17"
    spec = _tuned_spec(f, tmp, name, f"{{kind: write, path: {SWAPPINESS}, value: {new}}}", extra)
    run = [str(BIN), "run", str(spec), "--run-dir", name]
    return was, new, subprocess.Popen(run, cwd=tmp, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True, env={**os.environ, **APART})


def test_a_host_on_another_kernel_is_tuned_by_its_agent_with_the_journal_there_and_given_back(fleet: Fleet, tmp_path: Path, lab: None) -> None:
    was, new, p = _start_swappiness_run(fleet, tmp_path, "awaytune")
    seen: dict[str, object] = {}
    with p:
        assert wait_for(lambda: bool(_agent_journals("awaytune")), 90)
        journal = _agent_journals("awaytune")[0]
        seen["value"] = SWAPPINESS.read_text().strip()
        seen["owner"] = json.loads(journal.read_text())["owner"]["pid"]
        seen["agent"] = agent_in(fleet.ns(1))
        out, err = p.communicate(timeout=180)
    assert p.returncode == 0, err
    # during the phase the setting was the phase's, and the journal on the host belonged to its agent
    assert seen["value"] == new and seen["owner"] == seen["agent"], seen
    run = json.loads((tmp_path / "awaytune" / "run.json").read_text())
    assert run["tunings"] == [
        {"rep": 1, "phase": "tuned", "host": "h1", "changes": [{"tuning": "phases.0.tunings.0 (write)", "path": str(SWAPPINESS), "old": was, "new": new}]}
    ], run["tunings"]
    # given back at the phase's end, and no journal is left
    assert SWAPPINESS.read_text().strip() == was and _agent_journals("awaytune") == []
    assert wait_for(lambda: leftovers("awaytune") == [], 15), leftovers("awaytune")


def test_a_killed_agents_tunings_are_given_back_by_cleanup_on_its_host(fleet: Fleet, tmp_path: Path, cli: Cli, lab: None) -> None:
    was, new, p = _start_swappiness_run(fleet, tmp_path, "killtune", "on_host_failure: stop\n")
    try:
        with p:
            assert wait_for(lambda: bool(_agent_journals("killtune")), 90)
            pid = agent_in(fleet.ns(1))
            assert pid is not None
            os.kill(pid, signal.SIGKILL)
            _, err = p.communicate(timeout=180)
        assert p.returncode == 1, err
        assert "the agent on h1 died" in err, err
        # the agent could not give the setting back; its journal, whose owner is gone, is there for cleanup
        assert SWAPPINESS.read_text().strip() == new and len(_agent_journals("killtune")) == 1
        r = cli("cleanup")
        assert r.returncode == 0, r.stderr
        assert "killtune.agent" in r.stdout and f"restored {SWAPPINESS} to {was!r}" in r.stdout, r.stdout
        assert SWAPPINESS.read_text().strip() == was and _agent_journals("killtune") == []
    finally:
        SWAPPINESS.write_text(was + "\n")


def test_a_tuning_another_kernel_cannot_make_fails_the_run_naming_its_host_before_any_phase(fleet: Fleet, tmp_path: Path, lab: None) -> None:
    spec = _tuned_spec(fleet, tmp_path, "badtune", "{kind: irq, irq: 99999, cpus: [0]}")
    r = subprocess.run(
        [str(BIN), "run", str(spec), "--run-dir", "badtune"], cwd=tmp_path, capture_output=True, text=True, env={**os.environ, **APART}, timeout=180
    )
    assert r.returncode == 1, r.stderr
    assert "tunings host h1's kernel cannot make" in r.stderr and "99999" in r.stderr, r.stderr
    run = json.loads((tmp_path / "badtune" / "run.json").read_text())
    assert run["failed"]["host"] == "h1" and run["failed"]["component"] == "tunings" and not run["steps"], run["failed"]
    assert wait_for(lambda: leftovers("badtune") == [], 15), leftovers("badtune")
