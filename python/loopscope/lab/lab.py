"""The lab of one run: its hosts, their network, their agents.

``resolve_hosts`` decides each host's kind (``auto`` becomes ``netns`` when
this process may create namespaces and the experiment has several hosts or
a clock offset, ``local`` otherwise) and its address as the other hosts see
it. ``Lab.up`` builds the namespaces and the router, lets the router's
kernel forward every path that asks for no emulation, starts the link
emulator for the paths that do (none: no emulator), and starts one agent per
host, all spawned before any is waited for. ``Lab.down`` undoes all of it
in reverse and never raises: agents stopped (politely when the run
completed, SIGTERM otherwise), emulator stopped with its counts kept, remote
files fetched, namespaces deleted, cgroups removed.

Where files go: with a single host the run directory is the host's (the
layout of one-host runs); with several, each host writes under
``hosts/<name>/`` (on an ssh host first under its ``workdir``, fetched at
the end).
"""

from __future__ import annotations

import os
import time
from pathlib import Path
from typing import TYPE_CHECKING, Callable, Sequence

from loopscope import protocol as P
from loopscope.errors import RunError
from loopscope.lab import hosts as H
from loopscope.lab import netns, state
from loopscope.host import procs
from loopscope.lab.hostkinds import HOST_KINDS, Down, HostRt
from loopscope.rundir import EmulatorResult, PathRecord
from loopscope.spec.hostkinds import DECLARED, resolve
from loopscope.lab.emulator import Emulator, EmulatorFailure, LinkConfig, link_configs, path_plan
from loopscope.lab.launch import version

if TYPE_CHECKING:
    from loopscope.spec.models import Experiment


#: how long an agent may take to say hello (a launcher may wait for its cluster's scheduler)
HELLO_TIMEOUT_S = 120.0
#: a lost host started again (before each of a monitor's periods) gets this long to say hello: its launcher answered before
RESTART_TIMEOUT_S = 20.0


class LabError(RunError):
    """Setting up the lab failed; the message names the host or link."""

    def __init__(self, message: str) -> None:
        super().__init__(message, component="lab")


def resolve_hosts(exp: Experiment) -> tuple[dict[str, str], list[str]]:
    """Each host's kind (``auto`` resolved: spec/hostkinds.py), and notes on what was decided."""
    why_not = netns.privileges()
    wants_ns = len(exp.hosts) > 1 or any(h.clock_offset for h in exp.hosts) or bool(exp.links)
    kinds: dict[str, str] = {}
    notes: list[str] = []
    for h in exp.hosts:
        kinds[h.name], note = resolve(h.kind, wants_ns, why_not)
        if note:
            notes.append(f"host {h.name}: {note}")
    return kinds, notes


def _namespaced(kinds: dict[str, str]) -> list[str]:
    return [n for n, k in kinds.items() if DECLARED[k].namespaced]


def sync_reference(exp: Experiment, kinds: dict[str, str]) -> str | None:
    """The netns host the sync network leads to, when the run wants one."""
    ref = exp.clocksync.reference or exp.hosts[0].name
    if exp.wants_clocksync() and exp.clocksync.network == "sync" and ref in _namespaced(kinds):
        return ref
    return None


