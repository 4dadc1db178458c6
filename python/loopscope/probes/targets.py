"""The threads an attach target names on this host now: a process's threads,
those whose name matches a pattern, those of a cgroup; and why a target
matches none. Read from /proc and the cgroup file system; used by the
``threads`` probe while it runs and by its parameters' check before a run."""

from __future__ import annotations

import os
import re
from pathlib import Path


def tasks(pid: int) -> dict[int, str]:
    """A process's threads now (tid → name); {} once it is gone. The main
    thread of a process with others is named ``<name> (main)``: programs
    often give their workers the process's own name (cyclictest does), and
    threads are compared by name."""
    out = {}
    try:
        for t in os.listdir(f"/proc/{pid}/task"):
            try:
                out[int(t)] = Path(f"/proc/{pid}/task/{t}/comm").read_text().strip()
            except OSError:
                continue
    except OSError:
        pass
    if len(out) > 1 and pid in out:
        out[pid] += " (main)"
    return out


def named(rx: str, skip: set[int]) -> dict[int, str]:
    """Every thread on the host whose name matches ``rx`` (not those in ``skip``)."""
    pat = re.compile(rx)
    out = {}
    for p in os.listdir("/proc"):
        if not p.isdigit():
            continue
        for tid, comm in tasks(int(p)).items():
            if tid not in skip and pat.search(comm):
                out[tid] = comm
    return out


def in_cgroup(path: str) -> dict[int, str]:
    """The threads of a cgroup (v2: cgroup.threads)."""
    base = Path(path) if path.startswith("/sys/fs/cgroup") else Path("/sys/fs/cgroup") / path.lstrip("/")
    out = {}
    try:
        for t in (base / "cgroup.threads").read_text().split():
            try:
                out[int(t)] = Path(f"/proc/{t}/comm").read_text().strip()
            except OSError:
                continue
    except OSError:
        pass
    return out


def problem(pid: int | None, comm: str | None, cgroup: str | None) -> str | None:
    """Why an attach target (a pid, a name pattern, a cgroup) matches nothing
    on this host now (None: it does)."""
    if pid is not None and not Path(f"/proc/{pid}").exists():
        return f"attach: pid {pid}: no such process on this host"
    if comm is not None and not named(comm, {os.getpid()}):
        return f"attach: comm {comm!r}: no thread of that name runs on this host"
    if cgroup is not None:
        base = Path(cgroup) if cgroup.startswith("/sys/fs/cgroup") else Path("/sys/fs/cgroup") / cgroup.lstrip("/")
        if not (base / "cgroup.threads").exists():
            return f"attach: cgroup {cgroup}: no such cgroup (v2) on this host"
        if not in_cgroup(cgroup):
            return f"attach: cgroup {cgroup}: it holds no thread"
    return None
