"""``netns``: the host is a network namespace of this machine (and a time
namespace when it has a clock offset), on the lab's emulated network."""

from __future__ import annotations

from collections.abc import Callable
from pathlib import Path
from typing import TYPE_CHECKING

from loopscope.lab import hosts as H
from loopscope.lab.hostkinds.base import HostKind, HostRt

if TYPE_CHECKING:
    from loopscope.lab.netns import Topology
    from loopscope.spec.models import Host


class Netns(HostKind):
    name = "netns"

    def address(self, spec: Host, index: int, multi: bool, topo: Topology | None) -> str:
        assert topo is not None
        return topo.host(spec.name).address

    def start(self, h: HostRt, run_id: str, topo: Topology | None, log: Path, say: Callable[[str], None]) -> H.AgentClient:
        assert topo is not None
        return H.netns_agent(h.name, run_id, topo.host(h.name).ns, h.spec.clock_offset, log)
