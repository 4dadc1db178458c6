"""The ssh host kind against a real OpenSSH server: sshd runs in a network
namespace of its own (its own address, reached over a veth), with a host key
and a client key made for the test, so every part of the path is real:
asyncssh, host-key checking against a known_hosts file, the remote agent,
SFTP for the files."""

from __future__ import annotations

import json
import os
import shutil
import signal
import subprocess
import time
from pathlib import Path
from typing import Iterator

import pytest

from loopscope.bench.sshd import Sshd, missing, served
from loopscope.host import procs
from tests.conftest import BIN, Cli
from tests.lab.test_multihost import leftovers
from tests.lab.test_run import wait_for

pytestmark = [pytest.mark.needs_root, pytest.mark.needs_tool("ip", "ssh-keygen")]


@pytest.fixture(scope="module")
def sshd(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Sshd]:
    yield from serve_for_tests(tmp_path_factory)


def serve_for_tests(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Sshd]:
    """A module's sshd (``bench/sshd.py``), or the test skipped saying why there is none."""
    why = missing()
    if why:
        pytest.skip(why)
    with served(tmp_path_factory.mktemp("sshd")) as s:
        yield s


def ssh_host(s: Sshd, name: str = "remote", **over: str) -> str:
    return s.host(name, **over)


def test_a_run_on_an_ssh_host_brings_its_files_home(sshd: Sshd, tmp_path: Path, cli: Cli, lab: None, beside: None) -> None:
    spec = tmp_path / "ssh.yaml"
    spec.write_text(
        "name: ssh\nhosts:\n  - {name: here, kind: local}\n"
        + ssh_host(sshd)
        + "probes:\n  - {kind: timer, name: timer, host: remote, interval_us: 2000}\n  - {kind: timer, name: local-timer, host: here, interval_us: 2000}\n"
        "loads:\n  - {kind: cpu, host: remote}\nduration: 500ms\n"
    )
    r = cli("run", str(spec), "--run-dir", "sshrun", timeout=240)
    assert r.returncode == 0, r.stderr
    run = json.loads((tmp_path / "sshrun" / "run.json").read_text())
    assert run["hosts"] == {"here": "local", "remote": "ssh"}
    for phase in ("baseline", "cpu-1"):
        assert (tmp_path / "sshrun" / "hosts" / "remote" / "steps" / f"r01-{phase}" / "timer.lstrace").stat().st_size > 0
        assert (tmp_path / "sshrun" / "hosts" / "here" / "steps" / f"r01-{phase}" / "local-timer.lstrace").exists()
    assert (tmp_path / "sshrun" / "hosts" / "remote" / "agent.log").exists()
    prov = json.loads((tmp_path / "sshrun" / "provenance.json").read_text())
    assert prov["lab"]["hosts"]["remote"]["kind"] == "ssh" and "remote" in prov["hosts"]
    assert "timer latency" in r.stdout
    # The remote working directory is gone once its files are fetched.
    assert not (Path("/tmp/loopscope-runs") / "sshrun").exists()
    assert wait_for(lambda: leftovers("sshrun") == [], 15), leftovers("sshrun")


def test_a_host_key_that_does_not_match_is_refused_at_preflight(sshd: Sshd, tmp_path: Path, cli: Cli, lab: None) -> None:
    spec = tmp_path / "k.yaml"
    spec.write_text("name: k\nhosts:\n" + ssh_host(sshd, known_hosts=str(sshd.other_known_hosts)) + "probes:\n  - {kind: timer}\nduration: 1s\n")
    r = cli("run", str(spec))
    assert r.returncode == 2, r.stderr
    assert "host remote: its host key does not match" in r.stderr and str(sshd.other_known_hosts) in r.stderr


def test_an_unreachable_ssh_host_is_refused_at_preflight(sshd: Sshd, tmp_path: Path, cli: Cli, lab: None) -> None:
    spec = tmp_path / "u.yaml"
    spec.write_text("name: u\nhosts:\n" + ssh_host(sshd, port="2299") + "probes:\n  - {kind: timer}\nduration: 1s\n")
    r = cli("run", str(spec))
    assert r.returncode == 2, r.stderr
    assert f"host remote: cannot reach {sshd.address}:2299" in r.stderr


