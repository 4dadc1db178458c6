"""Hosts as network namespaces on one machine, joined by a router namespace.

Topology (a star): every host gets a namespace ``ls-<tag>-<host>`` with one
interface ``eth0`` holding ``10.77.<i>.2/24`` and a default route through
``10.77.<i>.1``, the router's address on the other end of the veth pair
(``r<i>`` in ``ls-<tag>-router``). The router has IP forwarding off: packets
between hosts cross it only through the user-space emulator
(``loopscope netem``), which applies each link's delay, loss and so on, so
with no link configured the path is still the emulator's (an ideal link).
``tag`` is six hex digits derived from the run id: short enough for
interface names, unique enough for concurrent runs, and what ``loopscope
cleanup`` looks for.

The hosts' veth ends do not offload checksums or segmentation (the emulator
forwards frames as they are, and a frame with a checksum left for the NIC
would be dropped by the receiver), IPv6 is off (no router solicitations in
the measurements) and neighbours are permanent (no ARP on the first packet).
A host may have its own CLOCK_MONOTONIC offset: its agent is started in a
time namespace (``timens.py``), which shifts MONOTONIC and BOOTTIME but not
REALTIME, the clock of the kernel's packet timestamps.

Everything is done with ``ip -batch`` (iproute2), one invocation per
namespace, so four hosts come up in well under a second; ``down`` deletes
the namespaces, which deletes their veths with them.
"""

from __future__ import annotations

import hashlib
import ipaddress
import os
import shutil
import subprocess
from dataclasses import dataclass, field
from pathlib import Path

PREFIX = "ls-"
NET = "10.77"


def tag_of(run_id: str) -> str:
    return hashlib.sha256(run_id.encode()).hexdigest()[:6]


def ns_name(tag: str, host: str) -> str:
    return f"{PREFIX}{tag}-{host}"


@dataclass
class HostNet:
    name: str
    index: int
    ns: str
    address: str
    gateway: str
    ifname: str = "eth0"
    router_if: str = ""
    mac: str = ""
    router_mac: str = ""
    prefix: int = 24

    @property
    def net(self) -> str:
        return str(ipaddress.ip_network(f"{self.address}/{self.prefix}", strict=False).network_address)


@dataclass
class Topology:
    run_id: str
    hosts: list[HostNet]
    tag: str
    router_ns: str
    up_ns: int = 0
    created: list[str] = field(default_factory=list)

    @classmethod
    def plan(cls, run_id: str, names: list[str], addresses: dict[str, str] | None = None) -> Topology:
        """Addresses: 10.77.<i>.2/24 with the router at .1, or the given
        address in its /24 with the router at .1 (.254 if the host is .1);
        NetnsError when two hosts would share a subnet."""
        tag = tag_of(run_id)
        hosts = []
        nets: dict[str, str] = {}
        for i, h in enumerate(names, start=1):
            addr = (addresses or {}).get(h) or f"{NET}.{i}.2"
            head = addr.rsplit(".", 1)[0]
            gw = f"{head}.254" if addr.endswith(".1") else f"{head}.1"
            net = f"{head}.0/24"
            if net in nets:
                raise NetnsError(f"host {h}: address {addr} clashes with host {nets[net]}'s subnet {net} (each netns host has a /24 of its own)")
            nets[net] = h
            hosts.append(
                HostNet(
                    name=h,
                    index=i,
                    ns=ns_name(tag, h),
                    address=addr,
                    gateway=gw,
                    router_if=f"r{i}",
                    mac=f"02:4c:53:{i >> 8:02x}:{i & 0xFF:02x}:02",
                    router_mac=f"02:4c:53:{i >> 8:02x}:{i & 0xFF:02x}:01",
                )
            )
        return cls(run_id, hosts, tag, ns_name(tag, "router"))

    def host(self, name: str) -> HostNet:
        return next(h for h in self.hosts if h.name == name)

    @property
    def namespaces(self) -> list[str]:
        return [self.router_ns, *(h.ns for h in self.hosts)]

    # ---- up and down --------------------------------------------------------------

    def up(self) -> None:
        """Create everything; on any failure remove what was made and raise NetnsError."""
        try:
            self._up()
        except NetnsError:
            self.down()
            raise

    def _up(self) -> None:
        root = [f"netns add {n}" for n in self.namespaces]
        _batch(None, root)
        self.created = list(self.namespaces)
        links = [
            f"link add {h.ifname} netns {h.ns} address {h.mac} type veth peer name {h.router_if} netns {self.router_ns} address {h.router_mac}"
            for h in self.hosts
        ]
        _batch(None, links)
        router = ["link set lo up"]
        for h in self.hosts:
            router += [f"address add {h.gateway}/{h.prefix} dev {h.router_if}", f"link set {h.router_if} up"]
            router.append(f"neighbour replace {h.address} lladdr {h.mac} dev {h.router_if} nud permanent")
        _sysctl(self.router_ns, {"net.ipv4.ip_forward": "0", "net.ipv6.conf.all.disable_ipv6": "1", "net.ipv6.conf.default.disable_ipv6": "1"})
        _batch(self.router_ns, router)
        for h in self.hosts:
            _sysctl(h.ns, {"net.ipv6.conf.all.disable_ipv6": "1", "net.ipv6.conf.default.disable_ipv6": "1"})
            _batch(
                h.ns,
                [
                    "link set lo up",
                    f"address add {h.address}/{h.prefix} dev {h.ifname}",
                    f"link set {h.ifname} up",
                    f"route add default via {h.gateway} dev {h.ifname}",
                    f"neighbour replace {h.gateway} lladdr {h.router_mac} dev {h.ifname} nud permanent",
                ],
            )
            _no_offload(h.ns, h.ifname)

    def down(self) -> list[str]:
        """Delete the namespaces (and with them the veths); returns what was removed."""
        return delete_namespaces(self.namespaces)

    def link_down(self, host: str) -> None:
        """Take a host's interface down (failure injection)."""
        h = self.host(host)
        _batch(h.ns, [f"link set {h.ifname} down"])

    def emulator_config(self, links: list[dict[str, object]], seed: int, records: bool = True, priority: int = 0) -> dict[str, object]:
        idx = {h.name: i for i, h in enumerate(self.hosts)}
        ports = [
            {"host": h.name, "ifname": h.router_if, "host_mac": h.mac, "router_ip": h.gateway, "net": h.net, "prefix": h.prefix}
            for h in self.hosts
        ]
        ls = [{**l, "from": idx[str(l["from"])], "to": idx[str(l["to"])]} for l in links]
        return {"ports": ports, "links": ls, "seed": seed, "records": records, "priority": priority}

    def describe(self) -> dict[str, object]:
        return {
            "tag": self.tag,
            "router_ns": self.router_ns,
            "hosts": {h.name: {"ns": h.ns, "address": h.address, "gateway": h.gateway, "ifname": h.ifname, "mac": h.mac} for h in self.hosts},
        }


