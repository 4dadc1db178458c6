"""From a cause to a remedy: the table ``loopscope advise`` reads.

Each cause ``explain`` names (``load: hog``, ``irq: virtio0-input.0``,
``CPU idle``, ``scheduling latency``, ``thread: kdamond``, ``softirq:
NET_RX``, ``lab: capture``, …) maps to a remedy: what to do, the knob it
turns, the exact command, whether it needs a reboot, and, where a phase's
``tunings:`` can apply it at run time, those tunings (so the follow-up
experiment can prove it helped). The table is documented in
``docs/compare.md``; a cause it does not know gets no remedy and says so.
"""

from __future__ import annotations

import re
from dataclasses import dataclass, field
from pathlib import Path

from loopscope.spec.models import AffinityTuning, DmaLatencyTuning, IrqTuning, IsolateTuning, LimitTuning, MlockTuning, SchedTuning, Tuning, WriteTuning
from loopscope.host.cpulimit import lift
from loopscope.analysis.attribution import LATE_IRQ


@dataclass
class Remedy:
    remedy: str
    knob: str
    command: str
    reboot: bool
    #: tunings of a remedy phase that apply it at run time (empty: not at run time),
    #: the experiment file's own models: a remedy cannot write one a run refuses
    tunings: list[Tuning] = field(default_factory=list)
    #: with no tunings: why no phase can apply it (what ``advise`` says the follow-up leaves out)
    by_hand: str = ""


@dataclass
class Context:
    """What a remedy needs to know of the probe and the machine."""

    probe: str
    probe_kind: str
    probe_cpus: list[int]  # the CPUs the probe is pinned to ([]: not pinned)
    usable: list[int]  # the machine's CPUs
    probe_takes_cpu: bool
    probe_takes_priority: bool
    loads: list[str]  # the phase's loads
    #: load → the CPUs its threads were allowed (what it pinned itself to, if it did)
    load_cpus: dict[str, list[int]] = field(default_factory=dict)
    #: the probe's SCHED_FIFO priority as it ran (None: SCHED_OTHER)
    probe_priority: int | None = None
    #: the probe takes ``mlock`` (timer, program) and ran without it
    probe_unlocked: bool = False
    #: the names of the probe's own threads (a pipeline's stages): never named as an intruder
    own_threads: frozenset[str] = frozenset()


RT_PRIORITY = 80
#: why a remedy that changes the measured program is not a tuning
PROGRAM = "a change to the program (its locking), which a phase cannot make"


def _fifo(ctx: Context) -> list[Tuning]:
    """The tuning that makes the probe SCHED_FIFO, when it takes one and is not already."""
    if ctx.probe_takes_priority and (ctx.probe_priority or 0) < RT_PRIORITY:
        return [SchedTuning(kind="sched", probe=ctx.probe, policy="fifo", priority=RT_PRIORITY)]
    return []


def _elsewhere(ctx: Context) -> list[int]:
    """A CPU for the probe other than the one it ran on (pinning it where it already is changes nothing)."""
    here = set(ctx.probe_cpus) if ctx.probe_cpus else set()
    other = [c for c in ctx.usable if c not in here]
    return other[:1] or ctx.usable[:1]


def _move(ctx: Context) -> list[Tuning]:
    return [AffinityTuning(kind="affinity", probe=ctx.probe, cpus=_elsewhere(ctx))] if ctx.probe_takes_cpu else []


def _rps_paths(cpu_set: list[int]) -> list[str]:
    """The receive queues whose packet steering (RPS) sends work to any of ``cpu_set``."""
    out = []
    for p in sorted(Path("/sys/class/net").glob("*/queues/rx-*/rps_cpus")):
        try:
            mask = int(p.read_text().strip().replace(",", ""), 16)
        except (OSError, ValueError):
            continue
        if any(mask >> c & 1 for c in cpu_set):
            out.append(str(p))
    return out


