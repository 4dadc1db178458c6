"""Tunings: settings of this machine a phase changes and gives back.

A phase's ``tunings:`` (``spec/models.py``) become *changes* here: a file
to write (IRQ affinity, an idle state's ``disable``, an allowed sysfs or
procfs file) or ``/dev/cpu_dma_latency`` held open. ``check`` finds every
change's file and refuses what cannot apply (no such IRQ, no such idle
state, a file off the allowed list, not root), so a run never starts with a
tuning it would fail to make. ``apply`` writes each change after recording
its old value in a journal (a JSON file, flushed before the write), so
whatever ends the run, the old values are known: ``restore`` writes them
back and removes the journal; the controller restores at the end of each
phase and in its ``finally``, and ``loopscope cleanup`` (and the reaper of a
killed controller) restores from a journal a dead run left behind. The
latency request is a file descriptor: the kernel drops it when the process
holding it dies, so it needs no journal.

Placement and scheduling tunings of probes and loads change how those are
started (``lab/session.py``, ``agent/server.py``), not files.

``LOOPSCOPE_SYSFS_ROOT`` (tests only) puts a stand-in tree under ``/sys``
and ``/proc`` paths, for machines that lack what a test needs.
"""

from __future__ import annotations

import fnmatch
import json
import os
import time
from dataclasses import asdict, dataclass
from pathlib import Path
from typing import Any

from loopscope.errors import InputError, RunError
from loopscope.host import cpuset, isolate, procs
from loopscope.host.statedir import state_dir

#: files a ``write`` tuning may change (globs); anything else is refused
ALLOWED = [
    "/proc/sys/kernel/sched_rt_runtime_us",
    "/proc/sys/kernel/sched_rt_period_us",
    "/proc/sys/kernel/timer_migration",
    "/proc/sys/kernel/numa_balancing",
    "/proc/sys/kernel/watchdog",
    "/proc/sys/kernel/nmi_watchdog",
    "/proc/sys/vm/stat_interval",
    "/proc/sys/vm/swappiness",
    "/proc/sys/net/core/busy_poll",
    "/proc/sys/net/core/busy_read",
    "/proc/sys/net/core/netdev_budget",
    "/proc/sys/net/core/rps_sock_flow_entries",
    "/proc/irq/*/smp_affinity_list",
    "/sys/class/net/*/queues/rx-*/rps_cpus",
    "/sys/class/net/*/queues/rx-*/rps_flow_cnt",
    "/sys/devices/system/cpu/cpu*/cpuidle/state*/disable",
    "/sys/devices/system/cpu/cpu*/cpufreq/scaling_governor",
    "/sys/kernel/mm/transparent_hugepage/enabled",
    "/sys/kernel/mm/transparent_hugepage/defrag",
    "/sys/kernel/mm/damon/admin/kdamonds/*/state",
    # a cgroup's CPU limit (v1 quota, v2 cpu.max), at any depth
    "/sys/fs/cgroup/cpu/cpu.cfs_quota_us",
    "/sys/fs/cgroup/cpu/*/cpu.cfs_quota_us",
    "/sys/fs/cgroup/*/cpu.max",
]


def real(path: str) -> Path:
    """Where ``path`` is on this machine (under the stand-in root in tests)."""
    root = os.environ.get("LOOPSCOPE_SYSFS_ROOT")
    if root and (path.startswith("/sys/") or path.startswith("/proc/")):
        return Path(root) / path.lstrip("/")
    return Path(path)


@dataclass
class Change:
    """One file a tuning writes (``path`` as the user knows it)."""

    tuning: str  # the tuning as written, for messages
    path: str
    new: str
    old: str | None = None
    #: a write the kernel may refuse without failing the run (an isolate's managed IRQ): said, not raised
    optional: bool = False


def _cpus_text(cpus: list[int]) -> str:
    return ",".join(str(c) for c in sorted(cpus))


