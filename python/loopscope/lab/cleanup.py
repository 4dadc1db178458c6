"""``loopscope cleanup``: remove what killed runs left behind.

A run cleans up after itself on every exit path it can see (Ctrl-C, a
failing component, a crashed agent, its controller killed: the agent then
gets SIGTERM from the kernel and cleans up). What remains after both the
controller and the agent were SIGKILLed is found three ways: the state files
of runs whose controller is gone, cgroups under ``loopscope/`` that belong
to no live run, and processes whose environment names a run that is not
running any more.
"""

from __future__ import annotations

import json
import os
from pathlib import Path

from loopscope.lab import procs, state
from loopscope.lab.cgroup import RunGroup, find_root


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


def run(dry_run: bool = False) -> list[str]:
    actions: list[str] = []
    live: set[str] = set()
    verb = "would " if dry_run else ""
    for info in state.registered():
        rid = info["run_id"]
        if procs.alive(info["controller_pid"], info.get("controller_start")):
            live.add(rid)
            continue
        actions.append(f"run {rid}: its controller (pid {info['controller_pid']}) is gone")
        apid = info.get("agent_pid")
        if apid and procs.alive(apid, info.get("agent_start")):
            actions.append(f"  {verb}stop its agent (pid {apid})")
            if not dry_run:
                procs.terminate_pid(apid)
        cg = info.get("cgroup")
        if cg and Path(cg).exists():
            actions.append(f"  {verb}kill and remove cgroup {cg} ({len(RunGroup.pids(Path(cg)))} processes)")
            if not dry_run:
                RunGroup.remove(Path(cg))
        rd = Path(info.get("run_dir", ""))
        rj = rd / "run.json"
        if rj.exists() and not dry_run:
            try:
                r = json.loads(rj.read_text())
                if r.get("status") == "running":
                    r["status"] = "abandoned"
                    r["error"] = "the run was killed; loopscope cleanup removed what it left"
                    rj.write_text(json.dumps(r, indent=1) + "\n")
                    actions.append(f"  marked {rj} abandoned")
            except (OSError, json.JSONDecodeError):
                pass
        if not dry_run:
            state.unregister(rid)
    for rid, pids in _run_ids_in_environments().items():
        if rid in live:
            continue
        actions.append(f"  {verb}kill {len(pids)} processes of run {rid}: {', '.join(map(str, sorted(pids)))}")
        if not dry_run:
            for pid in pids:
                procs.terminate_pid(pid)
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