def _away(ctx: Context) -> tuple[list[int], list[int]]:
    """CPUs for the probe and CPUs for the rest, apart: the probe keeps its
    first CPU's neighbour-free place (the last usable CPU when not pinned)."""
    probe = ctx.probe_cpus[:1] or ctx.usable[-1:]
    rest = [c for c in ctx.usable if c not in probe] or ctx.usable
    return probe, rest


def _own_stage(name: str, ctx: Context) -> Remedy:
    """Another of the probe's own threads (a pipeline's stage on the same
    host) ran where this one waited: the probe's work, not an intruder."""
    return Remedy(
        f"{name} is the probe's own (another of its stages, on the same host): its stages take turns on too few CPUs; "
        "spread them over more hosts or CPUs, or lower the rate or the work per message",
        "the probe's own layout (stages per host, rate, work per message)",
        f"loopscope check <experiment>   # the pipeline's stages per host; check: perf sched timehist -p <pid of {name}> shows the stages preempting each other",
        False,
        by_hand=f"the {ctx.probe_kind} probe's own layout, which a phase cannot change",
    )


#: causes a run-time partition moves: tasks and interrupts that are not the lab's
INTRUDERS = ("thread: ", "irq: ", "softirq: ")


def partition(ctx: Context, causes: list[tuple[str, float]]) -> dict[str, object] | None:
    """An advice row offering the isolate tuning when two or more different
    intruders (threads, IRQs, softirqs; the lab's own loads and the probe's own
    threads apart: isolation does not move the lab) took a pinned probe's
    outliers' time, each at least ``MIN_SHARE``; None otherwise."""
    who = [(c, sh) for c, sh in causes if c.startswith(INTRUDERS) and sh >= 0.05 and c[len("thread: ") :] not in ctx.own_threads]
    # a probe pinned to some of the CPUs (a pipeline's stages take none; every CPU cannot be kept: the rest need one)
    if not ctx.probe_takes_cpu or not ctx.probe_cpus or not set(ctx.probe_cpus) < set(ctx.usable) or len(who) < 2:
        return None
    r = iso_remedy(ctx)
    return {
        "cause": "intruders: " + ", ".join(c for c, _ in who),
        "share": round(sum(sh for _, sh in who), 4),
        "remedy": r.remedy,
        "knob": r.knob,
        "command": r.command,
        "reboot": False,
        "runtime": True,
    }


def iso_remedy(ctx: Context) -> Remedy:
    """Keep the probe's CPUs for the experiment while the phase runs (the isolate tuning)."""
    cpus = ",".join(map(str, ctx.probe_cpus))
    return Remedy(
        f"isolate CPU {cpus} for the experiment: every movable task and kthread (new ones too), the IRQs that accept it, packet steering and the "
        "unbound workqueues go to the other CPUs while the phase runs; nohz_full, rcu_nocbs, per-CPU kthreads and managed IRQs need a reboot",
        "a run-time CPU partition (affinities, IRQ affinity, RPS, workqueue cpumask)",
        f"loopscope audit --cpus {cpus}   # what is on the CPU and each remedy; for good: isolcpus=managed_irq,domain,{cpus} nohz_full={cpus} rcu_nocbs={cpus}",
        False,
        [IsolateTuning(kind="isolate", cpus=list(ctx.probe_cpus))],
    )


def _unpinnable(ctx: Context, why: str = "") -> str:
    """Why a placement cannot be a phase's tuning."""
    return why or f"a {ctx.probe_kind} probe takes no cpu, so a phase cannot pin it (moving the rest alone, it could follow): pin its threads by hand"


