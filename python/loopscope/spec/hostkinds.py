"""Host kinds, as an experiment file declares them: what each kind's host
entry must and may say, whether its agent runs on this machine, and what
``auto`` becomes. The lab's half of each kind (how its agent starts, how its
files come home, how it is installed and cleaned up) is in
``lab/hostkinds/``, one module per kind, keyed by the same names.

A kind is looked up by name (``DECLARED[h.kind]``); nothing outside this
module and the lab's registry asks which kind a host is by comparing names.
"""

from __future__ import annotations

import ipaddress
from dataclasses import dataclass
from typing import Protocol

Problem = tuple[tuple[str | int, ...], str]


class HostFields(Protocol):
    """The fields of a host entry a kind's check reads (spec.models.Host)."""

    name: str
    address: str | None
    launcher: list[str] | None
    clock_offset: int
    port: int


@dataclass(frozen=True)
class Declared:
    """One host kind as the experiment file sees it."""

    name: str
    #: its agent runs elsewhere (ssh, a launcher): files are written there and come home at the end
    remote: bool
    #: a network namespace of this machine (links are emulated between these only)
    namespaced: bool
    #: what its ``address`` is; None: it needs none (a default is made)
    needs_address: str | None = None
    #: it takes a ``launcher``
    launched: bool = False
    #: its ``address`` is an IPv4 address this machine gives it
    own_ipv4: bool = False
    #: its clock can be shifted (a time namespace)
    time_namespace: bool = False
    #: the address it is told apart by also has a port, and its name is an
    #: address to connect to when none is given (an inventory's host name; ssh)
    connects_by_name: bool = False

    def problems(self, i: int, h: HostFields) -> list[Problem]:
        """What is wrong with host ``i``'s entry for this kind."""
        out: list[Problem] = []
        if self.needs_address and not h.address:
            out.append((("hosts", i, "address"), f"{self.name} host {h.name!r} needs an address: {self.needs_address}"))
        if self.launched and not h.launcher:
            out.append(
                (
                    ("hosts", i, "launcher"),
                    f"{self.name} host {h.name!r} needs a launcher: the command that starts a process there with its stdin and stdout, e.g. [srun, --nodelist=n1, --ntasks=1]",
                )
            )
        if h.launcher and not self.launched:
            out.append((("hosts", i, "launcher"), f"only exec hosts take a launcher (host {h.name!r} is {self.name}); add `kind: exec`"))
        if h.address and self.own_ipv4:
            try:
                ipaddress.IPv4Address(h.address)
            except ValueError:
                out.append((("hosts", i, "address"), f"must be an IPv4 address for a {self.name} host [got {h.address!r}]"))
        if h.clock_offset and not self.time_namespace:
            out.append((("hosts", i, "clock_offset"), f"a clock offset needs a time namespace: only netns hosts have one (host {h.name!r} is {self.name})"))
        return out

    def address_key(self, h: HostFields) -> str | None:
        """What two hosts may not share (their address, with the port where one connects to it)."""
        if not h.address:
            return None
        return f"{h.address}:{h.port}" if self.connects_by_name else h.address


DECLARED: dict[str, Declared] = {
    d.name: d
    for d in (
        Declared("netns", remote=False, namespaced=True, own_ipv4=True, time_namespace=True),
        Declared("local", remote=False, namespaced=False, own_ipv4=True),
        Declared("ssh", remote=True, namespaced=False, needs_address="a name or IP to connect to", connects_by_name=True),
        Declared("exec", remote=True, namespaced=False, needs_address="the one its network probes and clock sync reach it at", launched=True),
        # becomes netns or local when the run starts (``resolve``): checked as a netns host
        Declared("auto", remote=False, namespaced=True, own_ipv4=True, time_namespace=True),
    )
}

#: the kinds whose agents run elsewhere
REMOTE = tuple(n for n, d in DECLARED.items() if d.remote)


def resolve(kind: str, wants_namespaces: bool, why_not: str | None) -> tuple[str, str | None]:
    """The kind a host of ``kind`` runs as, and a note when ``auto`` fell back:
    ``auto`` is netns when the experiment wants namespaces (several hosts, a
    clock offset, links) and this process may make them, local otherwise."""
    if kind != "auto":
        return kind, None
    if wants_namespaces and why_not is None:
        return "netns", None
    return "local", (f"runs as local processes on loopback ({why_not})" if wants_namespaces else None)