def test_a_remote_without_loopscope_is_refused_at_preflight(sshd: Sshd, tmp_path: Path, cli: Cli, lab: None) -> None:
    bare = shutil.which("python3", path="/usr/bin:/bin")
    assert bare
    spec = tmp_path / "n.yaml"
    spec.write_text("name: n\nhosts:\n" + ssh_host(sshd, python=bare) + "probes:\n  - {kind: timer}\nduration: 1s\n")
    r = cli("run", str(spec))
    assert r.returncode == 2, r.stderr
    assert f"loopscope is not installed for {bare}" in r.stderr


def test_a_remote_agent_killed_mid_run_fails_the_run_cleanly(sshd: Sshd, tmp_path: Path, lab: None, beside: None) -> None:
    spec = tmp_path / "kill.yaml"
    spec.write_text(
        "name: kill\nhosts:\n" + ssh_host(sshd) + "probes:\n  - {kind: timer, interval_us: 2000}\nloads:\n  - {kind: cpu}\nduration: 20s\nbaseline: false\n"
    )
    with subprocess.Popen(
        [str(BIN), "run", str(spec), "--run-dir", "sshkill", "--no-report"], cwd=tmp_path, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True
    ) as p:

        def agent() -> int | None:
            for pid in procs.pids_of_run("sshkill"):
                try:
                    if b"loopscope.agent" in Path(f"/proc/{pid}/cmdline").read_bytes():
                        return pid
                except OSError:
                    pass
            return None

        assert wait_for(
            lambda: any(b"loads.worker" in Path(f"/proc/{q}/cmdline").read_bytes() for q in procs.pids_of_run("sshkill") if Path(f"/proc/{q}").exists()), 60
        )
        pid = agent()
        assert pid is not None
        os.kill(pid, signal.SIGKILL)
        out, err = p.communicate(timeout=60)
    assert p.returncode == 1, err
    assert "the agent on remote died" in err
    assert json.loads((tmp_path / "sshkill" / "run.json").read_text())["failed"]["host"] == "remote"
    time.sleep(0.5)
    assert wait_for(lambda: leftovers("sshkill") == [], 20), leftovers("sshkill")


def test_an_exec_host_and_an_ssh_host_on_kernels_of_their_own_are_each_tuned_through_their_agent_and_given_back(sshd: Sshd, tmp_path: Path, lab: None) -> None:
    swap = Path("/proc/sys/vm/swappiness")
    was = swap.read_text().strip()
    new = "13" if was != "13" else "17"
    spec = tmp_path / "two.yaml"
    spec.write_text(
        "name: two\nhosts:\n  - {name: box, kind: exec, launcher: [unshare, --net], address: 10.77.0.1}\n"
        + ssh_host(sshd)
        + "probes:\n  - {kind: timer, name: t-box, host: box, interval_us: 2000}\n  - {kind: timer, name: t-remote, host: remote, interval_us: 2000}\n"
        f"phases:\n  - {{name: tuned, tunings: [{{kind: write, path: {swap}, value: {new}}}]}}\nduration: 500ms\nkernel: {{capture: off}}\nclocksync: {{enabled: off}}\n"
    )
    # (tests only: every ssh and exec host counts as a kernel of its own, so both tunings go through the agents)
    r = subprocess.run(
        [str(BIN), "run", str(spec), "--run-dir", "twotune", "--no-report"],
        cwd=tmp_path,
        capture_output=True,
        text=True,
        timeout=240,
        env={**os.environ, "LOOPSCOPE_APART_KERNELS": "1"},
    )
    assert r.returncode == 0, r.stderr
    tuned = json.loads((tmp_path / "twotune" / "run.json").read_text())["tunings"]
    # one entry per host, in the order the kernels were tuned: the second found the first's value
    assert [(t["host"], t["changes"][0]["old"], t["changes"][0]["new"]) for t in tuned] == [("box", was, new), ("remote", new, new)], tuned
    # given back in the reverse order: the machine reads as before
    assert swap.read_text().strip() == was
    assert wait_for(lambda: leftovers("twotune") == [], 20), leftovers("twotune")
