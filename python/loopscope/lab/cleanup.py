"""``loopscope cleanup``: remove what killed runs left behind.

A run cleans up after itself on every exit path it can see (Ctrl-C, a
failing component, a crashed agent, its controller killed: the agents then
get SIGTERM from the kernel and clean up, and the reaper deletes the
namespaces). What remains after the controller, the agents and the reaper
were all SIGKILLed is found four ways: the state files of runs whose
controller is gone, cgroups under ``loopscope/`` that belong to no live
run, processes whose environment names a run that is not running any more,
network namespaces named ``ls-<tag>-*`` whose tag is no live run's (and a
bench's or test's fleet, ``lsf<pid>-*``, whose process is gone), and
kernel trace instances named ``loopscope-<run id>`` (or ``loopscope-<pid>``
for a capture outside a run, ``loopscope-foreign-<pid>`` for a bench's
trace-cmd recording) whose run or process is gone, and an
isolation's cpusets (``loopscope-rt-<pid>``, ``loopscope-rest-<pid>``)
whose maker is gone, and scratch directories (``ls-<what>-<pid>-*`` under
the temporary directory: a bench's, an audit's) whose maker is gone. A tunings journal is given back when its run is not
running, or, for an agent's, when its owner is gone.

What the network of a run holds lives inside its namespaces and goes with
them: the router's forwarding rules (``ip rule`` blackholes) in the router
namespace, the sync network's veths between the hosts' namespaces, the
emulator's socket filters with its sockets. No qdisc and no BPF program is
attached outside a namespace, so there is nothing else to find.
"""

from __future__ import annotations

import os
import re
import time
from pathlib import Path


from loopscope.lab import netns, state
from loopscope.host import procs, tunings
from loopscope.host.cgroup import RunGroup, find_root
from loopscope.errors import InputError
from loopscope.rundir import RunDir
from loopscope.kernel.capture import INSTANCE_PREFIX, leftover_instances, remove_instance
from loopscope.kernel.tracing import run_instances
from loopscope.host import swapfile
from loopscope.host import scratch, shared
from loopscope.host import cpulimit, cpuset


def _run_ids_in_environments() -> dict[str, list[int]]:
    out: dict[str, list[int]] = {}
    me = os.getpid()
    for d in Path("/proc").iterdir():
        if not d.name.isdigit() or int(d.name) == me:
            continue
        try:
            env = (d / "environ").read_bytes().split(b"\0")
        except OSError:
            continue
        for kv in env:
            if kv.startswith(b"LOOPSCOPE_RUN="):
                out.setdefault(kv[14:].decode(errors="replace"), []).append(int(d.name))
    return out


def clean_run(info: state.RunState, dry_run: bool, reason: str | None = None) -> list[str]:
    """Remove what one dead run left: agents, processes, namespaces, cgroups."""
    actions: list[str] = []
    verb = "would " if dry_run else ""
    rid = info.run_id
    pid = info.controller_pid
    actions.append(f"run {rid}: {reason or f'its controller (pid {pid}) is gone'}")
    journal = state.state_dir() / f"{rid}.tunings"
    if journal.exists():
        # the settings a phase tuned, given back (the journal holds their old values)
        actions += [f"  {verb}restore the tunings in {journal}"] if dry_run else tunings.restore_journal(journal)
    agents = list(info.agents)
    if info.agent_pid and not any(a.pid == info.agent_pid for a in agents):
        agents.append(state.AgentEntry(pid=info.agent_pid, start=info.agent_start, host="localhost"))
    for a in agents:
        if a.pid and procs.alive(a.pid, a.start):
            actions.append(f"  {verb}stop its agent on {a.host} (pid {a.pid})")
            if not dry_run:
                procs.terminate_pid(a.pid)
    pids = procs.pids_of_run(rid)
    if pids:
        actions.append(f"  {verb}kill {len(pids)} processes of run {rid}: {', '.join(map(str, sorted(pids)))}")
        if not dry_run:
            for pid in pids:
                procs.terminate_pid(pid)
    gone = [n for n in info.namespaces if n in netns.existing()]
    if gone:
        actions.append(f"  {verb}delete network namespaces {', '.join(gone)}")
        if not dry_run:
            netns.delete_namespaces(gone)
    cgs = [c for c in [info.cgroup, *info.cgroups] if c]
    for cg in cgs:
        if Path(cg).exists():
            actions.append(f"  {verb}kill and remove cgroup {cg} ({len(RunGroup.pids(Path(cg)))} processes)")
            if not dry_run:
                RunGroup.remove(Path(cg))
                parent = Path(cg).parent
                if parent.name == rid:
                    RunGroup.remove(parent)
    for name in run_instances(rid):
        actions.append(f"  {verb}remove its kernel trace instance {name} (still recording)")
        if not dry_run:
            remove_instance(name)
    root, _ = find_root()
    if root is not None and (root / rid).exists() and not dry_run:
        # an agent still finishing its own clean-up may hold a host's group a moment longer
        end = time.monotonic() + 5
        while (root / rid).exists() and not RunGroup.remove(root / rid) and time.monotonic() < end:
            time.sleep(0.1)
    rd = Path(info.run_dir)
    rj = rd / "run.json"
    if rj.exists() and not dry_run:
        try:
            r = RunDir(rd).record()
            if r.status == "running":
                r.status = "abandoned"
                r.error = f"the run was killed ({reason or 'its controller is gone'}); loopscope cleanup removed what it left"
                RunDir(rd).write_record(r)
                actions.append(f"  marked {rj} abandoned")
        except (OSError, InputError, ValueError):
            pass
    if not dry_run:
        state.unregister(rid)
    return actions