def by_hand(r: Remedy, ctx: Context) -> str:
    """Why remedy ``r`` has no tuning a phase applies (what ``advise`` says the follow-up leaves out)."""
    if r.by_hand:
        return r.by_hand
    knob = r.knob.lower()
    if "placement" in knob or "affinity" in knob:
        return _unpinnable(ctx) if not ctx.probe_takes_cpu else "the probe is pinned there already"
    if "priority" in knob or "slack" in knob:
        if not ctx.probe_takes_priority:
            return f"a {ctx.probe_kind} probe takes no priority, so a phase cannot make it SCHED_FIFO: chrt its threads by hand"
        return f"the probe runs SCHED_FIFO {ctx.probe_priority} already"
    return f"a change by hand ({r.knob}), not a tuning a phase applies"


def _irq_number(name: str) -> int | None:
    """The IRQ line of a handler named in /proc/interrupts (None: not found here)."""
    try:
        for line in Path("/proc/interrupts").read_text().splitlines()[1:]:
            head, _, rest = line.partition(":")
            if head.strip().isdigit() and rest.split() and rest.split()[-1] == name:
                return int(head.strip())
    except OSError:
        pass
    return None


def remedy(cause: str, ctx: Context) -> Remedy | None:
    """The remedy for one cause (None: nothing loopscope knows to do about it)."""
    if cause.startswith("thread: ") and cause[len("thread: ") :] in ctx.own_threads:
        return _own_stage(cause[len("thread: ") :], ctx)
    if cause.startswith(("load: ", "thread: ")) and not cause.startswith(("thread: kdamond", "thread: ksoftirqd")) and (fifo := _fifo(ctx)):
        # what a real-time engineer tries first: a SCHED_FIFO thread preempts
        # every SCHED_OTHER one at once, whatever its nice value, and any
        # SCHED_FIFO thread of a lower priority
        who = cause.split(": ", 1)[1]
        return Remedy(
            f"run the probe's thread SCHED_FIFO (priority {RT_PRIORITY}): it then preempts {who} at once",
            "scheduling policy and priority",
            f"chrt -f {RT_PRIORITY} <command>   # or the probe's priority: {RT_PRIORITY}; or move {who} off the probe's CPU",
            False,
            fifo,
        )
    if cause == "throttled: RT":
        return _rt_budget(ctx)
    if cause == "slowed: no kernel event":
        return _quiet_neighbours(ctx)
    if cause.startswith("throttled: "):
        return _unthrottle(cause[len("throttled: ") :])
    if cause.startswith("IPI: ") and (senders := [ld for ld in ctx.loads if ctx.load_cpus.get(ld) and not set(ctx.probe_cpus) & set(ctx.load_cpus[ld])]):
        return _quiet_senders(cause, senders)
    if cause in ("timer interrupt",) or cause.startswith("IPI: "):
        what = "the timers that expire there" if cause == "timer interrupt" else "the cross-CPU calls aimed at it"
        return Remedy(
            f"move the probe to a CPU away from {what}",
            "CPU placement of the probe",
            f"taskset -c {','.join(map(str, _elsewhere(ctx)))} <command>   # find who targets the CPU: trace-cmd record -e ipi -e timer:hrtimer_start",
            False,
            _move(ctx),
        )
    if cause == "timer slack":
        return Remedy(
            "run the probe's thread SCHED_FIFO (real-time threads get no timer slack), or set its slack to 1 ns",
            "timer slack",
            f"chrt -f {RT_PRIORITY} <command>, or prctl(PR_SET_TIMERSLACK, 1) in the thread (echo 1 > /proc/TID/timerslack_ns)",
            False,
            _fifo(ctx),
        )
    if cause.startswith("blocked: ") and " \u2190 preempted by " in cause:
        holder, _, other = cause[len("blocked: ") :].partition(" \u2190 preempted by ")
        return Remedy(
            f"give the lock {holder} holds priority inheritance: while it holds it, it runs at the waiter's priority and {other} cannot preempt it "
            f"(a priority inversion); or move {other} off {holder}'s CPU",
            "the program's locking (mutex protocol)",
            "pthread_mutexattr_setprotocol(&attr, PTHREAD_PRIO_INHERIT) before pthread_mutex_init; check: perf lock contention -b, "
            "or trace-cmd record -e sched -e syscalls:sys_enter_futex",
            False,
            by_hand=PROGRAM,
        )
    if cause.startswith("blocked: ") and cause not in ("blocked: sleeping", "blocked: uninterruptible (I/O)"):
        who = cause[len("blocked: ") :]
        return Remedy(
            f"the thread waited for {who}: shorten or split what {who} holds, or give the lock priority inheritance",
            "the program's locking",
            "pthread_mutexattr_setprotocol(&a, PTHREAD_PRIO_INHERIT); perf lock contention -b to find the lock",
            False,
            by_hand=PROGRAM,
        )
    return _placement(cause, ctx) or _late_interrupt(cause) or _standing(cause, ctx)


