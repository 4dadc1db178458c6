"""A real Slurm cluster on this machine: one node per fleet namespace.

For the exec host kind's tests and ``loopscope bench fleet --launcher slurm``:
a munge daemon with a key of its own, ``slurmctld`` on this machine's
address on the fleet's switch, and one ``slurmd`` per namespace (entered
with ``nsenter --net``, so the node sees this machine's cgroups and
tracefs, as a real node would see its own), all from one ``slurm.conf``
written here (root as SlurmUser, Linux process tracking, no task plugin, its
own ports, every state, spool, pid and log file under one directory).
Leaving the ``with`` block stops every daemon (jobs first, with ``scancel``)
and removes the directory. Debian's slurm-wlm and munge packages are what
it needs; ``available()`` says why not when they are missing.
"""

from __future__ import annotations

import os
import shutil
import signal
import socket
import subprocess
import tempfile
import time
from dataclasses import dataclass, field
from pathlib import Path

from loopscope.bench.fleet import ROOT_ADDRESS, Fleet

PROGRAMS = ("munged", "mungekey", "slurmctld", "slurmd", "srun", "sinfo", "scancel")


def available() -> str | None:
    """None when a cluster can be started here; else why not."""
    missing = [p for p in PROGRAMS if shutil.which(p, path=os.environ.get("PATH", "") + ":/usr/sbin:/sbin") is None]
    if missing:
        return f"Slurm and munge are not installed ({', '.join(missing)} missing; Debian: apt-get install slurm-wlm munge)"
    if os.geteuid() != 0:
        return "a Slurm cluster of namespaces needs root"
    return None


def _which(p: str) -> str:
    return shutil.which(p, path=os.environ.get("PATH", "") + ":/usr/sbin:/sbin") or p