def check(exp: Experiment, file: str, kinds: dict[str, str]) -> list[str]:
    """Problems with hosts and links that make the run impossible (preflight)."""
    problems: list[str] = []
    ns_hosts = _namespaced(kinds)
    if ns_hosts:
        why = netns.privileges()
        if why is not None:
            problems.append(f"{file}: hosts {', '.join(ns_hosts)}: netns hosts cannot be created: {why}; run as root or use `kind: local`")
    for i, link in enumerate(exp.links):
        for end in dict.fromkeys(e for d in link.directions() for e in d):
            if end in kinds and end not in ns_hosts:
                problems.append(
                    f"{file}: links.{i}: host {end} is {kinds[end]}: links are emulated between netns hosts only (no netem between {kinds[end]} hosts here)"
                )
    for i, p in enumerate(exp.probes):
        if p.talks_across_hosts:
            ks = {kinds[h] for h in exp.hosts_of(p) if h in kinds}
            if len({"remote" if DECLARED[k].remote else k for k in ks}) > 1:
                problems.append(
                    f"{file}: probes.{i}: a {p.kind} probe's parts must reach each other: netns hosts reach only netns hosts, local ones only local ones, ssh and exec ones only ssh and exec ones [got {', '.join(sorted(ks))}]"
                )
    remote = [n for n, k in kinds.items() if DECLARED[k].remote]
    if any(ph.tunings for ph in exp.phases or []) and len(remote) < len(kinds):
        # a host on this machine's kernel: its tunings are checked here, now; another kernel's by its agent once it is up (lab/tuned.py)
        from loopscope.host import tunings

        problems += [f"{file}: {p}" for p in tunings.check([ph.model_dump() for ph in exp.phases or []])]
    es = exp.emulator
    if es.cpu is not None and es.cpu not in os.sched_getaffinity(0):
        problems.append(f"{file}: emulator.cpu: CPU {es.cpu} is not one this process may use (allowed: {', '.join(map(str, sorted(os.sched_getaffinity(0))))})")
    for i, h in enumerate(exp.hosts):
        if h.sync_address and h.name not in remote:
            problems.append(
                f"{file}: hosts.{i}.sync_address: only ssh and exec hosts take one (host {h.name} is {kinds.get(h.name)}; netns hosts get a sync network of their own)"
            )
    if ns_hosts:
        overrides = {h.name: h.address for h in exp.hosts if h.name in ns_hosts and h.address}
        try:
            netns.Topology.plan("preflight", ns_hosts, overrides, sync_reference=sync_reference(exp, kinds))
        except netns.NetnsError as e:
            problems.append(f"{file}: {e}")
    for name, kind in HOST_KINDS.items():
        mine = [(i, h) for i, h in enumerate(exp.hosts) if kinds.get(h.name) == name]
        said = kind.preflight(mine)
        problems += [f"{file}: {said[h.name]}" for _, h in mine if h.name in said]
    return problems


