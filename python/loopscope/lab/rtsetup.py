"""The real-time set-up of some CPUs as the machine has it (``loopscope audit``'s first half, ``lab/audit.py``).

Read, never changed: the kernel command line (isolcpus, nohz_full,
rcu_nocbs) and whether the kernel applied it; every task's and kthread's
allowed CPUs (``Cpus_allowed_list``; a kthread flagged PF_NO_SETAFFINITY is
per-CPU and no one may move it); the unbound workqueues' mask; the real-time
budget (``sched_rt_runtime_us``), ``timer_migration``, transparent huge
pages, swappiness; the idle states and who holds ``/dev/cpu_dma_latency``;
the frequency governor; SMT siblings and the CPUs sharing the last-level
cache; the clocksource. Each finding says what, why it matters, its evidence
and the remedy: a run-time change (reversible) or a boot parameter (said,
never applied).
"""

from __future__ import annotations

import os
import re
from dataclasses import dataclass
from pathlib import Path
from typing import Literal

from typing_extensions import NotRequired, TypedDict

from loopscope.host.isolate import cpu_list


#: idle states that take longer than this to leave are worth holding off (µs)
DEEP_EXIT_US = 10


PF_KTHREAD = 0x00200000


PF_NO_SETAFFINITY = 0x04000000


SYS = Path("/sys/devices/system/cpu")


class Finding(TypedDict):
    """One thing in the way of a quiet CPU: what, why, the evidence, the remedy."""

    check: str
    cpus: list[int]
    what: str
    why: str
    evidence: str
    remedy: str
    #: runtime: a reversible change now; boot: a kernel parameter (said, never applied); none: nothing to do but know it
    remedy_kind: Literal["runtime", "boot", "none"]
    #: the remedy needs a reboot (``remedy_kind`` boot)
    reboot: NotRequired[bool]


def said(fs: list[Finding]) -> list[Finding]:
    """The findings as printed: each says whether its remedy needs a reboot."""
    for x in fs:
        x["reboot"] = x["remedy_kind"] == "boot"
    return fs


def sysread(p: Path | str) -> str | None:
    try:
        return Path(p).read_text().strip()
    except OSError:
        return None


def cpus_text(cpus: list[int]) -> str:
    return ",".join(map(str, cpus))


@dataclass
class Task:
    pid: int
    tid: int
    comm: str
    allowed: list[int]
    kthread: bool
    bound: bool  # a kthread no one may move (per-CPU)


def tasks() -> list[Task]:
    """Every thread on this machine, with its allowed CPUs and whether it is a (movable) kthread."""
    out = []
    for proc in Path("/proc").iterdir():
        if not proc.name.isdigit():
            continue
        try:
            threads = list((proc / "task").iterdir())
        except OSError:
            continue
        for t in threads:
            st, status = sysread(t / "stat"), sysread(t / "status")
            if not st or not status:
                continue
            comm = st[st.index("(") + 1 : st.rindex(")")]
            flags = int(st[st.rindex(")") + 2 :].split()[6])
            m = re.search(r"^Cpus_allowed_list:\s*(\S+)", status, re.M)
            out.append(Task(int(proc.name), int(t.name), comm, cpu_list(m.group(1)) if m else [], bool(flags & PF_KTHREAD), bool(flags & PF_NO_SETAFFINITY)))
    return out


def _names(ts: list[Task], n: int = 6) -> str:
    seen = list(dict.fromkeys(t.comm for t in ts))
    return ", ".join(seen[:n]) + (f" and {len(seen) - n} more" if len(seen) > n else "")


