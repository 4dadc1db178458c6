"""``ssh``: the host is a machine reached over ssh (asyncssh); its agent
writes under its ``workdir`` there, fetched home at the end."""

from __future__ import annotations

import os
import shlex
from collections.abc import Callable
from pathlib import Path
from typing import TYPE_CHECKING

from loopscope.errors import missing_part
from loopscope.lab import hosts as H
from loopscope.lab.hostkinds.base import Down, HostKind, HostRt, live_fetch

if TYPE_CHECKING:
    from loopscope.lab.netns import Topology
    from loopscope.spec.models import Host


class Ssh(HostKind):
    name = "ssh"

    def preflight(self, hosts: list[tuple[int, Host]]) -> dict[str, str]:
        if not hosts:
            return {}
        why = missing_part("asyncssh", "ssh", "the ssh host kind")
        if why:
            i, h = hosts[0]
            return {h.name: f"hosts.{i}.kind: {why}"}
        out = {}
        for _, h in hosts:
            err = H.ssh_preflight(h)
            if err:
                out[h.name] = f"host {h.name}: {err}"
        return out

    def start(self, h: HostRt, run_id: str, topo: Topology | None, log: Path, say: Callable[[str], None]) -> H.AgentClient:
        say(f"connecting to {h.name} ({h.spec.address}) over ssh")
        return H.ssh_agent(h.spec, run_id, log)

    def describe(self, spec: Host) -> dict[str, object]:
        return {"ssh": f"{spec.user + '@' if spec.user else ''}{spec.address}:{spec.port}"}

    def home_before_stop(self, h: HostRt, down: Down) -> list[str]:
        """Through its live agent's connection when it has nothing unanswered (no new connection)."""
        return live_fetch(h, down)

    def home_after_stop(self, h: HostRt, down: Down) -> list[str]:
        """Its files over a fresh ssh connection, then its directory there removed (when its agent could not)."""
        if h.agent is None or down.fetched:
            return []
        try:
            ch = H.SshChannel(h.spec, "true", h.local_base / "fetch.log")
        except Exception as e:  # noqa: BLE001
            return [f"host {h.name}: its files could not be fetched from {h.base}: {e}"]
        try:
            ch.fetch(h.base, h.local_base)
            ch.run(f"rm -rf {shlex.quote(h.base)}; rmdir {shlex.quote(os.path.dirname(h.base))} 2>/dev/null; true")
            return []
        except Exception as e:  # noqa: BLE001
            return [f"host {h.name}: fetching {h.base} failed: {e}"]
        finally:
            ch.close()

    def cleanup(self, h: HostRt, multi: bool) -> None:
        """Nothing here: its agent removes its cgroup there on leaving."""
