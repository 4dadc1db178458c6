"""Why was it late: an interval split into its causes from kernel events.

For a latency record (any interval: a timer wake-up from its deadline to
when the thread ran, a sched-probe wake-up, user instrumentation) the window
[a, b] between when the work should have run and when it ran is split, on
the CPU the thread ran on, into what that CPU did meanwhile (the model is
timerlat's auto-analysis, done here from tracepoints for any interval):

- ``return to user space``: from the thread's switch-in to b;
- ``thread: <comm>``: another task ran on the CPU while the thread waited
  (before its wake-up: the wake-up itself was held up; after: it waited for
  the CPU); ``lab: capture|emulator|agent|sync`` when that task was one of
  loopscope's own (``loopscope.selfname``), ``load: <name>`` when it was a
  worker of a background load;
- ``irq: <name>``, ``softirq: <action>``, ``timer interrupt``, ``IPI: …``:
  interrupt handlers, taken out of whatever they interrupted;
- ``CPU idle``: nothing ran, yet the thread did not: its wake-up came late
  (the timer interrupt, the exit from idle, or a hypervisor that did not
  run the vCPU; the guest cannot tell these apart);
- ``scheduling latency``: the thread had been woken, the CPU was idle;
- ``unexplained``: no capture covers the time.

Who ran when comes from ``sched_stat_runtime`` (each event says a task ran
for ``runtime`` ns up to now), not from ``sched_switch`` alone: some kernels
(this VM's among them) do not record tracepoints fired from the idle task,
so a switch out of idle can be missing while the runtime of the task that
followed is not. Switch-outs, wake-ups, migrations and page faults of the
thread refine the picture and are counted. A window that overlaps events
the capture lost (on any CPU: the wake-up may have been on another) is
marked incomplete, as is every window of a capture whose losses cannot be
placed in time, and a window whose switch-in cannot be found.

Times are the kernel's CLOCK_MONOTONIC; a record's own times are moved onto
it by the host's time-namespace offset.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any

import numpy as np
import polars as pl

IRQ_PAIRS = {
    "irq_handler_entry": ("irq_handler_exit", "irq"),
    "softirq_entry": ("softirq_exit", "softirq"),
    "local_timer_entry": ("local_timer_exit", "timer interrupt"),
    "call_function_single_entry": ("call_function_single_exit", "IPI: function call"),
    "call_function_entry": ("call_function_exit", "IPI: function call"),
    "reschedule_entry": ("reschedule_exit", "IPI: reschedule"),
}


# What the kernel threads attribution names are for, in a line each (by family).
ROLES = {
    "thread: kdamond": "DAMON memory monitoring: samples which memory is accessed (on when a DAMON user such as proactive reclaim is set up)",
    "thread: ksoftirqd": "soft interrupts the kernel deferred to a thread when too many came at once (network receive, timers, RCU)",
    "thread: kworker": "kernel work queues: deferred work of drivers, filesystems and memory management",
    "thread: rcu_preempt": "RCU grace periods: lets freed kernel memory be reused once no reader can see it",
    "thread: rcu_sched": "RCU grace periods: lets freed kernel memory be reused once no reader can see it",
    "thread: rcu": "RCU grace periods and callbacks",
    "thread: rcuc": "RCU callbacks of this CPU",
    "thread: rcuog": "RCU callback offloading",
    "thread: rcuop": "RCU callback offloading",
    "thread: migration": "the stopper thread: moves tasks between CPUs, stops CPUs for the kernel",
    "thread: kswapd0": "reclaims memory when free memory runs low",
    "thread: kswapd": "reclaims memory when free memory runs low",
    "thread: kcompactd0": "compacts memory to make larger free blocks",
    "thread: kcompactd": "compacts memory to make larger free blocks",
    "thread: khugepaged": "collapses small pages into huge pages",
    "thread: jbd2": "ext4's journal commits",
    "thread: irq": "a threaded interrupt handler",
    "thread: cpuhp": "CPU hotplug",
    "thread: watchdog": "the soft-lockup watchdog",
    "thread: kauditd": "the audit subsystem",
    "thread: oom_reaper": "frees the memory of tasks killed for lack of memory",
    "lab: capture": "loopscope's kernel capture reader (runs between probe windows, SCHED_IDLE)",
    "lab: emulator": "loopscope's user-space link emulator (forwards the emulated links' packets)",
    "lab: agent": "loopscope's agent or controller (starts and stops probes and loads)",
    "lab: sync": "loopscope's clock-sync probes",
    "lab: probe": "a loopscope probe's own process besides its measuring threads: its start-up, its wait for them, its results and exit",
    "CPU idle": "nothing ran, yet the thread did not: its wake-up came late (timer interrupt, exit from a deep idle state, or a hypervisor that did not run the vCPU)",
    "scheduling latency": "the thread was woken and the CPU was idle, but it had not started running yet",
    "return to user space": "from the thread's switch-in to when it logged the event",
    "page faults": "the thread touched memory that was not there (paged out to swap, dropped from the page cache, never touched) and waited for the kernel to bring it in (mlockall keeps it resident)",
    "timer slack": "the thread slept on a timer with slack: the kernel may fire it anywhere up to the slack after its deadline, and the CPU idled until it did (SCHED_FIFO threads get none; PR_SET_TIMERSLACK or /proc/TID/timerslack_ns sets it)",
    "IPI: function call": "another CPU made this one run a function (smp_call_function: perf, cpufreq, memory management, membarrier)",
    "IPI: TLB shootdown": "another CPU changed a memory map this CPU had loaded and made it flush its TLB",
    "IPI: reschedule": "another CPU woke a task onto this one",
    "timer interrupt": "the local timer interrupt: high-resolution timers expiring on this CPU (their callbacks run in it) and the scheduler tick",
    "lab: writer": "the trace writer thread loopscope puts in every traced process (moves records from the threads' buffers to the file)",
}


def role_of(cause: str) -> str | None:
    """The one-line role of a cause family (a kernel thread, a lab component), if known."""
    if cause in ROLES:
        return ROLES[cause]
    if cause.startswith("load: "):
        return f"the background load {cause[6:]!r} of this phase"
    return None


def task_label(comm: str | None, pid: int, roles: dict[int, str] | None = None, perf_is_lab: bool = False) -> str:
    """How attribution names a task that ran: the lab's and the loads' own
    names first (by thread id, then by the name they gave themselves), else
    ``thread: <comm>``."""
    if roles and pid in roles:
        return roles[pid]
    c = comm or "?"
    if c == "ls-kcapture" or (perf_is_lab and c == "perf"):
        return "lab: capture"
    if c.startswith("ls-netem"):
        return "lab: emulator"
    if c in ("ls-agent", "ls-ctl"):
        return "lab: agent"
    if c.startswith("ls-sync"):
        return "lab: sync"
    if c == "ls-probe":
        return "lab: probe"
    if c == "loopscope-wr":
        return "lab: writer"
    if c.startswith("ld:"):
        return f"load: {c[3:]}"
    return f"thread: {c}"


@dataclass
class CpuView:
    """One CPU: task run segments (from runtime accounting) and interrupt segments."""

    run_s: np.ndarray
    run_e: np.ndarray
    run_pid: np.ndarray
    run_comm: list[str]
    irq_s: np.ndarray
    irq_e: np.ndarray
    irq_label: list[str]
    run_label: list[str] = field(default_factory=list)


@dataclass
class Kernel:
    cpus: dict[int, CpuView]
    events: pl.DataFrame
    lost: int
    t_first: int
    t_last: int
    by_tid: dict[int, pl.DataFrame] = field(default_factory=dict)
    # where the lost events were (cpu, start_ns, end_ns, events); None: unknown
    lost_at: pl.DataFrame | None = None
    roles: dict[int, str] = field(default_factory=dict)
    perf_is_lab: bool = False
    _comms: dict[int, str] | None = None

    @classmethod
    def of(cls, ev: pl.DataFrame, lost: int, lost_windows: pl.DataFrame | None = None, roles: dict[int, str] | None = None, perf_is_lab: bool = False) -> "Kernel":
        cpus: dict[int, CpuView] = {}
        labels: dict[tuple[str | None, int], str] = {}
        rt = ev.filter((pl.col("event") == "sched_stat_runtime") & (pl.col("target") != 0) & pl.col("runtime").is_not_null())
        irq = ev.filter(pl.col("event").is_in([*IRQ_PAIRS, *(v[0] for v in IRQ_PAIRS.values())]))
        tlb = ev.filter(pl.col("event") == "csd_function_entry")
        for c in sorted(set(ev["cpu"].unique().to_list())):
            r = rt.filter(pl.col("cpu") == c).sort("t_ns")
            segs_s, segs_e, irq_labels = _irq_segments(irq.filter(pl.col("cpu") == c))
            _name_tlb(segs_s, segs_e, irq_labels, tlb.filter(pl.col("cpu") == c)["t_ns"].to_numpy())
            comms, pids = r["target_comm"].to_list(), r["target"].to_list()
            run_label = []
            for cm, pd in zip(comms, pids):
                key = (cm, pd)
                if key not in labels:
                    labels[key] = task_label(cm, pd, roles, perf_is_lab)
                run_label.append(labels[key])
            cpus[int(c)] = CpuView(
                (r["t_ns"] - r["runtime"]).to_numpy(), r["t_ns"].to_numpy(), r["target"].to_numpy(), comms,
                segs_s, segs_e, irq_labels, run_label,
            )
        t = ev["t_ns"]
        placed = lost_windows is not None and int(lost_windows["events"].sum() or 0) >= lost
        k = cls(cpus, ev, lost, int(t.min()) if len(t) else 0, int(t.max()) if len(t) else 0, lost_at=lost_windows if placed else None)  # type: ignore[arg-type]
        k.roles, k.perf_is_lab = roles or {}, perf_is_lab
        return k

    def name_of(self, tid: int) -> str:
        """How attribution names the task ``tid`` (its comm from the events that name it)."""
        if self._comms is None:
            e = self.events
            a = e.filter(pl.col("target").is_not_null() & pl.col("target_comm").is_not_null() & (pl.col("event") != "sched_waking") & (pl.col("event") != "sched_wakeup")).select(pl.col("target").alias("t"), pl.col("target_comm").alias("c"))
            b = e.filter(pl.col("next_pid").is_not_null() & pl.col("next_comm").is_not_null()).select(pl.col("next_pid").alias("t"), pl.col("next_comm").alias("c"))
            self._comms = dict(pl.concat([a, b]).unique("t", keep="last").iter_rows())
        return task_label(self._comms.get(tid) or f"tid {tid}", tid, self.roles, self.perf_is_lab)

    def lost_in(self, a: int, b: int) -> str | None:
        """Why [a, b) cannot be complete because of lost events, or None."""
        if not self.lost:
            return None
        if self.lost_at is None:
            return f"{self.lost} kernel events lost at unknown times"
        w = self.lost_at.filter((pl.col("start_ns") < b) & (pl.col("end_ns") >= a))
        if not len(w):
            return None
        cpus = ", ".join(str(c) for c in sorted(set(w["cpu"].to_list())))
        return f"{int(w['events'].sum())} kernel events lost inside the window (CPU {cpus})"

    def thread(self, tid: int) -> dict[str, np.ndarray]:
        """The thread's own events as sorted arrays, once per thread: its
        runtime segments, switch-ins, wake-ups, migrations and page faults."""
        if tid not in self.by_tid:
            e = self.events
            ev = pl.col("event")
            rt = e.filter((ev == "sched_stat_runtime") & (pl.col("target") == tid) & pl.col("runtime").is_not_null()).sort("t_ns")
            sw = e.filter((ev == "sched_switch") & (pl.col("next_pid") == tid)).sort("t_ns")
            so = e.filter((ev == "sched_switch") & (pl.col("target") == tid)).sort("t_ns")
            self.by_tid[tid] = {
                "so_t": so["t_ns"].to_numpy(), "so_state": so["prev_state"].to_list(),
                "rs": (rt["t_ns"] - rt["runtime"]).to_numpy(), "re": rt["t_ns"].to_numpy(), "rc": rt["cpu"].to_numpy(),
                "sw_t": sw["t_ns"].to_numpy(), "sw_c": sw["cpu"].to_numpy(),
                "wake": e.filter((ev == "sched_wakeup") & (pl.col("target") == tid))["t_ns"].sort().to_numpy(),
                "migr": e.filter((ev == "sched_migrate_task") & (pl.col("target") == tid))["t_ns"].sort().to_numpy(),
                "pf": e.filter((ev == "page_fault_user") & (pl.col("tid") == tid))["t_ns"].sort().to_numpy(),
            }
            wk = e.filter((ev == "sched_waking") & (pl.col("target") == tid)).sort("t_ns")
            self.by_tid[tid].update({"wk_t": wk["t_ns"].to_numpy(), "wk_by": wk["tid"].to_numpy()})
            hs = e.filter((ev == "hrtimer_start") & (pl.col("tid") == tid) & pl.col("expires").is_not_null()).sort("t_ns")
            self.by_tid[tid].update({"hs_t": hs["t_ns"].to_numpy(), "hs_exp": hs["expires"].to_numpy(), "hs_soft": hs["softexpires"].to_numpy()})
        return self.by_tid[tid]  # type: ignore[return-value]


def _irq_segments(ev: pl.DataFrame) -> tuple[np.ndarray, np.ndarray, list[str]]:
    """Flatten nested entry/exit pairs into segments labelled by the innermost
    handler, without a loop per event: the nesting depth after each event is
    a running sum floored at zero (a window that starts inside a handler sees
    its exit first), and the innermost handler at depth d is the latest entry
    that brought the depth to d."""
    if not len(ev):
        return np.array([], dtype=np.int64), np.array([], dtype=np.int64), []
    exits = [v[0] for v in IRQ_PAIRS.values()]
    kind = pl.col("event").replace_strict({k: v[1] for k, v in IRQ_PAIRS.items()}, default=None)
    d = ev.select("t_ns", "event", "name").with_columns(
        pl.when(pl.col("event").is_in(list(IRQ_PAIRS))).then(1).when(pl.col("event").is_in(exits)).then(-1).otherwise(0).alias("step"),
        pl.when(kind.is_in(["irq", "softirq"]) & pl.col("name").is_not_null()).then(kind + ": " + pl.col("name")).otherwise(kind).alias("label"),
    ).with_columns(pl.col("step").cum_sum().alias("s"))
    d = d.with_columns((pl.col("s") - pl.min_horizontal(pl.lit(0), pl.col("s").cum_min())).alias("depth"))
    d = d.with_columns(pl.when(pl.col("step") == 1).then(pl.col("label")).forward_fill().over("depth").alias("top"),
                       pl.col("t_ns").shift(-1).alias("t_next"))
    seg = d.filter((pl.col("depth") > 0) & pl.col("t_next").is_not_null() & (pl.col("t_next") > pl.col("t_ns")))
    return seg["t_ns"].to_numpy(), seg["t_next"].to_numpy().astype(np.int64), seg["top"].to_list()


def _name_tlb(s: np.ndarray, e: np.ndarray, labels: list[str], flushes: np.ndarray) -> None:
    """An IPI whose handler ran a TLB flush (the capture records the IPI
    functions only when they are ``flush_tlb_func``) is a TLB shootdown."""
    if not len(flushes) or not len(s):
        return
    k = np.searchsorted(s, np.sort(flushes), side="right") - 1
    for j, t in zip(k, np.sort(flushes)):
        if j >= 0 and t <= e[j] and labels[j].startswith("IPI: function call"):
            labels[j] = "IPI: TLB shootdown"


def _overlaps(s: np.ndarray, e: np.ndarray, u: int, v: int) -> list[tuple[int, int, int]]:
    """(index, start, end) of segments overlapping [u, v), clipped to it."""
    out = []
    i = int(np.searchsorted(e, u, side="right"))
    # segments are sorted by start; ends almost so: step back over stragglers
    while i > 0 and e[i - 1] > u:
        i -= 1
    for j in range(i, len(s)):
        if s[j] >= v:
            break
        a, b = max(int(s[j]), u), min(int(e[j]), v)
        if b > a:
            out.append((j, a, b))
    return out


def _activity(cv: CpuView | None, u: int, v: int, tid: int, woke: int | None, out: dict[str, int], slack: tuple[int, int] | None = None, fault: int | None = None) -> None:
    """Add to ``out`` what CPU ``cv`` did over [u, v) while the thread ``tid``
    waited. ``slack``: the thread slept on a timer that could fire anywhere
    in [soft, hard); idle time there before its wake-up is ``timer slack``.
    ``fault``: the thread took a page fault then, after its wake-up; its own
    time and the idle time from then on (it waited for the page: a swap-in,
    a read of the file) are ``page faults``."""
    if v <= u:
        return
    if cv is None:
        out["unexplained"] = out.get("unexplained", 0) + (v - u)
        return
    irqs = _overlaps(cv.irq_s, cv.irq_e, u, v)
    for j, a, b in irqs:
        out[cv.irq_label[j]] = out.get(cv.irq_label[j], 0) + (b - a)
    covered = [(a, b) for _, a, b in irqs]
    # Interrupt segments are disjoint and sorted: how much of [x, y) they
    # cover comes from a running sum, so a long window stays linear.
    ia = np.array([a for a, _ in covered], dtype=np.int64)
    ib = np.array([b for _, b in covered], dtype=np.int64)
    cum = np.concatenate([[0], np.cumsum(ib - ia)])

    def irq_before(t: int) -> int:
        k = int(np.searchsorted(ib, t, side="right"))
        return int(cum[k]) + (max(0, t - int(ia[k])) if k < len(ia) else 0)

    prev_end = u
    for j, a, b in _overlaps(cv.run_s, cv.run_e, u, v):
        if int(cv.run_pid[j]) == tid:
            continue
        a2 = max(a, prev_end)  # runs on one CPU do not overlap; where accounting says so, count once
        d = (b - a2) - (irq_before(b) - irq_before(a2)) if b > a2 else 0
        if d > 0:
            key = cv.run_label[j] if cv.run_label else f"thread: {cv.run_comm[j]}"
            out[key] = out.get(key, 0) + d
        covered.append((a, b))
        prev_end = max(prev_end, b)
    # the rest: idle, before the wake-up (it came late) or after (scheduling latency)
    gaps: list[tuple[int, int]] = []
    t = u
    for x, y in sorted(covered):
        if x > t:
            gaps.append((t, min(x, v)))
        t = max(t, y)
    if t < v:
        gaps.append((t, v))
    cut = v if woke is None else min(max(woke, u), v)
    if slack is not None:
        lo, hi = max(slack[0], u), min(slack[1], cut)
        held = sum(max(0, min(gb, hi) - max(ga, lo)) for ga, gb in gaps)
        if held > 0:
            out["timer slack"] = out.get("timer slack", 0) + held
            gaps = [g for ga, gb in gaps for g in ((ga, min(gb, lo)), (max(ga, hi), gb)) if g[1] > g[0]]
    if fault is not None and u <= fault < v:
        held = sum(max(0, gb - max(ga, fault)) for ga, gb in gaps)
        if held > 0:
            out["page faults"] = out.get("page faults", 0) + held
            gaps = [(ga, min(gb, fault)) for ga, gb in gaps if min(gb, fault) > ga]
    before = sum(max(0, min(gb, cut) - ga) for ga, gb in gaps)
    after = sum(max(0, gb - max(ga, cut)) for ga, gb in gaps)
    if before:
        out["CPU idle"] = out.get("CPU idle", 0) + before
    if after:
        out["scheduling latency"] = out.get("scheduling latency", 0) + after


def _and(a: str | None, b: str) -> str:
    return f"{a}; {b}" if a else b


def _window_info(k: Kernel, a: int, b: int) -> dict[str, Any]:
    """What every window's result carries, with what makes it incomplete
    before any thread is looked at: lost events, the capture's edges."""
    lost = k.lost_in(a, b)
    info: dict[str, Any] = {"migrations": 0, "page_faults": 0, "cpu": None, "complete": lost is None, "missing": lost, "switch_in": None}
    if b > a and (a < k.t_first or b > k.t_last):
        info["complete"] = False
        info["missing"] = _and(info["missing"], "the window is not inside the capture")
    return info