def setup(cpus: list[int], ts: list[Task]) -> list[Finding]:
    """What the set-up says, before the watch."""
    f: list[Finding] = []
    cmd = sysread("/proc/cmdline") or ""
    want = cpus_text(cpus)
    for param, sysfile, why in (
        ("isolcpus", "isolated", "the scheduler still balances tasks onto them, and new tasks may start there"),
        ("nohz_full", "nohz_full", "the scheduler tick interrupts a running thread there (every 1-4 ms)"),
        ("rcu_nocbs", None, "RCU callbacks run there, in softirq or in rcuc threads"),
    ):
        m = re.search(rf"(?:^|\s){param}=(\S+)", cmd)
        asked = cpu_list(m.group(1)) if m else []
        have = cpu_list(sysread(SYS / sysfile) or "") if sysfile else asked
        missing = [c for c in cpus if c not in have]
        if missing and not [c for c in missing if c in asked]:
            f.append(
                Finding(
                    check=param,
                    cpus=missing,
                    what=f"CPU {cpus_text(missing)} not in {param}",
                    why=why,
                    evidence=f"/proc/cmdline: {m.group(0).strip() if m else f'no {param}='}",
                    remedy=f"boot with {param}=" + (f"managed_irq,domain,{want}" if param == "isolcpus" else want),
                    remedy_kind="boot",
                )
            )
        elif missing:
            f.append(
                Finding(
                    check=param,
                    cpus=missing,
                    what=f"{param} asks for CPU {cpus_text(missing)} but the kernel did not apply it",
                    why=why,
                    evidence=f"/proc/cmdline says {m.group(0).strip() if m else ''}; /sys/devices/system/cpu/{sysfile} says {have or 'none'}",
                    remedy=f"check the kernel's support (CONFIG_NO_HZ_FULL, CONFIG_CPU_ISOLATION) and its boot log: dmesg | grep -i {param}",
                    remedy_kind="boot",
                )
            )
    movable = [t for t in ts if not t.bound and set(t.allowed) & set(cpus) and t.pid != os.getpid()]
    if movable:
        kt = [t for t in movable if t.kthread]
        f.append(
            Finding(
                check="affinity",
                cpus=cpus,
                what=f"{len(movable)} threads may run on CPU {want} ({len(kt)} of them movable kthreads)",
                why="any of them can be scheduled there and preempt or delay a thread of yours",
                evidence=f"Cpus_allowed_list of {_names(movable)}",
                remedy=f"move them off (the isolate tuning; by hand: taskset -acp <others> PID for each, or a cpuset for your work): CPU {want} for your threads only",
                remedy_kind="runtime",
            )
        )
    bound = [t for t in ts if t.bound and set(t.allowed) <= set(cpus) and t.allowed]
    if bound:
        f.append(
            Finding(
                check="per-cpu kthreads",
                cpus=cpus,
                what=f"{len(bound)} per-CPU kthreads are bound to CPU {want}",
                why="no one may move them; they run when the kernel has work for that CPU (kworkers, ksoftirqd, migration, rcu)",
                evidence=_names(bound),
                remedy="boot with nohz_full= and rcu_nocbs= for the CPUs (fewer of them wake); keep work off the CPUs so they have none",
                remedy_kind="boot",
            )
        )
    wq = sysread("/sys/devices/virtual/workqueue/cpumask")
    if wq is not None:
        mask = int(wq.replace(",", ""), 16)
        on = [c for c in cpus if mask >> c & 1]
        if on:
            others = sum(1 << c for c in range(os.cpu_count() or 1) if c not in cpus)
            f.append(
                Finding(
                    check="workqueue",
                    cpus=on,
                    what=f"unbound workqueues may run on CPU {cpus_text(on)}",
                    why="their kworkers take whatever CPU the mask allows, yours too",
                    evidence=f"/sys/devices/virtual/workqueue/cpumask = {wq}",
                    remedy=f"echo {others:x} > /sys/devices/virtual/workqueue/cpumask",
                    remedy_kind="runtime",
                )
            )
    f += _irq_affinity(cpus) + _cpusets(cpus)
    f += _sysctls()
    f += _idle_and_freq(cpus)
    f += _topology(cpus)
    cs = sysread("/sys/devices/system/clocksource/clocksource0/current_clocksource")
    if cs and cs != "tsc":
        f.append(
            Finding(
                check="clocksource",
                cpus=[],
                what=f"the clocksource is {cs}, not tsc",
                why="every clock read (timers, timestamps) is slower, and some (hpet, acpi_pm) trap to the hypervisor",
                evidence=f"current_clocksource = {cs}; available: {sysread('/sys/devices/system/clocksource/clocksource0/available_clocksource')}",
                remedy="boot with tsc=reliable clocksource=tsc where the TSC is invariant (grep constant_tsc /proc/cpuinfo)",
                remedy_kind="boot",
            )
        )
    return said(f)


