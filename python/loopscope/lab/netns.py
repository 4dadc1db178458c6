"""Hosts as network namespaces on one machine, joined by a router namespace.

Topology (a star): every host gets a namespace ``ls-<tag>-<host>`` with one
interface ``eth0`` holding ``10.77.<i>.2/24`` and a default route through
``10.77.<i>.1``, the router's address on the other end of the veth pair
(``r<i>`` in ``ls-<tag>-router``). The router comes up with IP forwarding
off; ``kernel_forwarding`` then turns it on for the paths that ask for no
emulation and puts a blackhole rule (``ip rule … iif r<a> to <net b>``,
no ICMP back) on each path the user-space emulator (``loopscope netem``)
carries, which reads those frames from AF_PACKET sockets and applies the
link's delay, loss and so on. Without that call every path is the
emulator's.
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

The sync network: with a ``sync_reference``, every other host also gets
``sync0`` (``10.78.<i>.2/24``), a veth straight into the reference's
namespace (``s<i>``, ``10.78.<i>.1``). The clock-sync probes use it, so
their packets meet neither the router nor the emulator: one veth hop each
way, the same in both directions, which is what an offset estimate from
round trips needs. It is not a namespace of its own with a forwarder (one
hop fewer, nothing to forward); it goes when the hosts' namespaces go.

Everything is done with ``ip -batch`` (iproute2), one invocation per
namespace, so four hosts come up in well under a second; ``down`` deletes
the namespaces, which deletes their veths with them.
"""

from __future__ import annotations

import hashlib
import ipaddress
import os
import re
import shutil
import subprocess
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from pathlib import Path

from loopscope.errors import RunError

PREFIX = "ls-"
NET = "10.77"
SYNC_NET = "10.78"
SYNC_IF = "sync0"
#: the ports a host namespace keeps out of its ephemeral range: the block loopscope's listeners default to
#: (pipeline stages from 47100, rr's server 47300, channel hubs 47600)
RESERVED_PORTS = "47000-47999"


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
class SyncLink:
    """A host's own veth into the reference's namespace, for clock sync."""

    host: str
    index: int
    address: str  # the host's end (sync0)
    peer_address: str  # the reference's end: where the host's probes go
    peer_if: str
    mac: str
    peer_mac: str