def changes(tuning: dict[str, Any], where: str) -> list[Change]:
    """The files one tuning writes (none for those that say how a probe or a
    load is started: the agents apply those); InputError naming it
    (``where``: its place in the file) when one cannot be written."""
    kind = tuning["kind"]
    label = f"{where} ({kind})"
    out: list[Change] = []
    if kind == "irq":
        p = f"/proc/irq/{tuning['irq']}/smp_affinity_list"
        out.append(Change(label, p, _cpus_text(tuning["cpus"])))
    elif kind == "cpuidle":
        cpus = tuning.get("cpus") or _online_cpus()
        for c in cpus:
            d = real(f"/sys/devices/system/cpu/cpu{c}/cpuidle")
            if not d.is_dir():
                raise InputError(f"{label}: CPU {c} has no idle states to disable ({d} is missing: no cpuidle driver); remove the tuning")
            states = sorted(d.glob("state*"), key=lambda p: int(p.name[5:]))
            want = tuning["state"]
            hit = [s for s in states if s.name == f"state{want}" or (s / "name").exists() and (s / "name").read_text().strip() == str(want)]
            if not hit:
                names = ", ".join(f"{s.name[5:]} ({(s / 'name').read_text().strip() if (s / 'name').exists() else '?'})" for s in states)
                raise InputError(f"{label}: CPU {c} has no idle state {want!r}; its states are {names}")
            out.append(Change(label, f"/sys/devices/system/cpu/cpu{c}/cpuidle/{hit[0].name}/disable", "1" if tuning.get("disable", True) else "0"))
    elif kind == "isolate":
        out += _isolate_files(set(tuning["cpus"]), bool(tuning.get("timer_migration")), label)
    elif kind == "write":
        p = tuning["path"]
        if not any(fnmatch.fnmatch(p, g) for g in ALLOWED):
            raise InputError(f"{label}: {p} is not on the list of files a tuning may write; the list is in docs/experiments.md (tunings)")
        out.append(Change(label, p, str(tuning["value"])))
    for ch in out:
        f = real(ch.path)
        if not f.exists():
            raise InputError(f"{label}: {ch.path} does not exist on this machine; remove the tuning or correct it")
        if not os.access(f, os.W_OK):
            raise InputError(f"{label}: {ch.path} cannot be written (not root?); run as root or remove the tuning")
    return out


def _isolate_files(cpus: set[int], migration: bool, label: str) -> list[Change]:
    """The files an isolate tuning writes: the IRQs, the receive queues' RPS and
    the workqueues' mask that include the CPUs, without them; timer migration."""
    have = set(range(os.cpu_count() or 1))
    if not cpus < have:
        raise InputError(f"{label}: CPU {_cpus_text(sorted(cpus - have))} is not on this machine, or no CPU would be left for the rest; name fewer CPUs")
    out = []
    for d in sorted(real("/proc/irq").glob("[0-9]*"), key=lambda p: int(p.name)):
        try:
            now = (d / "smp_affinity_list").read_text().strip()
        except OSError:
            continue
        rest = isolate.cpus_without(now, cpus) or sorted(have - cpus)  # (steered to the CPUs alone: to the others)
        if rest != isolate.cpus_without(now, set()):
            out.append(Change(label, f"/proc/irq/{d.name}/smp_affinity_list", _cpus_text(rest), optional=True))
    rps = [str(p) for p in real("/sys/class/net").glob("*/queues/rx-*/rps_cpus")] + [str(real("/sys/devices/virtual/workqueue/cpumask"))]
    for f in rps:
        try:
            now = Path(f).read_text().strip()
        except OSError:
            continue
        new = isolate.mask_without(now, cpus)
        if new != now:
            out.append(Change(label, f, new, optional=True))
    if migration:
        out.append(Change(label, "/proc/sys/kernel/timer_migration", "0"))
    return out


def _online_cpus() -> list[int]:
    return sorted(os.sched_getaffinity(0))


def check(phases: list[dict[str, Any]]) -> list[str]:
    """Every phase's tunings checked without changing anything; the problems."""
    problems = []
    for i, ph in enumerate(phases):
        for j, t in enumerate(ph.get("tunings") or []):
            try:
                changes(t, f"phases.{i}.tunings.{j}")
            except InputError as e:
                problems.append(str(e))
            if t["kind"] == "dma_latency":
                if not os.access("/dev/cpu_dma_latency", os.W_OK):
                    problems.append(
                        f"phases.{i}.tunings.{j} (dma_latency): /dev/cpu_dma_latency cannot be written (not root?); run as root or remove the tuning"
                    )
    return problems