class Lab:
    def __init__(self, exp: Experiment, run_id: str, run_dir: Path, kinds: dict[str, str]) -> None:
        self.exp = exp
        self.run_id = run_id
        self.run_dir = run_dir
        self.kinds = kinds
        self.multi = len(exp.hosts) > 1
        self.topo: netns.Topology | None = None
        self.emulator: Emulator | None = None
        self.hosts: dict[str, HostRt] = {}
        self.timings: dict[str, int] = {}
        self.emulator_result: EmulatorResult | None = None
        # Per path: what carries it (``path_plan``), settled in ``up``.
        self.paths: dict[str, PathRecord] = {}
        self.kernel_forwarded: set[tuple[str, str]] = set()
        self.router_counts: dict[str, int] | None = None
        # What the lab decided or could not do while coming up (the run's notes).
        self.notes: list[str] = []
        # The instant virtual clocks (test only) count their drift from.
        self.vclock_epoch_ns = time.time_ns()
        # What every probe of the session starts with in its environment (``Hello.probe_env``).
        self.probe_env: dict[str, str] = {}
        ns_names = _namespaced(kinds)
        if ns_names:
            overrides = {h.name: h.address for h in exp.hosts if h.name in ns_names and h.address}
            self.topo = netns.Topology.plan(run_id, ns_names, overrides, sync_reference=sync_reference(exp, kinds))
        for i, h in enumerate(exp.hosts, start=1):
            kind = kinds[h.name]
            address = HOST_KINDS[kind].address(h, i, self.multi, self.topo)
            if DECLARED[kind].remote:
                base = f"{h.workdir.rstrip('/')}/{run_id}/{h.name}"
                local_base = run_dir / "hosts" / h.name if self.multi else run_dir
            elif not self.multi:
                base, local_base = str(run_dir.resolve()), run_dir
            else:
                base, local_base = str((run_dir / "hosts" / h.name).resolve()), run_dir / "hosts" / h.name
            self.hosts[h.name] = HostRt(h.name, kind, h, i, address, base, local_base)

    # ---- up ---------------------------------------------------------------------------

    def up(self, say: Callable[[str], None]) -> None:
        t0 = time.monotonic_ns()
        if self.topo is not None:
            state.update(self.run_id, namespaces=self.topo.namespaces)
            try:
                self.topo.up()
            except netns.NetnsError as e:
                raise LabError(f"creating the network namespaces failed: {e}") from None
            self.timings["netns_up_ns"] = time.monotonic_ns() - t0
            if len(self.topo.hosts) >= 2:
                self._paths_up()
                if any(p.mechanism == "emulator" for p in self.paths.values()):
                    cfg = self._emulator_config(link_configs(self.exp))
                    try:
                        self.emulator = Emulator(self.topo.router_ns, cfg, self.run_dir / "netem", self.run_id)
                    except EmulatorFailure as e:
                        raise LabError(str(e)) from None
                    self.timings["emulator_ready_ns"] = time.monotonic_ns() - t0
        for h in self.hosts.values():
            log = (self.run_dir / "agent.log") if not self.multi else (self.run_dir / "hosts" / h.name / "agent.log")
            h.agent = HOST_KINDS[h.kind].start(h, self.run_id, self.topo, log, say)

        asked = []
        for h in self.hosts.values():  # every hello sent before any is waited for: the agents start side by side
            assert h.agent is not None
            req = self._hello(h)
            asked.append((h, req, h.agent.post(req)))
        for h, req, rid in asked:
            assert h.agent is not None
            h.hello = hello = h.agent.answer(req, rid, timeout=HELLO_TIMEOUT_S)
            h.cgroup = hello.cgroup
        self.timings["lab_up_ns"] = time.monotonic_ns() - t0
        agents = [{"host": h.name, "pid": h.pid, "start": procs.process_start_time(h.pid)} for h in self.hosts.values() if not h.remote]
        first = next(iter(self.hosts.values()))
        state.update(
            self.run_id,
            agents=agents,
            agent_pid=first.pid if not first.remote else None,
            agent_start=procs.process_start_time(first.pid) if not first.remote else None,
            cgroup=first.cgroup if not self.multi else None,
            cgroups=[h.cgroup for h in self.hosts.values() if h.cgroup and not h.remote],
        )

    def _hello(self, h: HostRt) -> P.Hello:
        vc = h.spec.virtual_clock
        vclock = f"{vc.offset},{vc.drift_ppm!r},{self.vclock_epoch_ns}" if vc and (vc.offset or vc.drift_ppm) else None
        return P.Hello(
            run_id=self.run_id, run_dir=h.base, cgroup_name=self.cgroup_name(h.name), vclock=vclock, controller_version=version(), probe_env=self.probe_env
        )

    def restart(self, name: str, say: Callable[[str], None], attempt: int) -> None:
        """A lost host's agent started again through its kind (the same
        launcher) and its hello answered; raises what stops it."""
        h = self.hosts[name]
        log = (self.run_dir if not self.multi else self.run_dir / "hosts" / h.name) / f"agent.again-{attempt}.log"
        if h.agent is not None:
            h.agent.terminate()
        h.agent = HOST_KINDS[h.kind].start(h, self.run_id, self.topo, log, say)
        h.hello = h.agent.ask(self._hello(h), timeout=RESTART_TIMEOUT_S)
        h.cgroup = h.hello.cgroup
        h.lost = None
        if not h.remote:
            state.update(
                self.run_id, agents=[{"host": x.name, "pid": x.pid, "start": procs.process_start_time(x.pid)} for x in self.hosts.values() if not x.remote]
            )

    def cgroup_name(self, host: str) -> str:
        """The cgroup of ``host``'s agent, under loopscope's root on its machine."""
        return self.run_id if not self.multi else f"{self.run_id}/{host}"

    def _paths_up(self) -> None:
        """Kernel forwarding for the paths that ask for nothing; where the
        router refuses it, the emulator carries every path and the notes say why."""
        assert self.topo is not None
        self.paths = path_plan(self.exp, [h.name for h in self.topo.hosts])
        emulated = {(p.from_, p.to) for p in self.paths.values() if p.mechanism == "emulator"}
        kernel = {(p.from_, p.to) for p in self.paths.values() if p.mechanism == "kernel"}
        if not kernel:
            return
        try:
            self.topo.kernel_forwarding(emulated)
        except netns.NetnsError as e:
            self.notes.append(f"the router's kernel cannot forward the paths that ask for no emulation ({e}); the user-space emulator carries every path")
            for p in self.paths.values():
                if p.mechanism == "kernel":
                    p.mechanism, p.why = "emulator", f"kernel forwarding refused: {e}"
            return
        self.kernel_forwarded = kernel

    def _emulator_config(self, links: list[LinkConfig]) -> dict[str, object]:
        assert self.topo is not None
        es = self.exp.emulator
        cfg = self.topo.emulator_config(links, seed=self.exp.seed or 1, records=True, priority=50 if os.geteuid() == 0 else 0, kernel=self.kernel_forwarded)
        return {
            **cfg,
            "rings": es.rings,
            "poll": es.poll,
            "spin_max_ns": es.spin,
            "spin_quantile": es.spin_quantile,
            **({"cpu": es.cpu} if es.cpu is not None else {}),
        }

    # ---- during the run --------------------------------------------------------------

    def set_links(self, configs: list[LinkConfig]) -> None:
        """New link settings for the running emulator (a phase that changes links)."""
        if self.emulator is None or self.topo is None:
            return
        cfg = self._emulator_config(configs)
        try:
            self.emulator.reconfigure(cfg)
        except EmulatorFailure as e:
            raise H.AgentFailure(str(e), host="router", component="link emulator") from None

    def agent(self, host: str | None) -> H.AgentClient:
        h = self.hosts[host or self.exp.hosts[0].name]
        assert h.agent is not None
        return h.agent

    def ask_each(self, asks: Sequence[tuple[str, P.Request[P.R]]], timeout: float | None = None) -> list[P.R | H.AgentFailure]:
        """Each (host, request) sent before any answer is awaited, so that the
        hosts' agents work at once (three stages started in one stage's time);
        the answers in order, a failure in its place once every answer is in."""
        sent = [(host, req, self.agent(host).post(req)) for host, req in asks]
        out: list[P.R | H.AgentFailure] = []
        for host, req, rid in sent:
            try:
                out.append(self.agent(host).answer(req, rid, timeout))
            except H.AgentFailure as e:
                out.append(e)
        return out

    def step_dir(self, host: str, key: str) -> str:
        return f"{self.hosts[host].base}/steps/{key}"

    def scratch(self, host: str) -> str:
        return f"{self.hosts[host].base}/scratch"

    def rel(self, host: str, path: str) -> str:
        """A path the agent of ``host`` reported, relative to the run directory here."""
        h = self.hosts[host]
        sub = os.path.relpath(path, h.base)
        return str((h.local_base / sub).relative_to(self.run_dir))

    def check(self, skip: str | None = None) -> None:
        """Raise if any agent or the emulator died."""
        if self.emulator is not None:
            try:
                self.emulator.check()
            except EmulatorFailure as e:
                raise H.AgentFailure(str(e), host="router", component="link emulator") from None
        for h in self.hosts.values():
            if h.agent is not None and h.name != skip and h.lost is None:
                h.agent.check_alive()

    def link_down(self, host: str) -> None:
        assert self.topo is not None
        self.topo.link_down(host)

    def lab_tids(self) -> dict[str, list[int]]:
        """The threads of the lab's own processes on this machine, by the name
        attribution gives them: the controller and the agents, the emulator."""
        own = {"lab: agent": [os.getpid(), *(h.hello.pid for h in self.hosts.values() if h.here and h.hello)]}
        if self.emulator is not None:
            own["lab: emulator"] = [self.emulator.child.pid]
        out: dict[str, list[int]] = {}
        for label, pids in own.items():
            tids: set[int] = set()
            for pid in pids:
                try:
                    tids |= {int(t) for t in os.listdir(f"/proc/{pid}/task")}
                except OSError:
                    pass
            out[label] = sorted(tids)
        return out

    def provenance(self) -> dict[str, object]:
        out: dict[str, object] = {
            "hosts": {
                h.name: {
                    "kind": h.kind,
                    "address": h.address,
                    "clock_offset_ns": h.spec.clock_offset,
                    **(
                        {
                            "virtual_clock": {
                                "offset_ns": h.spec.virtual_clock.offset,
                                "drift_ppm": h.spec.virtual_clock.drift_ppm,
                                "epoch_realtime_ns": self.vclock_epoch_ns,
                            }
                        }
                        if h.spec.virtual_clock
                        else {}
                    ),
                    **HOST_KINDS[h.kind].describe(h.spec),
                }
                for h in self.hosts.values()
            }
        }
        if self.topo is not None:
            out["network"] = self.topo.describe()
        if self.exp.links or self.paths:
            from loopscope.lab.emulator import KERNEL_MECHANISM, MECHANISM

            mechs = {p.mechanism for p in self.paths.values()}
            out["links"] = {
                "mechanism": "; ".join(m for k, m in (("emulator", MECHANISM), ("kernel", KERNEL_MECHANISM)) if k in mechs) or "none",
                "paths": {
                    n: {
                        **p.model_dump(mode="json", by_alias=True),
                        "mechanism": MECHANISM if p.mechanism == "emulator" else KERNEL_MECHANISM,
                        "carried_by": p.mechanism,
                    }
                    for n, p in self.paths.items()
                },
                "applied": link_configs(self.exp),
            }
        return out

    # ---- down -------------------------------------------------------------------------

    def down(self, completed: bool, notes: list[str]) -> None:
        t0 = time.monotonic_ns()
        agents = [h for h in self.hosts.values() if h.agent is not None or (HOST_KINDS[h.kind].down_when_lost and h.lost)]
        if agents:
            from concurrent.futures import ThreadPoolExecutor

            # every host at once: a fleet comes down in the time of its slowest host
            with ThreadPoolExecutor(max_workers=min(32, len(agents))) as pool:
                for said in pool.map(lambda h: self._agent_down(h, completed), agents):
                    notes.extend(said)
        if self.emulator is not None:
            try:
                self.emulator_result = self.emulator.stop()
                for u in (self.emulator_result or {}).get("unfiltered") or []:
                    notes.append(f"link emulator: no socket filter on {u}; it saw the kernel's paths' frames there and left them alone (they cost it wake-ups)")
                for p in (self.emulator_result or {}).get("ports") or []:
                    if p["socket_drops"]:
                        notes.append(
                            f"link emulator: the kernel dropped {p['socket_drops']:,} frames on {p['ifname']} (from {p['host']}) before the emulator read them"
                        )
            except Exception as e:  # noqa: BLE001
                notes.append(f"stopping the link emulator: {e}")
                self.emulator.kill()
        if self.topo is not None:
            if self.kernel_forwarded:
                self.router_counts = self.topo.forward_counts()
            self.topo.down()
        for h in self.hosts.values():
            HOST_KINDS[h.kind].cleanup(h, self.multi)
        self.timings["lab_down_ns"] = time.monotonic_ns() - t0

    def _agent_down(self, h: HostRt, completed: bool) -> list[str]:
        """Stop one host's agent, its files brought home as its kind says
        (through that agent before it stops, or after). Never raises: what
        went wrong is said."""
        kind = HOST_KINDS[h.kind]
        live = h.agent is not None and h.lost is None and h.agent.dead is None
        down = Down(self.run_id, self.cgroup_name(h.name), completed, live, idle=live and h.agent is not None and h.agent.idle)
        notes = kind.home_before_stop(h, down)
        try:
            if h.agent is not None:
                if completed and live:
                    h.agent.close()
                else:
                    h.agent.terminate()
        except Exception as e:  # noqa: BLE001 - clean-up goes on whatever happened
            notes.append(f"stopping the agent on {h.name}: {e}")
        return notes + kind.home_after_stop(h, down)