def _placement(cause: str, ctx: Context) -> Remedy | None:
    """A load or an interrupt on the probe's CPU: move one of them."""
    probe_cpus, rest = _away(ctx)
    pc, rc = ",".join(map(str, probe_cpus)), ",".join(map(str, rest))
    if cause.startswith("load: "):
        load = cause[6:]
        t: list[Tuning] = []
        pinned = ctx.load_cpus.get(load) or []
        if pinned and set(pinned) < set(ctx.usable) and ctx.probe_takes_cpu:
            # the load pinned itself (stress-ng --taskset, a cpuset of its own): move the probe to the CPUs it left free
            free = [c for c in ctx.usable if c not in pinned]
            t.append(AffinityTuning(kind="affinity", probe=ctx.probe, cpus=free))
            return Remedy(
                f"the load {load} pins itself to CPU {','.join(map(str, pinned))}: move the probe to CPU {','.join(map(str, free))}",
                "CPU placement of the probe",
                f"taskset -c {','.join(map(str, free))} <probe command>   # or the probe's cpu: [{','.join(map(str, free))}]",
                False,
                t,
            )
        # the load moved and the probe pinned apart, or neither: a probe left free would follow the load onto its CPUs
        if load in ctx.loads and ctx.probe_takes_cpu:
            t += [AffinityTuning(kind="affinity", load=load, cpus=rest), AffinityTuning(kind="affinity", probe=ctx.probe, cpus=probe_cpus)]
        return Remedy(
            f"move the load {load} off the probe's CPU (cpusets or affinity), and pin the probe",
            "CPU placement (affinity, cpusets)",
            f"taskset -acp {rc} <pids of {load}>   # or: systemd-run -p AllowedCPUs={rc} …; pin the probe: taskset -c {pc}",
            False,
            t,
            "" if t else _unpinnable(ctx, f"the load {load} is not one of the phase's") if ctx.probe_takes_cpu else _unpinnable(ctx),
        )
    if cause.startswith("irq: "):
        name = cause[5:]
        n = _irq_number(name)
        t = [IrqTuning(kind="irq", irq=n, cpus=rest)] if n is not None else []
        where = f"/proc/irq/{n if n is not None else '<N>'}/smp_affinity_list"
        return Remedy(
            f"steer interrupt {name} away from the probe's CPU",
            "IRQ affinity",
            f"echo {rc} > {where}   # irqbalance may undo it: stop it or use its --banirq",
            False,
            t,
            "" if t else f"no interrupt named {name} in this machine's /proc/interrupts: steer it on the machine that ran",
        )
    return None


def _late_interrupt(cause: str) -> Remedy | None:
    """A timer interrupt held back below the scheduler: found with other tools, not changed by a phase."""
    if cause != LATE_IRQ:
        return None
    return Remedy(
        "find what held the timer's interrupt back: kernel code running with interrupts off (bare metal), or the hypervisor (a VM)",
        "interrupts-off sections; the vCPU's host CPU",
        "rtla timerlat top -a 100 (its IRQ handler delay), or echo irqsoff > /sys/kernel/tracing/current_tracer (names the code); "
        "in a VM: steal in /proc/stat, and a host CPU of its own for the vCPU",
        False,
        [],
        by_hand="the interrupt is held below the scheduler: nothing a phase can change at run time",
    )


