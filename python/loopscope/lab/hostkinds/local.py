"""``local``: the host is processes of this machine on a loopback address."""

from __future__ import annotations

from collections.abc import Callable
from pathlib import Path
from typing import TYPE_CHECKING

from loopscope.lab import hosts as H
from loopscope.lab.hostkinds.base import HostKind, HostRt

if TYPE_CHECKING:
    from loopscope.lab.netns import Topology
    from loopscope.spec.models import Host


class Local(HostKind):
    name = "local"

    def address(self, spec: Host, index: int, multi: bool, topo: Topology | None) -> str:
        return spec.address or (f"127.0.{index}.1" if multi else "127.0.0.1")

    def start(self, h: HostRt, run_id: str, topo: Topology | None, log: Path, say: Callable[[str], None]) -> H.AgentClient:
        return H.local_agent(h.name, run_id, log)