def _count_in(x: np.ndarray, a: int, b: int) -> int:
    return int(np.searchsorted(x, b, side="right") - np.searchsorted(x, a, side="left"))


def attribute(k: Kernel, tid: int, a: int, b: int) -> dict[str, Any]:
    """Split [a, b) (kernel CLOCK_MONOTONIC) for thread ``tid`` into causes (ns each)."""
    out: dict[str, int] = {}
    info = _window_info(k, a, b)
    if b <= a:
        return {"causes": out, **info}
    th = k.thread(tid)
    rs, re_, rc = th["rs"], th["re"], th["rc"]
    # The thread's run that contains b: the first runtime event at or after b,
    # chained back over contiguous segments on the same CPU to the switch-in.
    s_in: int | None = None
    cpu: int | None = None
    i = int(np.searchsorted(re_, b, side="left"))
    if i < len(re_) and rs[i] <= b:
        cpu = int(rc[i])
        s_in = int(rs[i])
        while i > 0 and rc[i - 1] == cpu and abs(int(re_[i - 1]) - s_in) < 2_000 and s_in > a:
            i -= 1
            s_in = int(rs[i])
    if s_in is None:
        # No runtime accounted across b: fall back on a recorded switch-in.
        j0, j1 = np.searchsorted(th["sw_t"], [a, b], side="left")[0], np.searchsorted(th["sw_t"], b, side="right")
        if j1 > j0:
            s_in, cpu = int(th["sw_t"][j1 - 1]), int(th["sw_c"][j1 - 1])
    if s_in is None:
        info["complete"] = False
        info["missing"] = _and(info["missing"], "the thread's switch-in was not recorded")
        s_in = b
    s_in = max(a, min(s_in, b))
    info["cpu"] = cpu
    info["switch_in"] = s_in
    w = th["wake"]
    wi = int(np.searchsorted(w, a, side="left"))
    woke = int(w[wi]) if wi < len(w) and w[wi] <= s_in else None
    info["migrations"] = _count_in(th["migr"], a, b)
    info["page_faults"] = _count_in(th["pf"], a, b)
    cv = k.cpus.get(cpu) if cpu is not None else None
    pf = th["pf"]
    # a fault in the window is the thread's own, so after its wake-up (recorded or not)
    fi = int(np.searchsorted(pf, a, side="left"))
    fault = int(pf[fi]) if fi < len(pf) and pf[fi] < s_in else None
    _activity(cv, a, s_in, tid, woke, out, _slack(th, a), fault)
    if b > s_in:
        ret: dict[str, int] = {}
        _activity(cv, s_in, b, tid, None, ret)
        # On its own CPU after the switch-in, idle means the thread itself was running.
        own = ret.pop("CPU idle", 0) + ret.pop("scheduling latency", 0)
        for key, ns in ret.items():
            out[key] = out.get(key, 0) + ns
        if own:
            out["return to user space"] = out.get("return to user space", 0) + own
    return {"causes": out, **info}


