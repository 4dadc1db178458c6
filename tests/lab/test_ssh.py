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
import sys
import time
from contextlib import contextmanager
from dataclasses import dataclass
from pathlib import Path
from typing import Iterator

import pytest

from loopscope.host import procs
from tests.conftest import BIN, Cli
from tests.lab.test_multihost import leftovers
from tests.lab.test_run import wait_for

SSHD = "/usr/sbin/sshd"
pytestmark = [pytest.mark.needs_root, pytest.mark.needs_tool("ip", "ssh-keygen")]


@dataclass
class Sshd:
    address: str
    port: int
    key: Path
    known_hosts: Path
    other_known_hosts: Path


def _sh(*args: str) -> None:
    subprocess.run(list(args), check=True, capture_output=True, text=True)


@pytest.fixture(scope="module")
def sshd(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Sshd]:
    with served(tmp_path_factory.mktemp("sshd")) as s:
        yield s


@contextmanager
def served(d: Path) -> Iterator[Sshd]:
    """A real sshd in a namespace of its own, its keys and known hosts in ``d``, until the block ends."""
    if not Path(SSHD).exists():
        pytest.skip("needs the OpenSSH server (Debian: openssh-server; scripts/install-deps.sh installs it as root)")
    ns, veth, addr, port = f"lstest-ssh-{os.getpid()}", f"lsst{os.getpid() % 100000}", "10.79.0.2", 2222
    for name, kind in (("host_key", "ed25519"), ("client_key", "ed25519"), ("other_key", "ed25519")):
        _sh("ssh-keygen", "-q", "-t", kind, "-N", "", "-f", str(d / name))
    (d / "authorized_keys").write_text((d / "client_key.pub").read_text())
    (d / "known_hosts").write_text(f"[{addr}]:{port} {(d / 'host_key.pub').read_text()}")
    (d / "other_known_hosts").write_text(f"[{addr}]:{port} {(d / 'other_key.pub').read_text()}")
    (d / "sshd_config").write_text(
        f"Port {port}\nListenAddress {addr}\nHostKey {d / 'host_key'}\nPidFile {d / 'sshd.pid'}\n"
        f"AuthorizedKeysFile {d / 'authorized_keys'}\nPermitRootLogin prohibit-password\nPasswordAuthentication no\n"
        "KbdInteractiveAuthentication no\nUsePAM no\nStrictModes no\nSubsystem sftp internal-sftp\n"
    )
    Path("/run/sshd").mkdir(exist_ok=True)
    _sh("ip", "netns", "add", ns)
    p = None
    log = open(d / "sshd.log", "wb")
    try:
        _sh("ip", "link", "add", veth, "type", "veth", "peer", "name", "eth0", "netns", ns)
        _sh("ip", "address", "add", "10.79.0.1/24", "dev", veth)
        _sh("ip", "link", "set", veth, "up")
        _sh("ip", "-n", ns, "address", "add", f"{addr}/24", "dev", "eth0")
        _sh("ip", "-n", ns, "link", "set", "eth0", "up")
        _sh("ip", "-n", ns, "link", "set", "lo", "up")
        p = subprocess.Popen(["ip", "netns", "exec", ns, SSHD, "-D", "-e", "-f", str(d / "sshd_config")], stderr=log)
        assert wait_for(
            lambda: subprocess.run(["ip", "netns", "exec", ns, "ss", "-ltn"], capture_output=True, text=True).stdout.count(f"{addr}:{port}") > 0, 10
        ), (d / "sshd.log").read_text()
        yield Sshd(addr, port, d / "client_key", d / "known_hosts", d / "other_known_hosts")
    finally:
        if p is not None:
            p.terminate()
            p.wait(timeout=10)
        subprocess.run(["ip", "link", "del", veth], capture_output=True)
        subprocess.run(["ip", "netns", "del", ns], capture_output=True)
        log.close()


def ssh_host(s: Sshd, name: str = "remote", **over: str) -> str:
    fields = {
        "name": name,
        "kind": "ssh",
        "address": s.address,
        "port": str(s.port),
        "user": "root",
        "identity": str(s.key),
        "known_hosts": str(s.known_hosts),
        "python": sys.executable,
    }
    fields.update(over)
    return "  - {" + ", ".join(f"{k}: {v}" for k, v in fields.items()) + "}\n"


def test_a_run_on_an_ssh_host_brings_its_files_home(sshd: Sshd, tmp_path: Path, cli: Cli, lab: None) -> None:
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


def test_a_remote_agent_killed_mid_run_fails_the_run_cleanly(sshd: Sshd, tmp_path: Path, lab: None) -> None:
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
