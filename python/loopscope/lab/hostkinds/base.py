"""What every host kind does for the lab, and the lab's record of one host.

A host kind (``HostKind``) is looked up by its name in ``HOST_KINDS``
(``lab/hostkinds/__init__.py``); its declaration (``spec/hostkinds.py``)
says what its entry in the experiment file holds. The hooks, in the order a
run meets them:

- ``preflight``: whether its hosts can run the experiment, asked before
  anything starts (problems by host name);
- ``address``: the address the other hosts reach it at;
- ``start``: its agent, spawned (not yet waited for);
- ``describe``: what the run's provenance says of it beyond kind and address;
- ``home_before_stop`` / ``home_after_stop``: its files brought home, through
  its live agent or after that agent stopped (the kinds whose agents write
  elsewhere);
- ``cleanup``: what the lab made for it on this machine, removed (cgroups).

Defaults are what a host on this machine needs: nothing.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING

from loopscope import protocol as P
from loopscope.host.cgroup import RunGroup, remove_root_if_empty
from loopscope.lab import hosts as H
from loopscope.lab import launch
from loopscope.spec.hostkinds import DECLARED, Declared
from loopscope.host.provenance import _ns_inode, _read

if TYPE_CHECKING:
    from loopscope.lab.netns import Topology
    from loopscope.spec.models import Host


@dataclass
class HostRt:
    """One host of a running lab."""

    name: str
    kind: str
    spec: Host
    index: int
    address: str
    base: str  # the run's directory for this host, in that host's file system
    local_base: Path  # where its files end up here
    agent: H.AgentClient | None = None
    cgroup: str | None = None
    #: what its agent said on starting (None before it did)
    hello: P.HelloReply | None = None
    #: why its agent is gone (a lost host under ``on_host_failure: continue``)
    lost: str | None = None

    @property
    def pid(self) -> int:
        """Its agent's process id (known once the agent said hello)."""
        if self.hello is None:
            raise RuntimeError(f"{self.name}: its agent has not said hello")
        return self.hello.pid

    @property
    def remote(self) -> bool:
        """Its agent runs elsewhere (ssh, a launcher): files come home at the end, no signal reaches it."""
        return DECLARED[self.kind].remote

    @property
    def here(self) -> bool:
        """Its agent's processes are this machine's, with the process ids this controller sees."""
        if not self.remote:
            return True
        me = _own_machine()
        p = self.hello.provenance if self.hello else None
        return p is not None and p.boot_id is not None and (p.boot_id, p.pid_ns) == me


def _own_machine() -> tuple[str | None, int | None]:

    return _read("/proc/sys/kernel/random/boot_id"), _ns_inode("pid")


@dataclass
class Down:
    """What bringing one host down needs of its lab."""

    run_id: str
    cgroup_name: str
    completed: bool
    #: its agent was still there to ask when the lab came down
    live: bool
    #: and had nothing left unanswered (no step cut short under it): its files can come home through it
    idle: bool = False
    #: they did (``home_before_stop``): ``home_after_stop`` has nothing left to bring
    fetched: bool = False


class HostKind:
    """The lab's half of a host kind (the defaults: a host on this machine)."""

    name = ""
    #: an agent that was lost is still brought down (a fresh one fetches its files)
    down_when_lost = False

    @property
    def declared(self) -> Declared:
        return DECLARED[self.name]

    def preflight(self, hosts: list[tuple[int, Host]]) -> dict[str, str]:
        """What stops these hosts (with their places in the file) from running the experiment, by host name."""
        return {}

    def address(self, spec: Host, index: int, multi: bool, topo: Topology | None) -> str:
        return spec.address or ""

    def start(self, h: HostRt, run_id: str, topo: Topology | None, log: Path, say: Callable[[str], None]) -> H.AgentClient:
        raise NotImplementedError(self.name)

    def describe(self, spec: Host) -> dict[str, object]:
        return {}

    def home_before_stop(self, h: HostRt, down: Down) -> list[str]:
        return []

    def home_after_stop(self, h: HostRt, down: Down) -> list[str]:
        return []

    def cleanup(self, h: HostRt, multi: bool) -> None:
        """The cgroup its agent ran in, and the run's and loopscope's above it once empty."""
        if not h.cgroup:
            return
        RunGroup.remove(Path(h.cgroup))
        if multi:
            parent = Path(h.cgroup).parent
            RunGroup.remove(parent)
            remove_root_if_empty(parent)
        else:
            remove_root_if_empty(Path(h.cgroup))


def live_fetch(h: HostRt, down: Down) -> list[str]:
    """A remote host's files home through its live, idle agent, which then
    removes them there (``down.fetched``); nothing said when it cannot, so
    that ``home_after_stop`` tries its own way (a fresh agent, SFTP) and says
    what went wrong there."""
    if not (down.live and down.idle and h.agent is not None):
        return []
    try:
        launch.fetch(h.agent, h.base, h.local_base)
        down.fetched = True
    except Exception:  # noqa: BLE001 - the way after the agent's stop tries again
        pass
    return []