# A sleep in uninterruptible state this soon after one of the thread's page
# faults is the fault waiting for its page (a swap-in, a file read).
FAULT_BEFORE_NS = 200_000

# How far a window's start may be from the soft expiry of the timer the
# thread slept on for that timer to be the one it waited for.
SLACK_MATCH_NS = 20_000


def _slack(th: dict[str, np.ndarray], a: int) -> tuple[int, int] | None:
    """[soft, hard) expiry of the timer the thread armed for the deadline
    ``a`` (its last before ``a`` whose soft expiry is ``a``), when it had slack."""
    hs_t = th.get("hs_t")
    if hs_t is None or not len(hs_t):
        return None
    j = int(np.searchsorted(hs_t, a, side="right")) - 1
    if j < 0:
        return None
    soft, hard = int(th["hs_soft"][j]), int(th["hs_exp"][j])
    if abs(soft - a) > SLACK_MATCH_NS or hard <= soft:
        return None
    return soft, hard


def _slept_on_slack(th: dict[str, np.ndarray], t: int, w: int) -> int | None:
    """For a sleep from ``t`` to the wake-up ``w``: the soft expiry of the
    timer the thread armed as it went to sleep, when the wake-up came after
    it, within the timer's slack (the time from there to ``w`` is the slack's)."""
    hs_t = th.get("hs_t")
    if hs_t is None or not len(hs_t):
        return None
    j = int(np.searchsorted(hs_t, t + 2_000, side="right")) - 1
    if j < 0 or hs_t[j] < t - 1_000_000:
        return None
    soft, hard = int(th["hs_soft"][j]), int(th["hs_exp"][j])
    if hard <= soft or not (t <= soft < w <= hard + SLACK_MATCH_NS):
        return None
    return soft


