"""`loopscope hosts install` against hosts that see a root of their own: each
host is a network namespace of the fleet whose processes run chrooted in a
directory of their own (this machine's /usr and /etc bound read-only, a
/root, /tmp and /run of its own; no /work, so no loopscope), in a mount
namespace of its own. One host runs a real OpenSSH server there (the ssh
kind); the other is reached through a launcher that enters the same kind of
root (the exec kind). Nothing of loopscope is on either until `hosts install`
puts this controller's build there; the hosts reach no package index."""

from __future__ import annotations

import json
import os
import pwd
import shutil
import subprocess
import sys
from dataclasses import dataclass
from pathlib import Path
from typing import Iterator

import pytest

from loopscope.bench.fleet import Fleet
from loopscope.lab import launch, provision
from tests.conftest import BIN, Cli
from tests.lab.test_multihost import leftovers
from tests.lab.test_run import wait_for

SSHD = "/usr/sbin/sshd"
#: root's home as the hosts see it (their /etc is this machine's), relative to a host's root
HOME = pwd.getpwuid(0).pw_dir.lstrip("/")
pytestmark = [pytest.mark.needs_root, pytest.mark.needs_tool("ip", "nsenter", "unshare", "chroot", "ssh-keygen")]

ENTER = r"""#!/bin/sh
# enter-root ROOT NETNS CMD...: CMD chrooted in ROOT, in NETNS, in a mount namespace of its own
R=$1; NS=$2; shift 2
exec nsenter --net=/run/netns/"$NS" unshare --mount --propagation private sh -c '
  R=$0; shift 0
  mount --bind /usr "$R/usr" && mount -o remount,bind,ro "$R/usr" &&
  mount --bind /etc "$R/etc" && mount -o remount,bind,ro "$R/etc" &&
  mount --rbind /dev "$R/dev" && mount -t proc proc "$R/proc" && mount --rbind /sys "$R/sys" || exit 111
  exec chroot "$R" "$@"' "$R" "$@"
"""


@dataclass
class Rooted:
    fleet: Fleet
    roots: list[Path]
    enter: Path
    key: Path
    known_hosts: Path

    def ssh_host(self, name: str = "ssh1") -> str:
        return (
            f"  - {{name: {name}, kind: ssh, address: {self.fleet.address(1)}, port: 2222, user: root, identity: {self.key}, "
            f"known_hosts: {self.known_hosts}}}\n"
        )

    def exec_host(self, name: str = "exec2") -> str:
        return f"  - {{name: {name}, kind: exec, launcher: [sh, {self.enter}, {self.roots[1]}, {self.fleet.ns(2)}], address: {self.fleet.address(2)}}}\n"


def _root(d: Path) -> Path:
    for sub in ("usr", "etc", "dev", "proc", "sys", "root", "run/sshd", "var/tmp", "srv"):
        (d / sub).mkdir(parents=True, exist_ok=True)
    (d / "tmp").mkdir(mode=0o1777, exist_ok=True)
    os.chmod(d / "tmp", 0o1777)
    for link in ("bin", "lib", "lib64", "sbin"):
        if Path("/", link).is_symlink():
            os.symlink(os.readlink(Path("/", link)), d / link)
    return d


@pytest.fixture(scope="module")
def rooted(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Rooted]:
    if not Path(SSHD).exists():
        pytest.skip("needs the OpenSSH server (Debian: openssh-server; scripts/install-deps.sh installs it as root)")
    d = tmp_path_factory.mktemp("rooted")
    enter = d / "enter-root"
    enter.write_text(ENTER)
    roots = [_root(d / "root1"), _root(d / "root2")]
    for name in ("host_key", "client_key"):
        subprocess.run(["ssh-keygen", "-q", "-t", "ed25519", "-N", "", "-f", str(d / name)], check=True)
    srv = roots[0] / "srv"
    shutil.copy(d / "host_key", srv / "host_key")
    (srv / "authorized_keys").write_text((d / "client_key.pub").read_text())
    (srv / "sshd_config").write_text(
        "Port 2222\nHostKey /srv/host_key\nPidFile /run/sshd.pid\nAuthorizedKeysFile /srv/authorized_keys\nPermitRootLogin prohibit-password\n"
        "PasswordAuthentication no\nKbdInteractiveAuthentication no\nUsePAM no\nStrictModes no\nSubsystem sftp internal-sftp\n"
    )
    p = None
    with Fleet(2, attach=True) as f:  # this machine reaches the ssh host over the fleet's switch
        (d / "known_hosts").write_text(f"[{f.address(1)}]:2222 {(d / 'host_key.pub').read_text()}")
        log = open(d / "sshd.log", "wb")
        try:
            p = subprocess.Popen(["sh", str(enter), str(roots[0]), f.ns(1), SSHD, "-D", "-e", "-f", "/srv/sshd_config"], stderr=log, start_new_session=True)
            assert wait_for(
                lambda: (
                    ":2222 " in subprocess.run(["nsenter", f"--net=/run/netns/{f.ns(1)}", "ss", "-ltn"], capture_output=True, text=True).stdout
                    or p.poll() is not None
                ),
                15,
            )
            assert p.poll() is None, (d / "sshd.log").read_text()
            yield Rooted(f, roots, enter, d / "client_key", d / "known_hosts")
        finally:
            if p is not None and p.poll() is None:
                p.terminate()  # sshd makes a session of its own: signalled by its pid
                p.wait(timeout=10)
            log.close()