class Applied:
    """The tunings of one phase, applied; ``restore`` gives everything back."""

    def __init__(self, journal: Path) -> None:
        self.journal = journal
        self.done: list[Change] = []
        self.dma_fd: int | None = None
        self.dma_us: int | None = None
        self.movers: list[tuple[isolate.Mover, isolate.Isolation]] = []
        self.moved: list[isolate.Moved] = []
        #: the cpusets an isolation made (``host/cpuset.py``), in the journal before they exist
        self.cpusets: list[str] = []
        #: when the first change was journalled: journals left by several runs are given back the newest first
        self.began_ns = time.time_ns()

    def _save(self) -> None:
        """The journal replaced whole. Not fsync'ed: what it gives back (sysfs and
        procfs values, threads' CPUs) does not outlive the kernel, so the page
        cache is durable enough for a killed controller's reaper, and a write
        under a storm of fsyncs (a load that syncs a file in a loop) took ~0.1 s
        each, which held the isolation back."""
        tmp = self.journal.with_suffix(".tmp")
        with open(tmp, "w") as f:
            owner = {"pid": os.getpid(), "start": procs.process_start_time(os.getpid())}
            json.dump(
                {
                    "owner": owner,
                    "began_ns": self.began_ns,
                    "changes": [asdict(c) for c in self.done],
                    "moved": [asdict(m) for m in self.moved],
                    "cpusets": self.cpusets,
                },
                f,
            )
        os.replace(tmp, self.journal)

    def apply(self, tunings: list[dict[str, Any]], where: str) -> None:
        for j, t in enumerate(tunings):
            if t["kind"] == "dma_latency":
                self._hold_dma(int(t["us"]))
                continue
            iso = isolate.Isolation(list(t["cpus"])) if t["kind"] == "isolate" else None
            todo = changes(t, f"{where}.tunings.{j}")
            for ch in todo:
                ch.old = real(ch.path).read_text().strip()
            self.done += todo
            self._save()  # the old values are on disk before any new one is written (one write for all)
            for ch in todo:
                f = real(ch.path)
                try:
                    f.write_text(ch.new + "\n")
                except OSError as e:
                    if ch.optional and iso is not None:  # a managed IRQ: its affinity is the kernel's, moved only at boot
                        self.done.remove(ch)
                        iso.boot_only.append(f"{ch.path} ({e.strerror}: a managed IRQ, moved by isolcpus=managed_irq at boot)")
                        continue
                    raise RunError(
                        f"tunings: {ch.tuning}: writing {ch.new!r} to {ch.path} failed ({e.strerror}): the kernel refused the value", component="tunings"
                    ) from None
            if iso is not None:
                if iso.boot_only:
                    self._save()  # (the refused writes are not in the journal: nothing of theirs to give back)
                self._isolate(iso)

    def _isolate(self, iso: isolate.Isolation) -> None:
        """Every movable thread off the CPUs, now and until ``restore`` (each in the journal before it moves)."""

        def journal(ms: list[isolate.Moved]) -> None:
            self.moved += ms
            iso.moved += ms
            self._save()

        mv = isolate.Mover(iso.cpus, journal, shield=self._shield(iso))
        mv.start()
        iso.boot_only += [f"per-CPU kthread {b}" for b in mv.bound]
        self.movers.append((mv, iso))

    def _shield(self, iso: isolate.Isolation) -> cpuset.Shield | None:
        """The isolation's cpusets, journalled, then made; None (and why, in ``iso.cpuset``) when this machine cannot have them."""
        root = cpuset.v1_root()
        if root is None:
            iso.cpuset = "none: no writable cgroup v1 cpuset hierarchy (a v2 isolated partition is not made at run time); affinity alone keeps tasks off"
            return None
        others = [c for c in range(os.cpu_count() or 1) if c not in iso.cpus]
        shield = cpuset.Shield(root, set(iso.cpus), others, str(os.getpid()))
        self.cpusets += shield.paths
        self._save()
        try:
            shield.make()
        except OSError as e:
            cpuset.dissolve(shield.paths)
            self.cpusets = [p for p in self.cpusets if p not in shield.paths]
            self._save()
            iso.cpuset = f"none: the kernel refused the cpusets ({e.strerror}); affinity alone keeps tasks off"
            return None
        iso.cpuset = f"{shield.rest.name} holds the moved tasks on CPU {_cpus_text(others)}, {shield.rt.name} holds CPU {_cpus_text(iso.cpus)} exclusive"
        return shield

    def _hold_dma(self, us: int) -> None:
        import struct

        if self.dma_fd is not None:
            os.close(self.dma_fd)
        fd = os.open("/dev/cpu_dma_latency", os.O_WRONLY)
        os.write(fd, struct.pack("i", us))
        self.dma_fd, self.dma_us = fd, us

    def record(self) -> list[dict[str, Any]]:
        """What was changed, old and new (for run.json and provenance)."""
        out = [{"tuning": c.tuning, "path": c.path, "old": c.old, "new": c.new} for c in self.done]
        for mv, iso in self.movers:
            cpus = _cpus_text(iso.cpus)
            out.append(
                {
                    "tuning": "isolate",
                    "path": "(threads)",
                    "old": f"{len(iso.moved)} threads allowed on CPU {cpus}",
                    "new": f"moved off CPU {cpus}; left (boot only): {'; '.join(iso.boot_only[:20]) or 'none'}; cpusets: {iso.cpuset}"
                    + (f"; by affinity only (a cpuset of their own): {'; '.join(mv.apart)}" if mv.apart else ""),
                }
            )
        if self.dma_us is not None:
            out.append(
                {
                    "tuning": "dma_latency",
                    "path": "/dev/cpu_dma_latency",
                    "old": "(no request: the idle states as configured)",
                    "new": f"{self.dma_us} µs, held open",
                }
            )
        return out

    def restore(self) -> list[str]:
        """Write every old value back (last change first) and drop the journal; the problems, if any."""
        for mv, _ in self.movers:
            mv.stop()
        # the files first (a thread's old CPUs may need the workqueues' or an IRQ's mask back), then the threads
        problems = restore_changes(self.done)
        problems += isolate.give_back(self.moved, self.cpusets)
        self.moved, self.movers, self.cpusets = [], [], []
        self.done = []
        if self.dma_fd is not None:
            os.close(self.dma_fd)
            self.dma_fd = None
        if not problems:
            self.journal.unlink(missing_ok=True)
        return problems