class NetnsError(Exception):
    """iproute2 refused something; the message says what."""


def ip_tool() -> str | None:
    return shutil.which("ip")


def _run(argv: list[str], stdin: str | None = None) -> None:
    try:
        r = subprocess.run(argv, input=stdin, capture_output=True, text=True, timeout=30)
    except FileNotFoundError:
        raise NetnsError(f"{argv[0]} is not installed (Debian: iproute2, ethtool)") from None
    if r.returncode != 0:
        raise NetnsError(f"{' '.join(argv)} failed: {(r.stderr or r.stdout).strip()}")


def _batch(ns: str | None, cmds: list[str]) -> None:
    argv = ["ip"] + (["-n", ns] if ns else []) + ["-batch", "-"]
    _run(argv, "\n".join(cmds) + "\n")


def _sysctl(ns: str, values: dict[str, str]) -> None:
    _run(["ip", "netns", "exec", ns, "sysctl", "-q", "-w", *(f"{k}={v}" for k, v in values.items())])


def _no_offload(ns: str, ifname: str) -> None:
    _run(["ip", "netns", "exec", ns, "ethtool", "-K", ifname, "tx", "off", "tso", "off", "gso", "off"])


def existing() -> list[str]:
    """loopscope's namespaces present now (``ip netns`` names starting ls-)."""
    try:
        names = os.listdir("/run/netns")
    except OSError:
        return []
    return sorted(n for n in names if n.startswith(PREFIX))


def delete_namespaces(names: list[str]) -> list[str]:
    present = set(existing())
    gone = [n for n in names if n in present]
    if gone:
        subprocess.run(["ip", "-batch", "-", "-force"], input="".join(f"netns delete {n}\n" for n in gone), capture_output=True, text=True, timeout=30)
    return gone


def privileges() -> str | None:
    """None when this process can create namespaces; otherwise why not."""
    if ip_tool() is None:
        return "iproute2's `ip` is not installed (Debian: apt-get install iproute2)"
    if shutil.which("ethtool") is None:
        return "`ethtool` is not installed (Debian: apt-get install ethtool)"
    if os.geteuid() != 0:
        try:
            caps = next(l for l in Path("/proc/self/status").read_text().splitlines() if l.startswith("CapEff:"))
            eff = int(caps.split()[1], 16)
        except (OSError, StopIteration, ValueError):
            eff = 0
        CAP_SYS_ADMIN, CAP_NET_ADMIN = 21, 12
        if not (eff >> CAP_NET_ADMIN & 1 and eff >> CAP_SYS_ADMIN & 1):
            return "network namespaces need root (or CAP_NET_ADMIN and CAP_SYS_ADMIN for `ip netns`)"
    return None