def test_hosts_without_loopscope_are_refused_then_installed_then_run_the_controllers_build(rooted: Rooted, tmp_path: Path, cli: Cli, lab: None) -> None:
    # (alone: beside the other tests its ssh host's preflight twice said something other than "not installed")
    spec = tmp_path / "fleet.yaml"
    spec.write_text(
        "name: fleet\nhosts:\n"
        + rooted.ssh_host()
        + rooted.exec_host()
        + "probes:\n  - {kind: timer, host: ssh1, interval_us: 2000}\n  - {kind: rr, host: exec2, dest: ssh1, rate: 200pps}\nduration: 400ms\nbaseline: true\n"
    )
    assert not (rooted.roots[0] / "work").exists()
    r = cli("run", str(spec))
    assert r.returncode == 2, r.stderr
    assert "host ssh1: loopscope is not installed" in r.stderr and "host exec2: the launcher" in r.stderr and "loopscope hosts install" in r.stderr

    r = cli("hosts", "install", str(spec), "--json", timeout=900)
    assert r.returncode == 0, r.stderr
    got = json.loads(r.stdout)
    assert {h["host"]: h["outcome"] for h in got["hosts"]} == {"ssh1": "installed", "exec2": "installed"}, got
    for root in rooted.roots:
        mark = json.loads((root / HOME / ".local" / "share" / "loopscope" / launch.version() / "loopscope-install.json").read_text())
        assert mark["version"] == launch.version() and mark["identity"] == got["build"]
        assert not list((root / HOME / ".local" / "share" / "loopscope").glob("*.partial"))
    # the same build again: left alone
    r = cli("hosts", "install", str(spec), "--json", timeout=600)
    assert r.returncode == 0 and {h["outcome"] for h in json.loads(r.stdout)["hosts"]} == {"current"}, r.stdout

    r = cli("run", str(spec), "--run-dir", "provrun", "--no-report", timeout=300)
    assert r.returncode == 0, r.stderr
    prov = json.loads((tmp_path / "provrun" / "provenance.json").read_text())
    for h in ("ssh1", "exec2"):
        # root's home as the hosts' own /etc/passwd says (this machine's, bound read-only)
        assert prov["hosts"][h]["executable"] == f"{pwd.getpwuid(0).pw_dir}/.local/share/loopscope/{launch.version()}/bin/python"
    assert (tmp_path / "provrun" / "hosts" / "exec2" / "steps" / "r01-baseline" / "rr.lstrace").stat().st_size > 0
    assert wait_for(lambda: leftovers("provrun") == [], 15), leftovers("provrun")


def test_a_host_whose_loopscope_is_another_version_is_refused_naming_both(rooted: Rooted, tmp_path: Path, cli: Cli, lab: None, beside: None) -> None:
    spec = tmp_path / "v.yaml"
    spec.write_text("name: v\nhosts:\n" + rooted.exec_host() + "probes:\n  - {kind: timer, host: exec2}\nduration: 300ms\n")
    r = cli("hosts", "install", str(spec), timeout=900)
    assert r.returncode == 0, r.stderr
    site = rooted.roots[1] / HOME / ".local" / "share" / "loopscope" / launch.version() / "lib"
    meta = next(site.glob(f"python*/site-packages/loopscope-{launch.version()}.dist-info/METADATA"))
    text = meta.read_text()
    try:
        meta.write_text(text.replace(f"Version: {launch.version()}", "Version: 0.0.1", 1))
        r = cli("run", str(spec))
        assert r.returncode == 2, r.stderr
        assert "host exec2: its loopscope is 0.0.1" in r.stderr and f"this controller's is {launch.version()}" in r.stderr
    finally:
        meta.write_text(text)


def test_a_host_that_cannot_be_reached_is_named_by_hosts_install_and_two_installs_at_once_take_turns(tmp_path: Path, lab: None) -> None:
    # (alone: its two wheel builds are load the beside tier's preflights met)
    # (two at once once removed each other's freshly built wheel: the second now waits for the first)
    spec = tmp_path / "x.yaml"
    spec.write_text(
        "name: x\nhosts:\n  - {name: gone, kind: exec, launcher: [sh, -c, 'echo node gone is down >&2; exit 7', x], address: 10.9.9.9}\n"
        "probes:\n  - {kind: timer}\nduration: 1s\n"
    )
    both = [
        subprocess.Popen([str(BIN), "hosts", "install", str(spec)], cwd=tmp_path, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True) for _ in range(2)
    ]
    said = [p.communicate(timeout=900) for p in both]
    for p, (_, err) in zip(both, said):
        assert p.returncode == 1, err
        assert "host gone: failed: exit code 7" in err and "node gone is down" in err, err
    # (each builds the wheel for seconds: the one that came second waited, and said so; beside
    # another test's install, both may have)
    assert any("waiting for another hosts install to finish" in err for _, err in said), said


def test_the_bootstrap_refuses_a_python_that_does_not_match_the_wheels(tmp_path: Path) -> None:
    import io
    import tarfile

    buf = io.BytesIO()
    with tarfile.open(fileobj=buf, mode="w") as t:
        data = json.dumps({"version": "0.1.0", "identity": "x", "python": "3.99", "machine": "x86_64", "installer": "wheels/none.whl"}).encode()
        info = tarfile.TarInfo("manifest.json")
        info.size = len(data)
        t.addfile(info, io.BytesIO(data))
    r = subprocess.run([sys.executable, "-c", provision.BOOTSTRAP, str(tmp_path / "inst")], input=buf.getvalue(), capture_output=True)
    out = r.stdout.decode()
    assert r.returncode == 3 and out.startswith(provision.REFUSED) and "wheels are for Python 3.99" in out
    assert not list((tmp_path / "inst").glob(".incoming-*"))