def _standing(cause: str, ctx: Context) -> Remedy | None:
    """The machine's standing settings (idle states, policy, memory) and what else runs on the probe's CPU."""
    t: list[Tuning]
    probe_cpus, rest = _away(ctx)
    pc, rc = ",".join(map(str, probe_cpus)), ",".join(map(str, rest))
    if cause == "CPU idle":
        return Remedy(
            "keep the CPU out of deep idle states: its wake-up came late",
            "cpu_dma_latency / cpuidle states",
            "hold /dev/cpu_dma_latency at 0 (cyclictest does), or: cpupower idle-set -D 1; for good: idle=poll or processor.max_cstate=1 on the kernel command line",
            False,
            [DmaLatencyTuning(kind="dma_latency", us=0)],
        )
    if cause == "scheduling latency":
        t = [SchedTuning(kind="sched", probe=ctx.probe, policy="fifo", priority=80)] if ctx.probe_takes_priority else []
        return Remedy(
            "run the probe's thread with a real-time policy", "scheduling policy and priority", "chrt -f 80 <command>   # or the probe's priority: 80", False, t
        )
    if cause == "migrations":
        t = [AffinityTuning(kind="affinity", probe=ctx.probe, cpus=probe_cpus)] if ctx.probe_takes_cpu else []
        return Remedy("pin the probe's thread to one CPU", "CPU affinity", f"taskset -c {pc} <command>", False, t)
    if cause in ("page faults", "page fault"):
        lock: list[Tuning] = [MlockTuning(kind="mlock", probe=ctx.probe)] if ctx.probe_unlocked else []
        return Remedy(
            "lock the probe's memory (mlockall) so memory pressure cannot page it out, and prefault it",
            "mlockall / prefaulting",
            "mlockall(MCL_CURRENT | MCL_FUTURE) at start and touch the buffers once (cyclictest -m; the probe's mlock: true)",
            False,
            lock,
            "" if lock else "the probe locked its memory already, or takes no mlock: prefault what it touches first",
        )
    if re.match(r"thread: kdamond", cause):
        off: list[Tuning] = [WriteTuning(kind="write", path=p, value="off") for p in _kdamonds()]
        return Remedy(
            "turn DAMON memory monitoring off",
            "DAMON",
            "echo off > /sys/kernel/mm/damon/admin/kdamonds/0/state",
            False,
            off,
            "" if off else "no DAMON here to turn off",
        )
    if cause.startswith("softirq: NET_RX") or cause.startswith("thread: ksoftirqd"):
        here = ctx.probe_cpus or ctx.usable
        away = [c for c in ctx.usable if c not in here] or rest
        mask = f"{sum(1 << c for c in away):x}"
        steer: list[Tuning] = [WriteTuning(kind="write", path=p, value=mask) for p in _rps_paths(here)]
        return Remedy(
            "take receive processing off the probe's CPU (packet steering, IRQ affinity), or move the probe",
            "RPS / IRQ steering",
            f"echo {mask} > /sys/class/net/<dev>/queues/rx-0/rps_cpus; the NIC's IRQ: echo {rc} > /proc/irq/<N>/smp_affinity_list",
            False,
            steer or _move(ctx),
            "" if steer or _move(ctx) else f"no receive queue here steers work to the probe's CPU, and {_unpinnable(ctx)}",
        )
    if cause == "lab: capture":
        return Remedy(
            "record fewer kernel events (loopscope's own capture was in the way)",
            "the experiment's kernel capture",
            "kernel: {events: [sched:sched_switch, sched:sched_wakeup, irq:irq_handler_entry, irq:irq_handler_exit]} or loopscope run … with the capture off",
            False,
            by_hand="a change to the experiment's kernel capture, which a phase cannot make",
        )
    if cause == "lab: emulator":
        return Remedy(
            "keep loopscope's link emulator off the probe's CPU, or let the kernel forward the path (ask nothing of the link)",
            "the experiment's emulator settings",
            f"emulator: {{cpu: {rest[0]}}} in the experiment file; or drop the link's delay/jitter/loss so the router's kernel forwards it",
            False,
            by_hand="a change to the experiment's emulator or links, which a phase cannot make",
        )
    if cause.startswith("lab: "):
        to = probe_cpus if not ctx.probe_cpus else _elsewhere(ctx)  # pinned already: pinning it there again changes nothing
        return Remedy(
            f"loopscope's own {cause[5:]} ran on the probe's CPU: pin the probe away from it",
            "CPU affinity of the probe",
            f"the probe's cpu: [{','.join(map(str, to))}]",
            False,
            [AffinityTuning(kind="affinity", probe=ctx.probe, cpus=to)] if ctx.probe_takes_cpu else [],
        )
    if cause.startswith("thread: "):
        name = cause[8:]
        to = probe_cpus if not ctx.probe_cpus else _elsewhere(ctx)
        t = [AffinityTuning(kind="affinity", probe=ctx.probe, cpus=to)] if ctx.probe_takes_cpu else []
        return Remedy(
            f"move {name} off the probe's CPU, or the probe away from it",
            "CPU placement (affinity)",
            f"taskset -acp {rc} $(pgrep {name.split('/')[0]})   # or pin the probe: taskset -c {pc}",
            False,
            t,
        )
    return None