@dataclass
class Topology:
    run_id: str
    hosts: list[HostNet]
    tag: str
    router_ns: str
    up_ns: int = 0
    created: list[str] = field(default_factory=list)
    sync_reference: str | None = None
    sync_links: dict[str, SyncLink] = field(default_factory=dict)

    @classmethod
    def plan(cls, run_id: str, names: list[str], addresses: dict[str, str] | None = None, sync_reference: str | None = None) -> Topology:
        """Addresses: 10.77.<i>.2/24 with the router at .1, or the given
        address in its /24 with the router at .1 (.254 if the host is .1);
        NetnsError when two hosts would share a subnet, or when a host's
        address lies in the sync network's 10.78.0.0/16 while there is one."""
        tag = tag_of(run_id)
        hosts = []
        nets: dict[str, str] = {}
        for i, h in enumerate(names, start=1):
            addr = (addresses or {}).get(h) or f"{NET}.{i}.2"
            if sync_reference and addr.startswith(SYNC_NET + "."):
                raise NetnsError(
                    f"host {h}: address {addr} lies in {SYNC_NET}.0.0/16, the clock-sync network's; pick another or set clocksync.network: experiment"
                )
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
        topo = cls(run_id, hosts, tag, ns_name(tag, "router"), sync_reference=sync_reference if sync_reference in names else None)
        if topo.sync_reference:
            for hn in hosts:
                if hn.name != topo.sync_reference:
                    i = hn.index
                    topo.sync_links[hn.name] = SyncLink(
                        hn.name,
                        i,
                        f"{SYNC_NET}.{i}.2",
                        f"{SYNC_NET}.{i}.1",
                        f"s{i}",
                        f"02:4c:54:{i >> 8:02x}:{i & 0xFF:02x}:02",
                        f"02:4c:54:{i >> 8:02x}:{i & 0xFF:02x}:01",
                    )
        return topo

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
            # loopscope's services listen on fixed ports in this block (pipeline stages, rr's server, the channel hubs):
            # no client socket of the namespace may take one as its own ephemeral port first (a hub once failed so)
            _sysctl(
                h.ns, {"net.ipv6.conf.all.disable_ipv6": "1", "net.ipv6.conf.default.disable_ipv6": "1", "net.ipv4.ip_local_reserved_ports": RESERVED_PORTS}
            )
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
        if self.sync_links:
            self._sync_up()

    def _sync_up(self) -> None:
        assert self.sync_reference is not None
        ref = self.host(self.sync_reference)
        _batch(
            None,
            [
                f"link add {SYNC_IF} netns {self.host(n).ns} address {s.mac} type veth peer name {s.peer_if} netns {ref.ns} address {s.peer_mac}"
                for n, s in self.sync_links.items()
            ],
        )
        rcmds = []
        for n, s in self.sync_links.items():
            rcmds += [
                f"address add {s.peer_address}/24 dev {s.peer_if}",
                f"link set {s.peer_if} up",
                f"neighbour replace {s.address} lladdr {s.mac} dev {s.peer_if} nud permanent",
            ]
            _batch(
                self.host(n).ns,
                [
                    f"address add {s.address}/24 dev {SYNC_IF}",
                    f"link set {SYNC_IF} up",
                    f"neighbour replace {s.peer_address} lladdr {s.peer_mac} dev {SYNC_IF} nud permanent",
                ],
            )
        _batch(ref.ns, rcmds)

    def down(self) -> list[str]:
        """Delete the namespaces (and with them the veths); returns what was removed."""
        return delete_namespaces(self.namespaces)

    def kernel_forwarding(self, emulated: set[tuple[str, str]]) -> None:
        """The router's kernel forwards every path but the ``emulated`` ones
        ((from, to) host names), which are blackholed in its routing so only
        the emulator carries them. NetnsError (forwarding stays off) when
        the kernel refuses a rule."""
        rules = [f"rule add iif {self.host(a).router_if} to {self.host(b).net}/{self.host(b).prefix} priority 1000 blackhole" for a, b in sorted(emulated)]
        if rules:
            _batch(self.router_ns, rules)
        _sysctl(
            self.router_ns,
            {
                "net.ipv4.conf.all.rp_filter": "0",
                "net.ipv4.conf.all.send_redirects": "0",
                "net.ipv4.conf.default.send_redirects": "0",
                "net.ipv4.ip_forward": "1",
            },
        )

    def forward_counts(self) -> dict[str, int] | None:
        """The router kernel's own IPv4 counts (``/proc/net/snmp`` in its
        namespace): datagrams it forwarded and those it discarded, so a
        kernel path's losses are counted too. None when unreadable."""
        try:
            r = subprocess.run(["ip", "netns", "exec", self.router_ns, "cat", "/proc/net/snmp"], capture_output=True, text=True, timeout=10)
        except (OSError, subprocess.TimeoutExpired):
            return None
        lines = [l.split() for l in r.stdout.splitlines() if l.startswith("Ip:")]
        if r.returncode != 0 or len(lines) < 2:
            return None
        ip = dict(zip(lines[0][1:], lines[1][1:]))
        keys = {
            "ForwDatagrams": "forwarded",
            "InDiscards": "in_discards",
            "OutDiscards": "out_discards",
            "OutNoRoutes": "no_route",
            "InHdrErrors": "header_errors",
            "InAddrErrors": "address_errors",
        }
        try:
            return {v: int(ip[k]) for k, v in keys.items() if k in ip}
        except ValueError:
            return None

    def link_down(self, host: str) -> None:
        """Take a host's interface down (failure injection)."""
        h = self.host(host)
        _batch(h.ns, [f"link set {h.ifname} down"])

    def emulator_config(
        self, links: Sequence[Mapping[str, object]], seed: int, records: bool = True, priority: int = 0, kernel: set[tuple[str, str]] | None = None
    ) -> dict[str, object]:
        """``kernel``: the paths the router's kernel forwards (the emulator's
        sockets filter their frames out)."""
        idx = {h.name: i for i, h in enumerate(self.hosts)}
        ports = [{"host": h.name, "ifname": h.router_if, "host_mac": h.mac, "router_ip": h.gateway, "net": h.net, "prefix": h.prefix} for h in self.hosts]
        ls = [{**l, "from": idx[str(l["from"])], "to": idx[str(l["to"])]} for l in links]
        kp = [[idx[a], idx[b]] for a, b in sorted(kernel or ())]
        return {"ports": ports, "links": ls, "seed": seed, "records": records, "priority": priority, "kernel_paths": kp}

    def describe(self) -> dict[str, object]:
        return {
            "tag": self.tag,
            "router_ns": self.router_ns,
            "hosts": {h.name: {"ns": h.ns, "address": h.address, "gateway": h.gateway, "ifname": h.ifname, "mac": h.mac} for h in self.hosts},
            **(
                {
                    "sync": {
                        "reference": self.sync_reference,
                        "links": {
                            n: {"ifname": SYNC_IF, "address": s.address, "reference_address": s.peer_address, "reference_ifname": s.peer_if}
                            for n, s in self.sync_links.items()
                        },
                    }
                }
                if self.sync_links
                else {}
            ),
        }


class NetnsError(RunError):
    """iproute2 refused something; the message says what."""

    def __init__(self, message: str) -> None:
        super().__init__(message, component="network namespaces")


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


def existing(prefix: str = PREFIX) -> list[str]:
    """loopscope's namespaces present now (``ip netns`` names starting ls-, or ``prefix``)."""
    try:
        names = os.listdir("/run/netns")
    except OSError:
        return []
    return sorted(n for n in names if n.startswith(prefix))


def leftover_fleets() -> list[str]:
    """Namespaces of fleets (``bench/fleet.py``: ``lsf<pid>-sw``, ``lsf<pid>-h<i>``;
    ``bench/sshd.py``: ``lsf<pid>-ssh``) whose process is gone: a killed bench
    or test left them."""
    out = []
    for n in existing("lsf"):
        m = re.fullmatch(r"lsf(\d+)-(sw|ssh|h\d+)", n)
        if m and not os.path.exists(f"/proc/{m.group(1)}"):
            out.append(n)
    return out


def delete_namespaces(names: list[str], prefix: str = PREFIX) -> list[str]:
    present = set(existing(prefix))
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
