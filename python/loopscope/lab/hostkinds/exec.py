"""``exec``: the host is a machine or container reached through a launcher
a fleet already runs (srun, kubectl exec, docker exec, ip netns exec, ssh);
its files come home through an agent of its own."""

from __future__ import annotations

from collections.abc import Callable
from pathlib import Path
from typing import TYPE_CHECKING

from loopscope import protocol as P
from loopscope.lab import hosts as H
from loopscope.lab import launch
from loopscope.lab.hostkinds.base import Down, HostKind, HostRt, live_fetch

if TYPE_CHECKING:
    from loopscope.lab.netns import Topology
    from loopscope.spec.models import Host


class Exec(HostKind):
    name = "exec"
    down_when_lost = True  # a fresh agent fetches what the lost one left

    def preflight(self, hosts: list[tuple[int, Host]]) -> dict[str, str]:
        return launch.preflight([h for _, h in hosts]) if hosts else {}

    def start(self, h: HostRt, run_id: str, topo: Topology | None, log: Path, say: Callable[[str], None]) -> H.AgentClient:
        return H.exec_agent(h.spec, run_id, log)

    def describe(self, spec: Host) -> dict[str, object]:
        return {"launcher": spec.launcher}

    def home_before_stop(self, h: HostRt, down: Down) -> list[str]:
        """Through its own agent, when that agent is still there with nothing
        unanswered (a run that completed, or one interrupted between steps or
        with its steps cut short: a monitor's Ctrl-C)."""
        return live_fetch(h, down)

    def home_after_stop(self, h: HostRt, down: Down) -> list[str]:
        """Through a fresh agent once the first has stopped what it ran (when the first could not)."""
        return [] if down.fetched else self._fetch(h, None, down)

    def _fetch(self, h: HostRt, agent: H.AgentClient | None, down: Down) -> list[str]:
        """Its files home through ``agent`` (None: a fresh one started for it,
        the first being gone). Never raises: what went wrong is said."""
        fresh = agent is None
        try:
            if agent is None:
                agent = H.exec_agent(h.spec, down.run_id, h.local_base / "fetch.log")
                # the same cgroup as the lost agent's: this one removes it on leaving, with what the first left there
                agent.ask(P.Hello(run_id=down.run_id, run_dir=h.base, cgroup_name=down.cgroup_name), timeout=60)
            launch.fetch(agent, h.base, h.local_base)
            return []
        except Exception as e:  # noqa: BLE001 - the run's record says the files are missing, and why
            return [f"host {h.name}: its files could not be brought home from {h.base}{' (after its agent was lost)' if fresh else ''}: {e}"]
        finally:
            if fresh and agent is not None:
                try:
                    agent.close(timeout=10)
                except Exception:  # noqa: BLE001
                    agent.terminate()

    def cleanup(self, h: HostRt, multi: bool) -> None:
        """Nothing here: its agent removes its cgroup there on leaving."""
