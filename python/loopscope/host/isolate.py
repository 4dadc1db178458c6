"""The ``isolate`` tuning: some CPUs kept for the experiment during a phase, at run time.

What the kernel lets a running machine change, and nothing it does not:
every thread whose affinity the kernel lets anyone change (a kthread
flagged PF_NO_SETAFFINITY is per-CPU: it stays, and is said) goes to the
other CPUs, unless it belongs to the lab (a descendant of the controller:
its agents, probes, loads and capture, which the lab places itself). A
watcher moves the threads started during the phase too, every
``WATCH_S``. Every IRQ whose affinity includes the CPUs and that accepts a
new one (a managed IRQ refuses: said), the receive queues' packet steering
(RPS) and the unbound workqueues' mask leave the CPUs too, and, when
asked, ``kernel.timer_migration`` goes to 0. Where the machine has v1
cpusets, the moved tasks also go into the isolation's cpuset over the
other CPUs (``host/cpuset.py``), which keeps what they start off the CPUs
from birth. The files are ``Change``s of
the tunings' journal (``host/tunings.py``); each moved thread's old
affinity is in the same journal (its tid and start time, so a reused tid
is never touched), written before the move, so ``restore`` (and ``loopscope
cleanup`` after a kill -9) gives every one back. What needs a reboot
(nohz_full, rcu_nocbs, per-CPU kthreads, managed IRQs) is said in
``boot_only``, never attempted.
"""

from __future__ import annotations

import os
import re
import threading
import time
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Callable

from loopscope.host import cpuset

PF_NO_SETAFFINITY = 0x04000000
PF_KTHREAD = 0x00200000
#: a workqueue's worker: a bound one is per-CPU, an unbound one follows the workqueues' cpumask (which isolate writes)
PF_WQ_WORKER = 0x00000020
WATCH_S = 0.1


@dataclass
class Moved:
    """One thread moved off the CPUs: how to find it again and what it was allowed."""

    tid: int
    start: int  # its start time in clock ticks since boot (/proc/TID/stat field 22): a reused tid differs
    old: list[int]
    comm: str = ""
    new: list[int] = field(default_factory=list)
    #: when the isolation began (clock ticks since boot): threads started after it inherit ``new`` from a moved parent
    began: int = 0


@dataclass
class Isolation:
    """What an isolate tuning did; ``moved`` and ``boot_only`` go to the journal and run.json."""

    cpus: list[int]
    moved: list[Moved] = field(default_factory=list)
    boot_only: list[str] = field(default_factory=list)
    #: the cpusets made, or why none was (``host/cpuset.py``)
    cpuset: str = "none"

    def as_dict(self) -> dict[str, object]:
        return {"cpus": self.cpus, "moved": [asdict(m) for m in self.moved], "boot_only": self.boot_only}


def _stat(tid_dir: Path) -> tuple[str, int, int, int] | None:
    """(comm, ppid, flags, start time) of a thread, or None when it is gone."""
    try:
        st = (tid_dir / "stat").read_text()
    except OSError:
        return None
    rest = st[st.rindex(")") + 2 :].split()
    return st[st.index("(") + 1 : st.rindex(")")], int(rest[1]), int(rest[6]), int(rest[19])


def lab_pids(root: int) -> set[int]:
    """``root`` and every process descending from it (the lab: the controller's own tree)."""
    children: dict[int, list[int]] = {}
    for p in Path("/proc").iterdir():
        if p.name.isdigit() and (s := _stat(p)) is not None:
            children.setdefault(s[1], []).append(int(p.name))
    out, todo = set(), [root]
    while todo:
        x = todo.pop()
        if x not in out:
            out.add(x)
            todo += children.get(x, [])
    return out


def threads() -> list[tuple[int, int, Path]]:
    """(pid, tid, its /proc directory) of every thread on the machine."""
    out = []
    for p in Path("/proc").iterdir():
        if not p.name.isdigit():
            continue
        try:
            out += [(int(p.name), int(t.name), t) for t in (p / "task").iterdir()]
        except OSError:
            continue
    return out