def run(dry_run: bool = False) -> list[str]:
    actions: list[str] = []
    live: set[str] = set()
    verb = "would " if dry_run else ""
    for info in state.registered():
        if procs.alive(info.controller_pid, info.controller_start):
            live.add(info.run_id)
            continue
        actions += clean_run(info, dry_run)
    live_tags = {netns.tag_of(r) for r in live}
    stray = [n for n in netns.existing() if n[len(netns.PREFIX) :].split("-", 1)[0] not in live_tags]
    if stray:
        actions.append(f"{verb}delete leftover network namespaces {', '.join(stray)}")
        if not dry_run:
            netns.delete_namespaces(stray)
    fleets = netns.leftover_fleets()
    if fleets:
        actions.append(f"{verb}delete the namespaces of fleets whose bench or test is gone: {', '.join(fleets)}")
        if not dry_run:
            netns.delete_namespaces(fleets, prefix="lsf")
    for rid, pids in _run_ids_in_environments().items():
        if rid in live:
            continue
        actions.append(f"  {verb}kill {len(pids)} processes of run {rid}: {', '.join(map(str, sorted(pids)))}")
        if not dry_run:
            for pid in pids:
                procs.terminate_pid(pid)

    # a journal no registered run owns: a run that could not give everything back said so, and left it to try again
    for journal in tunings.newest_first(list(state.state_dir().glob("*.tunings"))) if state.state_dir().is_dir() else []:
        rid = journal.name[: -len(".tunings")]
        if rid in live or journal.exists() is False or tunings.owner_alive(journal):
            continue  # (an agent's journal, ``<run>.agent<pid>.tunings``, is its owner's while the agent runs)
        actions.append(f"{verb}restore the tunings a finished run left in {journal}")
        if not dry_run:
            actions += tunings.restore_journal(journal)
            if journal.exists():  # what still cannot be given back (its threads gone, a file refused) is said, and dropped
                journal.unlink()

    for d in cpuset.leftovers():
        actions.append(f"{verb}remove the cpuset {d} an isolation left (its tasks back in the root cpuset)")
        if not dry_run:
            actions += [f"  could not: {p}" for p in cpuset.dissolve([str(d)])]

    for name in leftover_instances():
        owner = name[len(INSTANCE_PREFIX) :]
        mine = re.fullmatch(r"(?:[a-z]+-)?(\d+)", owner)  # loopscope-<pid>, or loopscope-<word>-<pid> (a bench's recording)
        if owner in live or (mine is not None and Path(f"/proc/{mine.group(1)}").exists()):
            continue
        actions.append(f"{verb}remove leftover kernel trace instance {name} (its buffers)")
        if not dry_run:
            remove_instance(name)

    for sw in swapfile.leftovers():
        actions.append(f"{verb}turn off and delete leftover swap file {sw}")
        if not dry_run:
            swapfile.remove(sw)

    for d in scratch.leftovers():
        actions.append(f"{verb}delete the scratch directory {d} its maker left (it is gone)")
        if not dry_run:
            scratch.remove(d)

    for f in shared.leftovers():
        actions.append(f"{verb}delete leftover shared-memory file {f}")
        if not dry_run:
            shared.remove(f)

    for g in cpulimit.leftovers():
        actions.append(f"{verb}give back and remove leftover CPU-limited cgroup {g}")
        if not dry_run:
            cpulimit.remove(g)
    root, _ = find_root()
    if root is not None and root.exists():
        for g in sorted(p for p in root.iterdir() if p.is_dir()):
            if g.name in live:
                continue
            actions.append(f"{verb}kill and remove leftover cgroup {g}")
            if not dry_run:
                RunGroup.remove(g)
        if not dry_run and not live:
            try:
                root.rmdir()
            except OSError:
                pass
    return actions