def _sysctls() -> list[Finding]:
    f: list[Finding] = []
    rt = sysread("/proc/sys/kernel/sched_rt_runtime_us")
    if rt and rt != "-1":
        f.append(
            Finding(
                check="sched_rt_runtime_us",
                cpus=[],
                what=f"real-time threads may use {int(rt) / 1e4:.0f} % of each CPU, then wait",
                why="a SCHED_FIFO thread that runs longer than its budget is held (throttled: RT) for the rest of the period",
                evidence=f"sched_rt_runtime_us = {rt} of sched_rt_period_us = {sysread('/proc/sys/kernel/sched_rt_period_us')}",
                remedy="keep it (it saves the machine from a runaway spinner) unless your threads need the whole CPU: echo -1 > /proc/sys/kernel/sched_rt_runtime_us",
                remedy_kind="none",
            )
        )
    if sysread("/proc/sys/kernel/timer_migration") == "1":
        f.append(
            Finding(
                check="timer_migration",
                cpus=[],
                what="timers may migrate to a busy CPU",
                why="an idle CPU's timers are moved to busy ones, yours among them, where they expire in your thread's way",
                evidence="/proc/sys/kernel/timer_migration = 1",
                remedy="echo 0 > /proc/sys/kernel/timer_migration",
                remedy_kind="runtime",
            )
        )
    thp = sysread("/sys/kernel/mm/transparent_hugepage/enabled") or ""
    if "[always]" in thp:
        f.append(
            Finding(
                check="thp",
                cpus=[],
                what="transparent huge pages are always on",
                why="khugepaged compacts memory in the background, and a fault may stall to compact a huge page",
                evidence=f"transparent_hugepage/enabled = {thp}",
                remedy="echo madvise > /sys/kernel/mm/transparent_hugepage/enabled",
                remedy_kind="runtime",
            )
        )
    sw = sysread("/proc/sys/vm/swappiness")
    swaps = (sysread("/proc/swaps") or "").count("\n")  # (its first line is the header)
    if sw is not None and int(sw) > 10 and swaps:
        f.append(
            Finding(
                check="swappiness",
                cpus=[],
                what=f"the kernel swaps readily (swappiness {sw})",
                why="a page of your process swapped out faults back in at the worst time unless it is locked (mlockall)",
                evidence=f"/proc/sys/vm/swappiness = {sw}; {swaps} swap device(s)",
                remedy="mlockall in your program (the probes do); or echo 1 > /proc/sys/vm/swappiness",
                remedy_kind="runtime",
            )
        )
    return f


def dma_latency_holders() -> list[str]:
    """The processes that hold /dev/cpu_dma_latency open (their request holds the CPUs out of deep idle)."""
    out = []
    for proc in Path("/proc").iterdir():
        if not proc.name.isdigit():
            continue
        try:
            for fd in (proc / "fd").iterdir():
                if os.readlink(fd) == "/dev/cpu_dma_latency":
                    out.append(f"{(sysread(proc / 'comm') or '?')} ({proc.name})")
                    break
        except OSError:
            continue
    return out


def _idle_and_freq(cpus: list[int]) -> list[Finding]:
    f: list[Finding] = []
    holders = dma_latency_holders()
    deep: list[str] = []
    for c in cpus:
        for st in sorted((SYS / f"cpu{c}" / "cpuidle").glob("state*")):
            lat = sysread(st / "latency")
            if lat and int(lat) > DEEP_EXIT_US and sysread(st / "disable") == "0":
                deep.append(f"cpu{c} {sysread(st / 'name')} ({lat} µs)")
    if deep and not holders:
        f.append(
            Finding(
                check="idle states",
                cpus=cpus,
                what=f"CPU {cpus_text(cpus)} may enter idle states that take over {DEEP_EXIT_US} µs to leave",
                why="a timer or wake-up for your thread waits for the CPU to come out of the state first",
                evidence="; ".join(deep[:6]) + "; nobody holds /dev/cpu_dma_latency",
                remedy="hold /dev/cpu_dma_latency at 0 while you run (the dma_latency tuning; cyclictest does it), or cpupower idle-set -D 10; "
                "for good: boot with idle=poll or processor.max_cstate=1",
                remedy_kind="runtime",
            )
        )
    govs = {c: sysread(SYS / f"cpu{c}" / "cpufreq" / "scaling_governor") for c in cpus}
    slow = {c: g for c, g in govs.items() if g and g != "performance"}
    if slow:
        f.append(
            Finding(
                check="governor",
                cpus=sorted(slow),
                what=f"CPU {cpus_text(sorted(slow))} change frequency on demand ({', '.join(sorted(set(slow.values())))})",
                why="a burst after a quiet spell runs at a low clock until the governor notices",
                evidence=", ".join(f"cpu{c}: {g}" for c, g in slow.items()),
                remedy="cpupower frequency-set -g performance",
                remedy_kind="runtime",
            )
        )
    return f