class Mover:
    """Moves every movable thread off ``cpus`` (the lab's apart), now and while
    the phase lasts; ``journal`` is called with each thread before it moves."""

    def __init__(self, cpus: list[int], journal: Callable[[list[Moved]], None], lab_root: int | None = None, shield: cpuset.Shield | None = None) -> None:
        self.cpus = set(cpus)
        #: the cpusets the moved tasks go into (``host/cpuset.py``), when the machine has them
        self.shield = shield
        #: tasks in a cpuset of their own (a container's), kept off by their affinity alone
        self.apart: list[str] = []
        self.journal = journal
        self.lab_root = lab_root or os.getpid()
        self.seen: set[tuple[int, int]] = set()
        self.lab: set[int] = set()
        self.bound: list[str] = []
        self.stop_ev = threading.Event()
        self.thread: threading.Thread | None = None
        self.began = now_ticks()

    def sweep(self) -> int:
        """One pass over every thread: those allowed on the CPUs moved off, all
        journaled at once before any moves (one write of the journal: under a
        storm of fsyncs, one a thread took seconds). How many moved.

        The threads are listed before the lab's tree is walked: a process the
        lab starts between the two (a phase's probe) is then in the tree, not
        taken for a stray and moved off the CPUs it is to measure."""
        listed = threads()
        self.lab = lab_pids(self.lab_root)
        todo: list[Moved] = []
        kthreads: list[bool] = []
        for pid, tid, d in listed:
            s = _stat(d)
            if s is None or (tid, s[3]) in self.seen:
                continue
            self.seen.add((tid, s[3]))
            if pid in self.lab:
                continue
            try:
                old = sorted(os.sched_getaffinity(tid))
            except OSError:
                continue
            if not self.cpus & set(old):
                continue
            if s[2] & PF_NO_SETAFFINITY:
                self.bound.append(f"{s[0]} ({tid})")
                continue
            if s[2] & PF_WQ_WORKER or s[0].startswith("kworker/"):
                continue  # the workqueues' cpumask moves it, and gives it back (a pool's new worker may not carry the flag yet)
            rest = [c for c in old if c not in self.cpus]
            if not rest:  # pinned to the CPUs alone: the machine's other CPUs
                rest = [c for c in range(os.cpu_count() or 1) if c not in self.cpus]
            todo.append(Moved(tid, s[3], old, s[0], rest, self.began))
            kthreads.append(bool(s[2] & PF_KTHREAD))
        if not todo:
            return 0
        self.journal(todo)
        n = 0
        for m, kthread in zip(todo, kthreads):
            try:
                os.sched_setaffinity(m.tid, m.new)
                n += 1
            except OSError:
                continue  # gone, or refused (a kthread the flag did not say): its journal line restores nothing harmful
            if self.shield is not None and not kthread:
                where = cpuset.of(m.tid)
                if where == "/":
                    self.shield.enter(m.tid)
                elif where is not None and len(self.apart) < 20:
                    self.apart.append(f"{m.comm} ({m.tid}) in cpuset {where}")
        return n

    def start(self) -> None:
        """Sweep now, then every ``WATCH_S`` until ``stop``: threads started during the phase are caught."""
        self.sweep()
        self.thread = threading.Thread(target=self._watch, name="ls-isolate", daemon=True)
        self.thread.start()

    def _watch(self) -> None:
        while not self.stop_ev.wait(WATCH_S):
            self.sweep()

    def stop(self) -> None:
        self.stop_ev.set()
        if self.thread is not None:
            self.thread.join(5)


def now_ticks() -> int:
    """Clock ticks since boot (the unit of a thread's start time)."""
    return int(float(Path("/proc/uptime").read_text().split()[0]) * os.sysconf("SC_CLK_TCK"))


def _inherited(moved: list[Moved]) -> list[Moved]:
    """Threads started during the isolation by a moved thread's process (its own
    new threads, or its children), holding the moved affinity they inherited:
    given the parent's old one back too (they were never on the CPUs' list)."""
    if not moved:
        return []
    by_pid = {m.tid: m for m in moved}
    began = min(m.began for m in moved)
    out = []
    for pid, tid, d in threads():
        s = _stat(d)
        if s is None or tid in by_pid or s[3] < began or s[2] & PF_KTHREAD:
            continue  # (a kthread's CPUs are the kernel's to set, whoever started it: kthreadd was moved)
        parent = by_pid.get(pid) if pid != tid else by_pid.get(s[1])
        try:
            if parent is not None and sorted(os.sched_getaffinity(tid)) == parent.new:
                out.append(Moved(tid, s[3], parent.old, s[0], parent.new, began))
        except OSError:
            continue
    return out


