"""The isolate tuning's cpusets: the CPUs held for the experiment by the
kernel's cpuset controller, not only by each thread's affinity.

On a cgroup v1 cpuset hierarchy (``/sys/fs/cgroup/cpuset``), a phase that
isolates CPUs makes two cpusets under the root: ``loopscope-rt-<pid>``,
holding the isolated CPUs with ``cpu_exclusive`` 1 (no other cpuset may
claim them while it stands), and ``loopscope-rest-<pid>``, holding the
other CPUs, into which every task the isolation moves goes. A task in the
rest cpuset cannot be given the isolated CPUs back by anyone's
``sched_setaffinity`` (the kernel refuses a mask outside its cpuset), and
the threads and processes it starts during the phase are born there, so
they never run on the CPUs even before the watcher's next sweep. The lab
(the controller's or agent's own tree) stays in the root cpuset.

Only tasks of the root cpuset are moved: a task in a cpuset of its own (a
container's) is kept off the CPUs by its affinity alone, and said. Kernel
threads are never moved into a cpuset (their CPUs are the kernel's to set;
the affinity watcher moves those that may be moved).

Both cpusets are in the tunings' journal before they exist. Giving back
moves every task in the rest cpuset, those born there included, back to
the root and removes both; each moved thread's old affinity is then given
back from the journal (``host/isolate.py``). ``loopscope cleanup`` does the
same from a journal a killed run left. On a cgroup v2 machine the isolated
partition (``cpuset.cpus.partition``) is not made at run time: the phase
says so, and affinity alone keeps the tasks off.
"""

from __future__ import annotations

import os
from pathlib import Path

V1 = Path("/sys/fs/cgroup/cpuset")


def v1_root() -> Path | None:
    """The v1 cpuset hierarchy's root, when this machine has one that can be written."""
    return V1 if (V1 / "cpuset.cpus").exists() and os.access(V1 / "tasks", os.W_OK) else None


def _cpus_text(cpus: list[int]) -> str:
    return ",".join(map(str, sorted(cpus)))


class Shield:
    """The two cpusets of one isolation: made by ``make``, filled by ``enter``, removed by ``dissolve``."""

    def __init__(self, root: Path, cpus: set[int], others: list[int], tag: str) -> None:
        self.root = root
        self.cpus, self.others = cpus, others
        self.rt = root / f"loopscope-rt-{tag}"
        self.rest = root / f"loopscope-rest-{tag}"

    @property
    def paths(self) -> list[str]:
        """What the journal keeps: the cpusets to dissolve after a kill."""
        return [str(self.rest), str(self.rt)]

    def make(self) -> None:
        """Both cpusets, with their CPUs and the root's memory nodes; OSError when the kernel refuses."""
        mems = (self.root / "cpuset.mems").read_text().strip()
        for d, cpus in ((self.rest, self.others), (self.rt, sorted(self.cpus))):
            d.mkdir(exist_ok=True)
            (d / "cpuset.cpus").write_text(_cpus_text(cpus))
            (d / "cpuset.mems").write_text(mems)
        (self.rt / "cpuset.cpu_exclusive").write_text("1")

    def enter(self, tid: int) -> bool:
        """Thread ``tid`` into the rest cpuset (False: gone, or refused)."""
        try:
            (self.rest / "tasks").write_text(str(tid))
            return True
        except OSError:
            return False


def of(tid: int) -> str | None:
    """The cpuset thread ``tid`` is in (``/``: the root; None: gone)."""
    try:
        return Path(f"/proc/{tid}/cpuset").read_text().strip()
    except OSError:
        return None


def dissolve(paths: list[str]) -> list[str]:
    """Every task in these cpusets back to their parent, then the cpusets
    removed (the journal's list, or a live shield's); the problems."""
    problems = []
    for p in map(Path, paths):
        if not p.is_dir():
            continue
        for _ in range(5):  # (a task forking while it is moved: the new one is read on the next pass)
            try:
                tids = (p / "tasks").read_text().split()
            except OSError:
                break
            if not tids:
                break
            for t in tids:
                try:
                    (p.parent / "tasks").write_text(t)
                except OSError:
                    pass  # gone meanwhile
        try:
            p.rmdir()
        except OSError as e:
            problems.append(f"cpuset {p}: could not remove it ({e.strerror}); `loopscope cleanup` tries again")
    return problems


def leftovers() -> list[Path]:
    """An isolation's cpusets whose process (the controller or agent that made them) is gone."""
    root = v1_root()
    out = []
    for d in sorted(root.glob("loopscope-r*-*")) if root is not None else []:
        pid = d.name.rsplit("-", 1)[-1]
        if d.is_dir() and pid.isdigit() and not Path(f"/proc/{pid}").exists():
            out.append(d)
    return out