def _topology(cpus: list[int]) -> list[Finding]:
    f: list[Finding] = []
    for c in cpus:
        sib = [x for x in cpu_list(sysread(SYS / f"cpu{c}" / "topology" / "thread_siblings_list") or "") if x != c]
        if sib:
            f.append(
                Finding(
                    check="smt",
                    cpus=[c],
                    what=f"CPU {c} shares its core with CPU {cpus_text(sib)} (SMT)",
                    why="whatever runs on the sibling takes the core's execution units and caches from yours",
                    evidence=f"cpu{c}/topology/thread_siblings_list = {sysread(SYS / f'cpu{c}' / 'topology' / 'thread_siblings_list')}",
                    remedy=f"keep CPU {cpus_text(sib)} idle too (isolate it with CPU {c}), or boot with nosmt",
                    remedy_kind="runtime",
                )
            )
        llc = max(sorted((SYS / f"cpu{c}" / "cache").glob("index*")), key=lambda p: int(sysread(p / "level") or 0), default=None)
        shared = [x for x in cpu_list(sysread(llc / "shared_cpu_list") or "") if x not in cpus] if llc else []
        if shared:
            f.append(
                Finding(
                    check="llc",
                    cpus=[c],
                    what=f"CPU {c} shares its last-level cache with CPU {cpus_text(shared)}",
                    why="a neighbour that streams memory evicts your working set (a slowdown no kernel event shows)",
                    evidence=f"{llc}/shared_cpu_list = {sysread(llc / 'shared_cpu_list') if llc else ''}",
                    remedy="keep memory-heavy work off the CPUs sharing it; cache partitioning (resctrl, CAT) where the CPU has it",
                    remedy_kind="none",
                )
            )
    return f


def _irq_affinity(cpus: list[int]) -> list[Finding]:
    """IRQs the kernel delivers to the CPUs (effective affinity; the asked one when the kernel keeps none)."""
    names = {}
    for line in (sysread("/proc/interrupts") or "").splitlines()[1:]:
        head, _, rest = line.partition(":")
        if head.strip().isdigit():
            names[head.strip()] = rest.split()[-1] if rest.split() else ""
    hit = []
    for d in sorted(Path("/proc/irq").glob("[0-9]*"), key=lambda p: int(p.name)):
        eff = sysread(d / "effective_affinity_list") or sysread(d / "smp_affinity_list") or ""
        if set(cpu_list(eff)) & set(cpus) and d.name in names:
            hit.append(f"{d.name} {names[d.name]} (effective {eff}, asked {sysread(d / 'smp_affinity_list')})")
    if not hit:
        return []
    return [
        Finding(
            check="irq affinity",
            cpus=cpus,
            what=f"{len(hit)} IRQs are delivered to CPU {cpus_text(cpus)}",
            why="each one that fires stops your thread for its handler and the softirq it raises",
            evidence="; ".join(hit[:6]) + (f" and {len(hit) - 6} more" if len(hit) > 6 else ""),
            remedy="echo <other CPUs> > /proc/irq/N/smp_affinity_list for each; stop irqbalance (or --banirq); "
            "a managed IRQ (the write refused) moves only with isolcpus=managed_irq at boot",
            remedy_kind="runtime",
        )
    ]


def _cpusets(cpus: list[int]) -> list[Finding]:
    """Whether a cpuset holds the CPUs for its own tasks (v1 ``cpu_exclusive``, v2 partition ``isolated``)."""
    v1, v2 = Path("/sys/fs/cgroup/cpuset"), Path("/sys/fs/cgroup")
    held = []
    for root, cpus_f, excl_f, want in ((v1, "cpuset.cpus", "cpuset.cpu_exclusive", "1"), (v2, "cpuset.cpus", "cpuset.cpus.partition", "isolated")):
        if not (root / cpus_f).exists() and not any(root.glob(f"*/{cpus_f}")):
            continue
        for d in [p.parent for p in root.rglob(excl_f)]:
            if (sysread(d / excl_f) or "").startswith(want) and set(cpus) <= set(cpu_list(sysread(d / cpus_f) or "")) and d != root:
                held.append(str(d))
    if held:
        return []
    return [
        Finding(
            check="cpuset",
            cpus=cpus,
            what=f"no cpuset holds CPU {cpus_text(cpus)} for its own tasks",
            why="every task's cpuset allows the CPUs, so nothing keeps new tasks off them",
            evidence="no cpuset with cpu_exclusive 1 (v1) or cpuset.cpus.partition isolated (v2) over them",
            remedy=f"a cpuset for your work: mkdir /sys/fs/cgroup/cpuset/rt; echo {cpus_text(cpus)} > rt/cpuset.cpus; echo 1 > rt/cpuset.cpu_exclusive "
            "(the others' cpusets without the CPUs first); the isolate tuning does it for a phase",
            remedy_kind="runtime",
        )
    ]
