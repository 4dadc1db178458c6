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

import os
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


def _v1_cpu_hierarchy() -> int:
    """cgroup v1 ``cpu``'s hierarchy id (/proc/cgroups), 0 when it has none."""
    for line in (_read(Path("/proc/cgroups")) or "").splitlines()[1:]:
        f = line.split()
        if len(f) >= 2 and f[0] == "cpu":
            return int(f[1])
    return 0


#: groups walked at most: a machine with more is looked at no deeper (the snapshot stays cheap)
MAX_GROUPS = 4096


def snapshot() -> list[dict[str, object]]:
    """Every group with a CPU limit on this kernel, its counters and its
    threads now (``rundir.CpuLimit``'s fields): cgroup v1 ``cpu`` and v2."""
    out: list[dict[str, object]] = []
    for root, hier in ((V1_CPU, _v1_cpu_hierarchy()), (V2, 0)):
        if not root.is_dir() or (root == V2 and not (root / "cgroup.controllers").exists()):
            continue
        seen = 0
        for d, dirs, _ in os.walk(root):
            seen += 1
            if seen > MAX_GROUPS:
                break
            rel = "/" + os.path.relpath(d, root) if d != str(root) else "/"
            lim = _limit_at(root, rel)
            if lim is None:
                continue
            tids = [int(t) for t in (_read(Path(d) / ("tasks" if root == V1_CPU else "cgroup.threads")) or "").split() if t.isdigit()]
            out.append(
                {
                    "path": lim.path,
                    "hierarchy": hier,
                    "quota_us": lim.quota_us,
                    "period_us": lim.period_us,
                    "nr_throttled": lim.nr_throttled,
                    "throttled_ns": lim.throttled_ns,
                    "tids": tids,
                }
            )
    return out


#: groups loopscope's benches and tests make (the cause zoo's throttle case, the throttle test)
OWN_GROUPS = ("ls-zoo-throttle", "ls-test-throttle-")
#: the name of the injector that holds the zoo's group while it runs
INJECTOR = "zoo-throttle"


def _injector_alive() -> bool:
    for d in Path("/proc").iterdir():
        if d.name.isdigit() and (_read(d / "comm") or "").strip() == INJECTOR:
            return True
    return False


#: groups an agent makes for a phase's ``limit`` tuning: ls-limit-<agent pid>-<load>
LIMIT_PREFIX = "ls-limit-"


def _limit_owner_gone(g: Path) -> bool:
    pid = g.name[len(LIMIT_PREFIX) :].partition("-")[0]
    return not pid.isdigit() or not Path(f"/proc/{pid}").exists()


def leftovers() -> list[Path]:
    """Groups of loopscope's own with a CPU limit that a killed bench, test or agent left behind."""
    injector = _injector_alive()
    out = []
    for root in (V1_CPU, V2):
        if root.is_dir():
            out += [g for g in root.iterdir() if g.is_dir() and not injector and g.name.startswith(OWN_GROUPS)]
            out += [g for g in root.iterdir() if g.is_dir() and g.name.startswith(LIMIT_PREFIX) and _limit_owner_gone(g)]
    return out


def limit_threads(name: str, cpus: float, tids: list[int], own: Path | None) -> Path | None:
    """Hold the threads ``tids`` (a load) to ``cpus`` CPUs' worth of time in
    every 100 ms (every second below 0.01 CPU, as a quota is 1 ms at least): in ``own`` (the load's cgroup v2 group) where it has the
    cpu controller, else in a group of their own (``LIMIT_PREFIX``, this
    process's pid and ``name``; what the caller removes with ``remove``,
    None when ``own`` was limited). New threads and children of theirs stay
    in it (a cgroup is inherited at fork)."""
    period = 100_000 if cpus >= 0.01 else 1_000_000
    quota = max(1000, round(cpus * period))
    if own is not None and (own / "cpu.max").exists():
        (own / "cpu.max").write_text(f"{quota} {period}")
        return None
    g = make(f"{LIMIT_PREFIX}{os.getpid()}-{name}", quota, period)
    procs = "tasks" if (g / "tasks").exists() else "cgroup.procs"
    for t in tids:
        try:
            (g / procs).write_text(str(t))
        except ProcessLookupError:
            pass  # the thread ended meanwhile
        except OSError as e:
            if e.errno != 3:  # ESRCH
                remove(g)
                raise
    return g


def remove(group: Path) -> None:
    """Every task of ``group`` back to its hierarchy's root, then the group removed."""
    procs = "tasks" if (group / "tasks").exists() else "cgroup.procs"
    for t in (_read(group / procs) or "").split():
        try:
            (group.parent / procs).write_text(t)
        except OSError:
            pass  # gone meanwhile
    try:
        group.rmdir()
    except OSError:
        pass


def _root() -> tuple[Path, bool] | None:
    """The hierarchy that limits CPU time here, and whether it is cgroup v2."""
    if (V1_CPU / "cpu.cfs_quota_us").exists():
        return V1_CPU, False
    if "cpu" in (_read(V2 / "cgroup.subtree_control") or "").split():
        return V2, True
    return None


def missing() -> str | None:
    """Why no group with a CPU limit can be made here, or None."""
    if os.geteuid() != 0:
        return "needs root (a cgroup with a CPU limit)"
    if _root() is None:
        return "no cgroup v1 cpu controller, and cgroup v2 has no cpu controller enabled at its root"
    return None


def group_dir(name: str) -> Path | None:
    got = _root()
    return None if got is None else got[0] / name


def make(name: str, quota_us: int, period_us: int) -> Path:
    """A group ``name`` under the root allowed ``quota_us`` of every ``period_us``."""
    got = _root()
    if got is None:
        raise OSError(missing())
    root, v2 = got
    g = root / name
    g.mkdir(exist_ok=True)
    if v2:
        (g / "cpu.max").write_text(f"{quota_us} {period_us}")
    else:
        (g / "cpu.cfs_period_us").write_text(str(period_us))
        (g / "cpu.cfs_quota_us").write_text(str(quota_us))
    return g


def lift(path: str) -> tuple[str, str] | None:
    """The file and value that remove the CPU limit of group ``path`` (what a write tuning sets), or None."""
    got = _root()
    if got is None:
        return None
    root, v2 = got
    d = root / path.lstrip("/")
    return (str(d / "cpu.max"), "max") if v2 else (str(d / "cpu.cfs_quota_us"), "-1")
