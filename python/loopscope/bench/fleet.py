"""A fleet of machines on this one: network namespaces on one switch.

What the exec host kind is tested and measured against when no cluster is at
hand: ``n`` namespaces ``lsf<pid>-h<i>`` (address ``10.76.<i // 250>.<i % 250 + 1>/16``
on ``eth0``), each a veth into a bridge in a switch namespace
``lsf<pid>-sw``, so the hosts reach one another and nothing of this
machine's own network changes. They are not a run's (loopscope's runs
build ``ls-…`` namespaces of their own): the fleet is what a user would
already have, reached through ``ip netns exec`` or ``nsenter`` as the
launcher, or through a Slurm daemon started inside each namespace. Leaving
the ``with`` block deletes them all (``loopscope cleanup`` deletes those of a
killed bench or test: ``lab.netns.leftover_fleets``), veths and bridge with them (the veth
into this machine's own network, ``attach=True``, goes with the switch).
"""

from __future__ import annotations

import os
import subprocess
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path


def _batch(cmds: list[str], ns: str | None = None) -> None:
    r = subprocess.run(["ip", *(["-n", ns] if ns else []), "-batch", "-"], input="".join(c + "\n" for c in cmds), capture_output=True, text=True, timeout=60)
    if r.returncode != 0:
        raise RuntimeError(f"ip -batch failed: {r.stderr.strip()}")


#: this machine's own address on the fleet's switch, when attached (``attach=True``)
ROOT_ADDRESS = "10.76.255.254"


#: the launchers that reach a fleet host's namespace, by name
NS_LAUNCHERS: dict[str, Callable[[str], list[str]]] = {
    "netns": lambda ns: ["ip", "netns", "exec", ns],
    "nsenter": lambda ns: ["nsenter", f"--net=/run/netns/{ns}"],
}


@dataclass
class Fleet:
    n: int
    #: also put this machine's own network on the switch (at ``ROOT_ADDRESS``): what a
    #: cluster's daemons on this machine (slurmctld, srun) need to reach the hosts
    attach: bool = False
    tag: str = field(default_factory=lambda: f"lsf{os.getpid()}")

    @property
    def switch(self) -> str:
        return f"{self.tag}-sw"

    def ns(self, i: int) -> str:
        """Host ``i``'s namespace (1-based)."""
        return f"{self.tag}-h{i}"

    def address(self, i: int) -> str:
        return f"10.76.{i // 250}.{i % 250 + 1}"

    @property
    def namespaces(self) -> list[str]:
        return [self.switch, *(self.ns(i) for i in range(1, self.n + 1))]

    def up(self) -> "Fleet":
        sw = ["link add br0 type bridge", "link set br0 up"]
        for i in range(1, self.n + 1):
            sw += [f"link add p{i} type veth peer name eth0 netns {self.ns(i)}", f"link set p{i} master br0", f"link set p{i} up"]
        try:
            _batch([f"netns add {n}" for n in self.namespaces])
            _batch(sw, self.switch)
            for i in range(1, self.n + 1):
                _batch([f"address add {self.address(i)}/16 dev eth0", "link set eth0 up", "link set lo up"], self.ns(i))
            if self.attach:
                _batch(
                    [
                        f"link add {self.tag}r type veth peer name up0 netns {self.switch}",
                        f"address add {ROOT_ADDRESS}/16 dev {self.tag}r",
                        f"link set {self.tag}r up",
                    ]
                )
                _batch(["link set up0 master br0", "link set up0 up"], self.switch)
        except BaseException:
            self.down()
            raise
        return self

    def down(self) -> None:
        present = set(os.listdir("/run/netns")) if os.path.isdir("/run/netns") else set()
        gone = [n for n in self.namespaces if n in present]
        if gone:
            subprocess.run(["ip", "-batch", "-", "-force"], input="".join(f"netns delete {n}\n" for n in gone), capture_output=True, text=True, timeout=60)

    def __enter__(self) -> "Fleet":
        return self.up()

    def __exit__(self, *exc: object) -> None:
        self.down()

    def hosts_yaml(self, launcher: str = "netns", names: str = "h{i}") -> str:
        """The experiment file's ``hosts:`` for the fleet, each an exec host
        through ``ip netns exec`` (``launcher="netns"``) or ``nsenter``."""
        out = ["hosts:"]
        for i in range(1, self.n + 1):
            cmd = "[" + ", ".join(NS_LAUNCHERS[launcher](self.ns(i))) + "]"
            out.append(f"  - {{name: {names.format(i=i)}, kind: exec, launcher: {cmd}, address: {self.address(i)}}}")
        return "\n".join(out) + "\n"


def agent_in(ns: str) -> int | None:
    """The loopscope agent running in namespace ``ns`` (None: none): what a
    bench or a test kills to lose a host."""
    ino = os.stat(f"/run/netns/{ns}").st_ino
    for d in Path("/proc").iterdir():
        if not d.name.isdigit():
            continue
        try:
            if b"loopscope.agent" in (d / "cmdline").read_bytes() and os.stat(d / "ns" / "net").st_ino == ino:
                return int(d.name)
        except OSError:
            pass
    return None