def restore_changes(done: list[Change]) -> list[str]:
    problems = []
    for ch in reversed(done):
        if ch.old is None:
            continue
        try:
            real(ch.path).write_text(ch.old + "\n")
        except OSError as e:
            problems.append(f"{ch.path}: could not write back {ch.old!r} ({e.strerror})")
    return problems


def agent_journal(run_id: str) -> Path:
    """The journal of the tunings an agent makes for its kernel: beside the
    controller's when both run here, and apart from it."""
    return state_dir() / f"{run_id}.agent{os.getpid()}.tunings"


def owner_alive(journal: Path) -> bool:
    """The process that keeps the journal (a controller or an agent) still
    runs: it gives its tunings back itself. A journal without an owner is an
    older run's, whose run state says."""
    try:
        owner = json.loads(journal.read_text()).get("owner") or {}
    except (OSError, json.JSONDecodeError):
        return False
    return bool(owner.get("pid")) and procs.alive(int(owner["pid"]), owner.get("start"))


def newest_first(journals: list[Path]) -> list[Path]:
    """Journals in the order to give them back: the last begun first (a
    later one's old values are what an earlier one set; a journal that does not
    say when it began, an older loopscope's, last)."""

    def began(j: Path) -> int:
        try:
            return int(json.loads(j.read_text()).get("began_ns") or 0)
        except (OSError, ValueError, AttributeError):
            return 0

    return sorted(journals, key=began, reverse=True)


def restore_journal(journal: Path) -> list[str]:
    """What a dead run left: write its old values back. The lines say what was done."""
    try:
        data = json.loads(journal.read_text())
    except (OSError, json.JSONDecodeError):
        return []
    done = [Change(**c) for c in data.get("changes") or []]
    moved = [isolate.Moved(**m) for m in data.get("moved") or []]
    sets = list(data.get("cpusets") or [])
    problems = restore_changes(done) + isolate.give_back(moved, sets)
    if not problems:
        journal.unlink(missing_ok=True)
    gave = [f"  gave {len(moved)} threads their CPUs back"] if moved else []
    gave += [f"  removed cpuset {p}" for p in sets]
    return gave + [f"  restored {c.path} to {c.old!r}" for c in reversed(done) if c.old is not None] + [f"  could not restore: {p}" for p in problems]