def _exiting(tid: int, wait_s: float = 0.5) -> bool:
    """Thread ``tid`` is gone, or dying (a zombie, or gone within ``wait_s``):
    a task killed while the isolation ends refuses its CPUs, and has none to need."""
    deadline = time.monotonic() + wait_s
    while True:
        try:
            st = Path(f"/proc/{tid}/stat").read_text()
        except OSError:
            return True
        if st[st.rindex(")") + 2 :].split()[0] in ("Z", "X"):
            return True
        if time.monotonic() > deadline:
            return False
        time.sleep(0.02)


def give_back(moved: list[Moved], cpusets: list[str] | None = None) -> list[str]:
    """Every moved thread that still is the same thread gets its old affinity,
    and so do those that inherited the moved one, once the isolation's
    cpusets are dissolved (their tasks back in the root, where the old CPUs
    are allowed again); the problems."""
    moved = moved + _inherited(moved)  # (known by the affinity they inherited, before leaving the cpuset resets it)
    problems = cpuset.dissolve(cpusets or [])
    for m in reversed(moved):
        s = _stat(Path(f"/proc/{m.tid}/task/{m.tid}")) or _stat(Path(f"/proc/{m.tid}"))
        if s is None or s[3] != m.start:
            continue  # gone (or its tid reused): nothing of it to give back
        try:
            os.sched_setaffinity(m.tid, m.old)
        except OSError as e:
            if not _exiting(m.tid):
                problems.append(f"thread {m.comm} ({m.tid}): could not give back CPUs {m.old} ({e.strerror})")
    return problems


def mask_without(text: str, cpus: set[int]) -> str:
    """A hex CPU mask (``ff`` or ``00000000,000000ff``) with ``cpus`` cleared, in the same layout."""
    words = text.strip().split(",")
    value = int("".join(words), 16)
    for c in cpus:
        value &= ~(1 << c)
    width = sum(len(w) for w in words)
    digits = f"{value:0{width}x}"
    out, i = [], 0
    for w in words:
        out.append(digits[i : i + len(w)])
        i += len(w)
    return ",".join(out)


def cpu_list(text: str) -> list[int]:
    """A kernel CPU list (``0-2,5``; isolcpus's flags and ``:n/m`` strides skipped) → [0, 1, 2, 5]."""
    out: set[int] = set()
    for part in text.strip().split(","):
        m = re.fullmatch(r"(\d+)(?:-(\d+))?(?::\d+/\d+)?", part.strip())
        if m:
            a = int(m.group(1))
            out.update(range(a, int(m.group(2) or a) + 1))
    return sorted(out)


def cpus_without(text: str, cpus: set[int]) -> list[int]:
    """A CPU list (``0-3,5``) without ``cpus``."""
    return sorted(set(cpu_list(text)) - cpus)


def snapshot() -> dict[str, str]:
    """Every thread's allowed CPUs and cpuset, the cpusets, and every file isolate may write, as the machine says now."""
    out: dict[str, str] = {}
    for _, tid, d in threads():
        try:
            comm = (d / "comm").read_text().strip()
            out[f"tid {tid} {comm}"] = str(sorted(os.sched_getaffinity(tid)))
        except OSError:
            continue
        if (where := cpuset.of(tid)) is not None:
            out[f"cpuset of {tid} {comm}"] = where
    if (root := cpuset.v1_root()) is not None:
        out["cpusets"] = " ".join(sorted(p.name for p in root.iterdir() if p.is_dir()))
    files = [*Path("/proc/irq").glob("[0-9]*/smp_affinity_list"), *Path("/sys/class/net").glob("*/queues/rx-*/rps_cpus")]
    for f in [*files, Path("/sys/devices/virtual/workqueue/cpumask"), Path("/proc/sys/kernel/timer_migration")]:
        try:
            out[str(f)] = f.read_text().strip()
        except OSError:
            continue
    return out
