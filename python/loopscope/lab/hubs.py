"""The hubs of the channels an experiment declares.

``channels:`` in the experiment file names channels the lab hosts; every
host that holds one runs a hub process (``loopscope channel hub``) for each
program or app step, started before the step's own processes and stopped
after them, so each step's counts, trace and per-item events are its own.
The hub runs like a program under the host's agent (its own session, its
trace in the step directory, SIGINT to stop), and the step lists it among
its processes as ``hub-HOST`` so the time breakdown and the per-item
events see the runtime's share.

Every process of the step gets ``LOOPSCOPE_CHANNELS`` (name → hub address,
transport, capacity, policy, largest item) and ``LOOPSCOPE_CHANNEL_STATS``
(a file in the step directory where ``loopscope.channels`` appends the
counts of the remote ends the process opened, at exit: what a receiver
lost to incomplete UDP items is only known there).
"""

from __future__ import annotations

import json
from typing import TYPE_CHECKING, Any

from loopscope import protocol as P
from loopscope.lab.lab import Lab
from loopscope.rundir import HubStep
from loopscope.lab.hosts import AgentFailure

if TYPE_CHECKING:
    from loopscope.spec.models import Experiment


def hub_hosts(lab: Lab, exp: Experiment) -> dict[str, list[Any]]:
    first = next(iter(lab.hosts))
    out: dict[str, list[Any]] = {}
    for c in exp.channels:
        out.setdefault(c.host or first, []).append(c)
    return out


def env_for(lab: Lab, exp: Experiment) -> str:
    """LOOPSCOPE_CHANNELS for the step's processes."""
    first = next(iter(lab.hosts))
    m = {}
    for c in exp.channels:
        h = c.host or first
        m[c.name] = {
            "hub": f"{lab.hosts[h].address or '127.0.0.1'}:{exp.channel_port}",
            "transport": c.transport,
            "capacity": c.capacity,
            "full": c.full,
            "max_item": c.max_item,
            "host": h,
        }
    return json.dumps(m, separators=(",", ":"))


def stats_path(lab: Lab, host: str, key: str, name: str) -> str:
    return f"{lab.step_dir(host, key)}/{name}.channels.jsonl"


def start(lab: Lab, exp: Experiment, probe: str, key: str, dur_ns: int) -> list[tuple[str, str]]:
    """Start the step's hubs; returns (host, name) of each started."""
    started: list[tuple[str, str]] = []
    for host, chans in hub_hosts(lab, exp).items():
        name = f"{probe}.hub-{host}"
        decl = [{"name": c.name, "capacity": c.capacity, "full": c.full, "max_item": c.max_item} for c in chans]
        listen = f"{lab.hosts[host].address or '127.0.0.1'}:{exp.channel_port}"
        command = [
            "python3",
            "-m",
            "loopscope.cli",
            "channel",
            "hub",
            "--listen",
            listen,
            "--channels",
            json.dumps(decl, separators=(",", ":")),
            "--stats",
            f"{lab.step_dir(host, key)}/{name}.stats.json",
        ]
        spec: dict[str, object] = {"kind": "program", "name": name, "command": command, "until": "exit", "env": {}, "cpu": None, "cwd": None}
        try:
            lab.agent(host).ask(P.StartProbe(probe=spec, step_dir=lab.step_dir(host, key), scratch_dir=lab.scratch(host), duration_ns=dur_ns + 600_000_000_000))
        except AgentFailure:
            stop(lab, started, quiet=True)
            raise
        started.append((host, name))
    return started


def check(lab: Lab, started: list[tuple[str, str]]) -> None:
    """A hub that exited on its own fails the step, naming it."""
    for host, name in started:
        st = lab.agent(host).ask(P.GetStatus())
        if not st.probes.get(name, False):
            r = lab.agent(host).ask(P.StopProbe(name=name))
            started.remove((host, name))
            raise AgentFailure(f"the channel hub on {host} exited during the step ({r.result.get('exit')}); see {name}.log", host=host, component=f"hub {name}")


def stop(lab: Lab, started: list[tuple[str, str]], quiet: bool = False) -> list[HubStep]:
    """Stop the hubs; their parts for the step (name ``hub-HOST``)."""
    parts = []
    for host, name in list(started):
        try:
            r = lab.agent(host).ask(P.StopProbe(name=name, timeout_s=3) if quiet else P.StopProbe(name=name))
        except AgentFailure:
            if not quiet:
                raise
            continue
        finally:
            started.remove((host, name))
        step = r.trace.rsplit("/", 1)[0]
        parts.append(
            HubStep.model_validate(
                {
                    "name": name.split(".", 1)[1],
                    "host": host,
                    "trace": lab.rel(host, r.trace),
                    "json": lab.rel(host, f"{step}/{name}.json"),
                    "stats": lab.rel(host, f"{step}/{name}.stats.json"),
                    "command": r.command,
                    "cpu_usec": r.cpu_usec,
                    "hub": True,
                }
            )
        )
    return parts
