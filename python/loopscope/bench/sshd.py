"""A real OpenSSH server on this machine, for the ssh host kind to be tested
and measured against: sshd in a network namespace of its own
(``lsf<pid>-ssh``, at ``ADDRESS`` over a veth from this machine's own
network), with a host key, a client key and known-hosts files made for it, so
every part of an ssh host's path is real (asyncssh, host-key checking, the
remote agent, SFTP). sshd dies with the process that started it
(``PR_SET_PDEATHSIG``); leaving the ``with`` block stops it and deletes its
namespace, and ``loopscope cleanup`` deletes a killed bench's
(``lab.netns.leftover_fleets``)."""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import time
from collections.abc import Iterator
from contextlib import contextmanager
from dataclasses import dataclass
from pathlib import Path

from loopscope.errors import RunError
from loopscope.lineage import die_with_parent

SSHD = "/usr/sbin/sshd"
ADDRESS, PEER, PORT = "10.79.0.2", "10.79.0.1", 2222


@dataclass
class Sshd:
    address: str
    port: int
    #: the client's private key, and known-hosts files with the server's key and with another key
    key: Path
    known_hosts: Path
    other_known_hosts: Path

    def host(self, name: str = "remote", **over: str) -> str:
        """An experiment file's ``hosts:`` entry for this server (one line, flow style)."""
        fields = {
            "name": name,
            "kind": "ssh",
            "address": self.address,
            "port": str(self.port),
            "user": "root",
            "identity": str(self.key),
            "known_hosts": str(self.known_hosts),
            "python": sys.executable,
        }
        fields.update(over)
        return "  - {" + ", ".join(f"{k}: {v}" for k, v in fields.items()) + "}\n"


def missing() -> str | None:
    """Why no server can be started here (None: it can)."""
    if not Path(SSHD).exists():
        return "needs the OpenSSH server (Debian: openssh-server; scripts/install-deps.sh installs it as root)"
    if os.geteuid() != 0:
        return "needs root (a network namespace and sshd's privilege separation)"
    return None


def _sh(*args: str) -> None:
    r = subprocess.run(list(args), capture_output=True, text=True)
    if r.returncode != 0:
        raise RunError(f"{' '.join(args)} failed: {r.stderr.strip()}", component="bench")


def _listening(ns: str) -> bool:
    return f"{ADDRESS}:{PORT}" in subprocess.run(["ip", "netns", "exec", ns, "ss", "-ltn"], capture_output=True, text=True).stdout


@contextmanager
def served(d: Path, tag: str | None = None) -> Iterator[Sshd]:
    """sshd in its namespace, its keys and configuration in ``d``, until the block ends."""
    why = missing()
    if why:
        raise RunError(f"an ssh server for the bench {why}", component="bench")
    tag = tag or f"lsf{os.getpid()}"
    ns, veth = f"{tag}-ssh", f"{tag}s"
    for name in ("host_key", "client_key", "other_key"):
        (d / name).unlink(missing_ok=True)
        _sh("ssh-keygen", "-q", "-t", "ed25519", "-N", "", "-f", str(d / name))
    (d / "authorized_keys").write_text((d / "client_key.pub").read_text())
    (d / "known_hosts").write_text(f"[{ADDRESS}]:{PORT} {(d / 'host_key.pub').read_text()}")
    (d / "other_known_hosts").write_text(f"[{ADDRESS}]:{PORT} {(d / 'other_key.pub').read_text()}")
    (d / "sshd_config").write_text(
        f"Port {PORT}\nListenAddress {ADDRESS}\nHostKey {d / 'host_key'}\nPidFile {d / 'sshd.pid'}\n"
        f"AuthorizedKeysFile {d / 'authorized_keys'}\nPermitRootLogin prohibit-password\nPasswordAuthentication no\n"
        "KbdInteractiveAuthentication no\nUsePAM no\nStrictModes no\nSubsystem sftp internal-sftp\n"
    )
    Path("/run/sshd").mkdir(exist_ok=True)
    _sh("ip", "netns", "add", ns)
    p = None
    me = os.getpid()
    log = open(d / "sshd.log", "wb")
    try:
        _sh("ip", "link", "add", veth, "type", "veth", "peer", "name", "eth0", "netns", ns)
        _sh("ip", "address", "add", f"{PEER}/24", "dev", veth)
        _sh("ip", "link", "set", veth, "up")
        _sh("ip", "-n", ns, "address", "add", f"{ADDRESS}/24", "dev", "eth0")
        _sh("ip", "-n", ns, "link", "set", "eth0", "up")
        _sh("ip", "-n", ns, "link", "set", "lo", "up")
        p = subprocess.Popen(
            ["ip", "netns", "exec", ns, SSHD, "-D", "-e", "-f", str(d / "sshd_config")],
            stderr=log,
            preexec_fn=lambda: None if die_with_parent(signal.SIGTERM, me) else os._exit(1),  # noqa: PLW1509 - no threads are started between fork and exec
        )
        deadline = time.monotonic() + 10
        while not _listening(ns):
            if time.monotonic() > deadline or p.poll() is not None:
                raise RunError(f"sshd did not listen on {ADDRESS}:{PORT}: {(d / 'sshd.log').read_text()[-400:]}", component="bench")
            time.sleep(0.05)
        yield Sshd(ADDRESS, PORT, d / "client_key", d / "known_hosts", d / "other_known_hosts")
    finally:
        if p is not None:
            p.terminate()
            p.wait(timeout=10)
        subprocess.run(["ip", "link", "del", veth], capture_output=True)
        subprocess.run(["ip", "netns", "del", ns], capture_output=True)
        log.close()