def _unthrottle(group: str) -> Remedy:
    """Lift the CPU limit of ``group`` (a cgroup path; "CPU limit": not known)."""

    known = group.startswith("/")
    where = lift(group) if known else None
    how = f"echo {where[1]} > {where[0]}" if where else "echo -1 > /sys/fs/cgroup/cpu/<group>/cpu.cfs_quota_us (v2: echo max > /sys/fs/cgroup/<group>/cpu.max)"
    t: list[Tuning] = [WriteTuning(kind="write", path=where[0], value=where[1])] if where and Path(where[0]).exists() else []
    name = f"the cgroup {group}" if known else "the thread's cgroup (find it: cat /proc/TID/cgroup)"
    return Remedy(
        f"raise or remove the CPU limit of {name}, or move the thread out of it: its quota was spent and the kernel held the thread until the next period",
        "CPU limit (cgroup bandwidth: cpu.cfs_quota_us / cpu.max)",
        f"{how}   # or a larger quota; a container: docker update --cpus N, or the pod's resources.limits.cpu",
        False,
        t,
        by_hand="" if t else "the group is not known here (the capture did not name it, or it is gone): lift its limit by hand",
    )


def _rt_budget(ctx: Context) -> Remedy:
    """Real-time tasks on the probe's CPU spent its real-time budget and the
    kernel held every one there, the probe too: run the phase's loads that
    share the probe's CPU as SCHED_OTHER (a policy the probe preempts, with
    no budget to spend)."""
    here = set(ctx.probe_cpus or ctx.usable)
    mine = [ld for ld in ctx.loads if not ctx.load_cpus.get(ld) or here & set(ctx.load_cpus[ld])]
    t: list[Tuning] = [SchedTuning(kind="sched", load=ld, policy="other") for ld in mine]
    cpu = ",".join(map(str, sorted(here)))
    return Remedy(
        "take real-time priority from the busy real-time task on the probe's CPU (SCHED_OTHER, or a budget of its own with SCHED_DEADLINE): "
        "it spent the CPU's real-time share (sched_rt_runtime_us of every sched_rt_period_us) and the kernel then held every real-time thread there, the probe too",
        "real-time bandwidth (sched_rt_runtime_us) and the tasks' policies",
        f'chrt -o -p 0 <pid>   # find it: ps -eLo tid,cls,rtprio,psr,pcpu,comm | awk \'$2 == "FF" || $2 == "RR"\' on CPU {cpu}; '
        "lifting the limit (echo -1 > /proc/sys/kernel/sched_rt_runtime_us) lets a runaway spinner keep the CPU for good",
        False,
        t,
        by_hand="" if t else "no load of the phase shares the probe's CPU: the real-time task is not one the experiment starts",
    )


