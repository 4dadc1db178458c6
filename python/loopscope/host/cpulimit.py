"""The CPU limit over a thread: which cgroup caps its CPU time, and how often it throttled.

CFS bandwidth control (cgroup v1 ``cpu.cfs_quota_us`` / ``cpu.cfs_period_us``,
v2 ``cpu.max``) lets a group run ``quota`` of every ``period`` and then
holds all of its tasks, runnable, until the next period: the commonest
cause of latency in containers. A limit on any group above a thread's holds
it too, so ``limit_of`` walks from the thread's own group (its ``cpu``
controller's line of ``/proc/TID/cgroup``, or the v2 line) up to the root and
names the nearest group that has one, with its quota, period and throttle
counters (``cpu.stat``: ``nr_throttled``, ``throttled_time`` in ns on v1,
``throttled_usec`` on v2). Attribution labels a thread's runnable time on an
idled CPU ``throttled: <that path>`` (``crates/ktrace`` ``attrib``).

The kernel records no event when a group is throttled: the evidence in a
trace is a task switched out runnable to the idle task, and the group's
``cpu.stat`` says it happened (docs/explain.md says how to check both).
"""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path

#: where the hierarchies are mounted (v1: one directory per controller)
V1_CPU = Path("/sys/fs/cgroup/cpu")
V2 = Path("/sys/fs/cgroup")


@dataclass(frozen=True)
class Limit:
    """A group's CPU limit and what it has done so far."""

    path: str
    quota_us: int
    period_us: int
    nr_throttled: int
    throttled_ns: int


def _group_of(tid: int) -> tuple[str, Path] | None:
    """(the thread's ``cpu`` group path, its hierarchy's root), v1 first."""
    try:
        lines = Path(f"/proc/{tid}/cgroup").read_text().splitlines()
    except OSError:
        return None
    v2 = None
    for line in lines:
        _, ctrls, path = line.split(":", 2)
        if "cpu" in ctrls.split(","):
            return path, V1_CPU
        if ctrls == "":
            v2 = path
    return (v2, V2) if v2 is not None else None


def _read(p: Path) -> str | None:
    try:
        return p.read_text()
    except OSError:
        return None


def _stat(d: Path) -> dict[str, int]:
    out = {}
    for line in (_read(d / "cpu.stat") or "").splitlines():
        k, _, v = line.partition(" ")
        if v.strip().isdigit():
            out[k] = int(v)
    return out


def _limit_at(root: Path, path: str) -> Limit | None:
    """The limit set on one group, or None."""
    d = root / path.lstrip("/")
    quota = _read(d / "cpu.cfs_quota_us")
    if quota is not None:
        q, per = int(quota), int(_read(d / "cpu.cfs_period_us") or 100_000)
    else:
        mx = (_read(d / "cpu.max") or "max").split()
        if mx[0] == "max":
            return None
        q, per = int(mx[0]), int(mx[1]) if len(mx) > 1 else 100_000
    if q < 0:
        return None
    st = _stat(d)
    ns = st.get("throttled_time", st.get("throttled_usec", 0) * 1000)
    return Limit(path or "/", q, per, st.get("nr_throttled", 0), ns)


def limit_of(tid: int) -> Limit | None:
    """The nearest group over thread ``tid`` with a CPU limit, or None (no
    limit, no such thread, no cgroup ``cpu`` controller)."""
    got = _group_of(tid)
    if got is None:
        return None
    path, root = got
    parts = [p for p in path.split("/") if p]
    for n in range(len(parts), -1, -1):
        lim = _limit_at(root, "/" + "/".join(parts[:n]))
        if lim is not None:
            return lim
    return None


def limits(tids: list[int]) -> dict[int, str]:
    """Each of ``tids`` under a CPU limit → the limited group's path."""
    out = {}
    for t in tids:
        lim = limit_of(t)
        if lim is not None:
            out[t] = lim.path
    return out
