"""Starting and stopping the clock-sync probes of a multi-host run.

The reference host runs one responder for the whole run; every other host
runs an initiator towards it (``probes/clocksync.py``). They start once the
agents are up, before the first phase, and stop after the last, so every
record of every phase lies inside the span the probes cover. Their traces
live in ``hosts/<name>/clocksync/`` and are listed in ``run.json`` under
``clocksync``; ``loopscope.clock.sync`` reads them afterwards. A probe that
fails stops the run like any other component. The initiators are paused
(SIGSTOP) while each probe step measures and resumed after it (``pause``),
so they are never inside a window: the estimate bridges each step. Each
time they run they are let run ``AWAKE_S`` at least (a few pairs at their
rate) before the next pause or their stop: a window's bridge needs pairs on
both sides of it, and the gap between two steps can be a few milliseconds.

Which network they cross (``clocksync.network``): ``sync`` by default, the
netns hosts' own veths to the reference (``netns.Topology.sync_links``) or
an ssh reference's ``sync_address``; ``experiment``, the experiment's
network with its router and links. Each initiator records the one it used.
"""

from __future__ import annotations

import time
from dataclasses import dataclass, field
from typing import TYPE_CHECKING

from loopscope import protocol as P
from loopscope.lab.lab import Lab
from loopscope.lab.hosts import AgentFailure
from loopscope.rundir import ClockSyncRecord, SyncPart

if TYPE_CHECKING:
    from loopscope.spec.models import Experiment

# The least time the initiators run each time they are started or resumed:
# three pairs at the default 20 a second, and the start-up they still do
# after saying ready.
AWAKE_S = 0.15


@dataclass
class SyncRun:
    """The clock-sync probes while they run: what ``run.json`` keeps of them
    (``record``), which are running where, and when they last woke."""

    record: ClockSyncRecord
    running: list[tuple[str, str]] = field(default_factory=list)
    awake_since: float = 0.0
    paused: bool = False


def start(lab: Lab, exp: Experiment) -> SyncRun:
    cs = exp.clocksync
    ref = cs.reference or exp.hosts[0].name
    rh = lab.hosts[ref]
    dests = {h.name: destination(lab, exp, h.name) for h in exp.hosts if h.name != ref}
    any_sync = any(net == "sync" for _, net in dests.values())
    bind = f"{'0.0.0.0' if rh.remote or any_sync else rh.address}:{cs.port}"
    nets = sorted({net for _, net in dests.values()})
    info = SyncRun(
        ClockSyncRecord(
            reference=ref,
            port=cs.port,
            rate=cs.rate,
            gap_ns=cs.gap,
            network=nets[0] if len(nets) == 1 else "mixed",
            asked_network=cs.network,
            responder=None,
            initiators={},
        )
    )
    r = lab.agent(ref).ask(
        P.StartProbe(
            probe={"kind": "sync-serve", "name": "clocksync-serve", "bind": bind},
            step_dir=lab.step_dir(ref, "clocksync"),
            scratch_dir=lab.scratch(ref),
            wait_ready=True,
        )
    )
    info.record.responder = SyncPart.model_validate(
        {"host": ref, "trace": lab.rel(ref, r.trace), "json": lab.rel(ref, f"{lab.step_dir(ref, 'clocksync')}/clocksync-serve.json")}
    )
    info.running.append((ref, "clocksync-serve"))
    # the initiators at once: each needs only the responder
    flows = [(flow, h.name) for flow, h in enumerate(exp.hosts, start=1) if h.name != ref]
    asks = []
    for flow, name in flows:
        spec = {"kind": "sync", "name": "clocksync", "dest": f"{dests[name][0]}:{cs.port}", "flow": flow, "rate": cs.rate, "gap_ns": cs.gap}
        asks.append((name, P.StartProbe(probe=spec, step_dir=lab.step_dir(name, "clocksync"), scratch_dir=lab.scratch(name), wait_ready=True)))
    got = lab.ask_each(asks)
    for (flow, name), res in zip(flows, got):
        if isinstance(res, AgentFailure):
            continue
        addr, net = dests[name]
        info.record.initiators[name] = SyncPart.model_validate(
            {
                "flow": flow,
                "network": net,
                "dest": addr,
                "trace": lab.rel(name, res.trace),
                "json": lab.rel(name, f"{lab.step_dir(name, 'clocksync')}/clocksync.json"),
            }
        )
        info.running.append((name, "clocksync"))
    for res in got:
        if isinstance(res, AgentFailure):
            raise res
    info.awake_since = time.monotonic()
    return info


def pause(lab: Lab, info: SyncRun | None, on: bool) -> None:
    """Stop (``on``) or resume the initiators: they rest while a probe step
    measures, like the kernel capture's reader, and the estimate bridges the
    step (its bound at a time inside the gap says what that costs). The
    responder sleeps when no probe comes."""
    if not info:
        return
    if on:
        _let_run(info)
    for host, name in info.running:
        if name == "clocksync":
            lab.agent(host).ask(P.SignalProbe(name=name, signal="stop" if on else "cont"))
    info.paused = on
    if not on:
        info.awake_since = time.monotonic()


def _let_run(info: SyncRun) -> None:
    """Wait until the initiators have run ``AWAKE_S`` since they last started."""
    left = info.awake_since + AWAKE_S - time.monotonic()
    if left > 0:
        time.sleep(left)


def destination(lab: Lab, exp: Experiment, host: str) -> tuple[str, str]:
    """Where ``host``'s initiator sends, and over which network."""
    cs = exp.clocksync
    rh = lab.hosts[cs.reference or exp.hosts[0].name]
    if cs.network == "sync":
        topo = getattr(lab, "topo", None)
        if topo is not None and host in topo.sync_links:
            return topo.sync_links[host].peer_address, "sync"
        if rh.spec.sync_address:
            return rh.spec.sync_address, "sync"
    return rh.address, "experiment"


def stop(lab: Lab, info: SyncRun, quiet: bool = False) -> None:
    """Initiators first (their last answers still come back), then the responder."""
    if info.paused:  # a stopped process handles SIGINT only once resumed
        try:
            pause(lab, info, False)
        except AgentFailure:
            if not quiet:
                raise
    if not quiet:
        _let_run(info)  # pairs after the last step, so its bridge has two ends
    for host, name in sorted(info.running, key=lambda x: x[1] == "clocksync-serve"):
        try:
            r = lab.agent(host).ask(P.StopProbe(name=name, timeout_s=5)).result
            keys = (
                ("pairs", "sent", "answered", "lost", "no_tx_stamp", "min_rtt_ns")
                if name == "clocksync"
                else ("received", "answered", "no_tx_stamp", "no_rx_stamp", "malformed")
            )
            target = info.record.initiators[host] if name == "clocksync" else info.record.responder
            if target is not None:
                target.result = {k: r.get(k) for k in keys}
        except AgentFailure:
            if not quiet:
                raise
    info.running = []