#: the share of a CPU a neighbour that slowed the probe keeps in the follow-up: 1 ms a second, stopped
#: in effect (a tenth of a CPU still left one cycle in ten cold here, and moving it to the other CPU helped not at all)
NEIGHBOUR_CPUS = 0.001


def _quiet_neighbours(ctx: Context) -> Remedy:
    """The probe ran slower with no kernel event in its way: what slowed it
    ran beside it (on its CPU between its runs, or on another CPU sharing
    the cache and the memory). Hold the phase's loads to 1 ms of CPU a
    second, stopped in effect while the phase keeps them."""
    here = set(ctx.probe_cpus)
    _, rest = _away(ctx)
    # a load on the probe's own CPU that never preempted it (SCHED_IDLE, or between its runs) left the caches
    # cold for it; a load elsewhere shares the cache and the memory: each held to 1 ms a second
    beside = [ld for ld in ctx.loads if here and here & set(ctx.load_cpus.get(ld) or [])]
    away = [ld for ld in ctx.loads if ld not in beside]
    t: list[Tuning] = [LimitTuning(kind="limit", load=ld, cpus=NEIGHBOUR_CPUS) for ld in beside + away]
    who = ", ".join(beside + away) or "the busiest process beside it"
    return Remedy(
        f"stop, limit or move {who}: the probe's own work ran longer with nothing in its way the kernel records, so what took the memory bandwidth or "
        "the shared cache, or wrote the memory it reads, ran beside it (or the host took the vCPU: steal time)",
        "neighbours' CPU time (cgroup limit), cache and memory bandwidth partitioning (resctrl CAT/MBA where the CPU has it)",
        "echo '10000 100000' > /sys/fs/cgroup/<neighbour>/cpu.max   # or systemd-run --scope -p CPUQuota=10% <command>; "
        "check: the span's run time with the neighbour stopped; where the CPU has them: perf stat -e LLC-load-misses, pqos -m all:<cpus>",
        False,
        t,
        by_hand="" if t else "the phase has no loads: the neighbour is not one the experiment starts",
    )


def _quiet_senders(cause: str, senders: list[str]) -> Remedy:
    """Cross-CPU calls come from a task on another CPU: the probe cannot
    move away from them (they are aimed at the CPU it is on, wherever that
    is; moving it beside the sender made it 2.3 times later here). The
    phase's loads elsewhere are the suspects: each held to 1 ms of CPU a
    second; the follow-up says whether they were the senders."""
    who = ", ".join(senders)
    t: list[Tuning] = [LimitTuning(kind="limit", load=ld, cpus=NEIGHBOUR_CPUS) for ld in senders]
    return Remedy(
        f"stop, limit or move what sends the {cause[len('IPI: ') :]}s aimed at the probe's CPU: a task on another CPU sends them, and the phase's "
        f"loads there ({who}) are the suspects",
        "the senders of cross-CPU calls (what they do: perf events toggled, memory unmapped, CPUs' state changed)",
        "trace-cmd record -e ipi:ipi_send_cpu -e ipi:ipi_send_cpumask -e irq_vectors:call_function_single_entry, then trace-cmd report: each send names "
        "its task and callsite; isolating the CPU (isolcpus=, nohz_full=) keeps most kernel senders off it",
        False,
        t,
    )


def _kdamonds() -> list[str]:
    return [str(p) for p in sorted(Path("/sys/kernel/mm/damon/admin/kdamonds").glob("[0-9]*/state"))]