@dataclass
class Cluster:
    fleet: Fleet
    port: int = 16817
    dir: Path = field(default_factory=lambda: Path(tempfile.mkdtemp(prefix="lsslurm-")))
    procs: list[subprocess.Popen[bytes]] = field(default_factory=list)

    def node(self, i: int) -> str:
        return f"n{i}"

    @property
    def conf(self) -> Path:
        return self.dir / "slurm.conf"

    @property
    def env(self) -> dict[str, str]:
        return {**os.environ, "SLURM_CONF": str(self.conf)}

    def launcher(self, i: int) -> list[str]:
        """The exec launcher that reaches node ``i``."""
        return ["env", f"SLURM_CONF={self.conf}", "srun", f"--nodelist={self.node(i)}", "--ntasks=1", "--quiet", "--job-name=loopscope-agent"]

    def _write_conf(self) -> None:
        d = self.dir
        nodes = "\n".join(
            f"NodeName={self.node(i)} NodeAddr={self.fleet.address(i)} CPUs={os.cpu_count() or 1} State=UNKNOWN" for i in range(1, self.fleet.n + 1)
        )
        self.conf.write_text(f"""ClusterName=lsfleet
SlurmctldHost={socket.gethostname().split(".")[0]}({ROOT_ADDRESS})
SlurmUser=root
SlurmdUser=root
AuthType=auth/munge
CredType=cred/munge
AuthInfo=socket={d}/munge.sock
SlurmctldPort={self.port}
SlurmdPort={self.port + 1}
StateSaveLocation={d}/state
SlurmdSpoolDir={d}/spool-%n
SlurmctldPidFile={d}/slurmctld.pid
SlurmdPidFile={d}/slurmd-%n.pid
SlurmctldLogFile={d}/slurmctld.log
SlurmdLogFile={d}/slurmd-%n.log
ProctrackType=proctrack/linuxproc
TaskPlugin=task/none
SelectType=select/cons_tres
SelectTypeParameters=CR_CPU
MpiDefault=none
ReturnToService=2
SchedulerType=sched/builtin
JobCompType=jobcomp/none
AccountingStorageType=accounting_storage/none
SlurmdTimeout=30
InactiveLimit=0
KillWait=2
{nodes}
PartitionName=fleet Nodes=ALL Default=YES MaxTime=INFINITE State=UP OverSubscribe=FORCE:4
""")

    def up(self, timeout: float = 60.0) -> "Cluster":
        d = self.dir
        os.chmod(d, 0o755)  # munged wants its socket's directory searchable by all
        (d / "state").mkdir(parents=True, exist_ok=True)
        try:
            subprocess.run([_which("mungekey"), "--create", f"--keyfile={d}/munge.key"], check=True, capture_output=True)
            os.chmod(d / "munge.key", 0o600)
            self._start(
                [
                    _which("munged"),
                    "--foreground",
                    "--force",
                    f"--socket={d}/munge.sock",
                    f"--key-file={d}/munge.key",
                    f"--pid-file={d}/munged.pid",
                    f"--log-file={d}/munged.log",
                    f"--seed-file={d}/munge.seed",
                ],
                d / "munged.out",
            )
            self._wait(lambda: (d / "munge.sock").exists(), 10, "munged did not create its socket")
            self._write_conf()
            self._start([_which("slurmctld"), "-D", "-i", "-f", str(self.conf)], d / "slurmctld.out")
            for i in range(1, self.fleet.n + 1):
                self._start(
                    ["nsenter", f"--net=/run/netns/{self.fleet.ns(i)}", _which("slurmd"), "-D", "-N", self.node(i), "-f", str(self.conf)], d / f"slurmd-{i}.out"
                )
            self._wait(self._all_idle, timeout, "the nodes did not come up idle")
        except BaseException:
            self.down()
            raise
        return self

    def _start(self, argv: list[str], out: Path) -> None:
        with open(out, "wb") as f:
            self.procs.append(subprocess.Popen(argv, stdout=f, stderr=subprocess.STDOUT, env=self.env, start_new_session=True))

    def _all_idle(self) -> bool:
        for p in self.procs:
            if p.poll() is not None:
                raise RuntimeError(f"{p.args[0] if isinstance(p.args, list) else p.args!r} exited ({p.returncode}); logs in {self.dir}:\n{self.logs()}")
        r = subprocess.run([_which("sinfo"), "-h", "-N", "-o", "%N %t"], capture_output=True, text=True, env=self.env, timeout=10)
        states = dict(l.split() for l in r.stdout.splitlines() if len(l.split()) == 2)
        return len(states) == self.fleet.n and all(s == "idle" for s in states.values())

    def _wait(self, ok: object, timeout: float, what: str) -> None:
        end = time.monotonic() + timeout
        while time.monotonic() < end:
            if ok():  # type: ignore[operator]
                return
            time.sleep(0.2)
        raise RuntimeError(f"Slurm: {what} within {timeout:g} s; logs in {self.dir}:\n{self.logs()}")

    def logs(self, n: int = 6) -> str:
        out = []
        for f in sorted(self.dir.glob("*.log")) + sorted(self.dir.glob("*.out")):
            lines = [l for l in f.read_text(errors="replace").splitlines() if l.strip()][-n:]
            if lines:
                out.append(f"  {f.name}:\n" + "\n".join("    " + l for l in lines))
        return "\n".join(out)

    def down(self) -> None:
        if self.conf.exists():
            subprocess.run([_which("scancel"), "--full", "--partition=fleet"], capture_output=True, env=self.env, timeout=20)
        for p in reversed(self.procs):
            if p.poll() is None:
                try:
                    os.killpg(p.pid, signal.SIGTERM)
                except ProcessLookupError:
                    pass
        for p in reversed(self.procs):
            try:
                p.wait(timeout=10)
            except subprocess.TimeoutExpired:
                os.killpg(p.pid, signal.SIGKILL)
                p.wait()
        self.procs = []
        shutil.rmtree(self.dir, ignore_errors=True)

    def __enter__(self) -> "Cluster":
        return self.up()

    def __exit__(self, *exc: object) -> None:
        self.down()