BLOCKED = {"S": "blocked: sleeping", "D": "blocked: uninterruptible (I/O)", "I": "blocked: idle kernel thread", "T": "blocked: stopped", "t": "blocked: traced"}


def _blocked_by(k: Kernel, th: dict[str, np.ndarray], tid: int, t: int, x: int) -> tuple[str, int] | None:
    """``blocked: <task>`` when another task woke the thread out of the sleep
    that began at ``t`` (before its next run at ``x``): the lock's holder,
    the writer of the pipe, whoever it waited for. Wake-ups from interrupts
    are not recorded (timers, packets): those sleeps keep their state's label."""
    wt, wb = th.get("wk_t"), th.get("wk_by")
    if wt is None or not len(wt):
        return None
    i = int(np.searchsorted(wt, t, side="left"))
    if i >= len(wt) or wt[i] > x:
        return None
    by = int(wb[i])
    if by in (0, tid):
        return None
    name = k.name_of(by)
    return "blocked: " + (name[len("thread: "):] if name.startswith("thread: ") else name), int(wt[i])


def attribute_span(k: Kernel, tid: int, a: int, b: int) -> dict[str, Any]:
    """Split [a, b), any interval of thread ``tid`` (work, a wait, a whole
    cycle), into what the thread was doing: ``running`` (its own time on a
    CPU, less the interrupts inside it), ``blocked: …`` (off CPU by its own
    doing, by the state it switched out in: sleeping, uninterruptible I/O)
    and, while it was runnable but not running (preempted, or woken and not
    yet on a CPU), what ran instead on the CPU it next ran on: threads,
    interrupts, scheduling latency. The thread ran at the window's start
    (it logged it), so an off-CPU stretch with no switch-out of its own
    inside the window is preemption, never sleep."""
    out: dict[str, int] = {}
    info = _window_info(k, a, b)
    if b <= a:
        return {"causes": out, **info}
    th = k.thread(tid)
    rs, re_, rc = th["rs"], th["re"], th["rc"]
    segs: list[list[int]] = []
    j = int(np.searchsorted(re_, a, side="right"))
    while j < len(rs) and rs[j] < b:
        x, y, c = max(int(rs[j]), a), min(int(re_[j]), b), int(rc[j])
        if y > x:
            if segs and segs[-1][2] == c and x - segs[-1][1] < 2_000:
                segs[-1][1] = max(segs[-1][1], y)
            else:
                segs.append([x, y, c])
        j += 1
    if not segs:
        info["complete"] = False
        info["missing"] = _and(info["missing"], "no run of the thread was recorded in the window")
        return {"causes": {"unexplained": b - a}, **info}
    info["cpu"] = segs[-1][2]
    so_t, so_state, wake = th["so_t"], th["so_state"], th["wake"]
    t = a
    for n, (x, y, c) in enumerate([*segs, [b, b, segs[-1][2]]]):
        if x > t:
            cv = k.cpus.get(c)
            # The thread was running at `a` (it logged the interval's start
            # itself) and until `t` (its last run): only a switch-out where
            # that run ended can have put it to sleep (the runtime accounted
            # last may end a few µs before it); none recorded there means it
            # was preempted (its own switch-outs are recorded).
            i = int(np.searchsorted(so_t, max(a, t - 50_000) - 2_000, side="left"))
            state = (so_state[i] or "")[:1] if i < len(so_t) and so_t[i] <= x else "R"
            wi = int(np.searchsorted(wake, t, side="left"))
            w = int(wake[wi]) if wi < len(wake) and wake[wi] <= x else None
            if state in ("R", "W"):
                _activity(cv, t, x, tid, t, out)
            elif state:
                by = _blocked_by(k, th, tid, t, x)
                label = by[0] if by else BLOCKED.get(state, f"blocked ({state})")
                if state == "D" and not by and _count_in(th["pf"], t - FAULT_BEFORE_NS, t + 2_000):
                    label = "page faults"  # it blocked in the fault: waiting for the page
                woken = w
                if by and (w is None or by[1] < w):
                    # blocked until the other task woke it; from there to the
                    # wake-up taking effect, the wake-up's own delay
                    w = by[1]
                if w is None:
                    label += " (wake-up not recorded)" if n < len(segs) else ""
                    out[label] = out.get(label, 0) + (x - t)
                else:
                    slept = _slept_on_slack(th, t, w) if not by else None
                    if slept is not None:
                        # asleep until the timer's deadline, then held by its slack
                        out[label] = out.get(label, 0) + (slept - t)
                        out["timer slack"] = out.get("timer slack", 0) + (w - slept)
                    else:
                        out[label] = out.get(label, 0) + (w - t)
                    _activity(cv, w, x, tid, woken if woken is not None and woken >= w else w, out)
            else:
                _activity(cv, t, x, tid, w, out)
        if y > x:
            cv = k.cpus.get(c)
            irqs = _overlaps(cv.irq_s, cv.irq_e, x, y) if cv else []
            for jj, aa, bb in irqs:
                out[cv.irq_label[jj]] = out.get(cv.irq_label[jj], 0) + (bb - aa)  # type: ignore[union-attr]
            out["running"] = out.get("running", 0) + (y - x) - sum(bb - aa for _, aa, bb in irqs)
        t = max(t, y)
    info["migrations"] = _count_in(th["migr"], a, b)
    info["page_faults"] = _count_in(th["pf"], a, b)
    return {"causes": out, **info}


def attribute_many(k: Kernel, rows: pl.DataFrame) -> pl.DataFrame:
    """``rows`` with ``id``, ``tid``, ``start_k``, ``end_k`` (and optionally
    ``span``: True for any interval, split by ``attribute_span``; else a
    wake-up or wait, split by ``attribute``) → one row per (id, cause) with
    ``ns``, plus per id ``cpu``, ``migrations``, ``page_faults``,
    ``complete``, ``missing``."""
    out = []
    spans = rows["span"].to_list() if "span" in rows.columns else [False] * len(rows)
    for (rid, tid, a, b), span in zip(rows.select("id", "tid", "start_k", "end_k").iter_rows(), spans):
        r = (attribute_span if span else attribute)(k, int(tid), int(a), int(b))
        total = b - a
        causes = r["causes"] or {"unexplained": total}
        left = total - sum(causes.values())
        if left > 0:
            causes["unexplained"] = causes.get("unexplained", 0) + left
        for cause, ns in causes.items():
            out.append({"id": rid, "cause": cause, "ns": int(ns), "cpu": r["cpu"], "migrations": r["migrations"], "page_faults": r["page_faults"], "complete": r["complete"], "missing": r["missing"]})
    return pl.DataFrame(out, schema={"id": pl.Int64, "cause": pl.String, "ns": pl.Int64, "cpu": pl.Int32, "migrations": pl.Int32, "page_faults": pl.Int32, "complete": pl.Boolean, "missing": pl.String})


def cause_family(cause: str) -> str:
    """Group threads by name without their numbers (kworker/1:2 → kworker)."""
    import re

    for pre in ("thread: ", "blocked: "):
        if cause.startswith(pre) and f"{cause}" not in BLOCKED.values() and not cause[len(pre):].startswith(("lab: ", "load: ")):
            return pre + re.split(r"/|:|-\d|\.\d|\d+$", cause[len(pre):])[0]
    return cause
