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
- ``timer interrupt late``: the thread slept on a timer, and another task
  ran on its CPU from the timer's expiry to the interrupt that woke it.
  That task held nothing up unless it kept interrupts off in the kernel,
  and a hypervisor may deliver the interrupt late; neither is named (a
  user-space spinner beside a SCHED_FIFO timer in this VM took 0.3-1 ms
  of such outliers, which the older rule gave the spinner);
- ``scheduling latency``: the thread had been woken, the CPU was idle;
- ``unexplained``: no capture covers the time.

Who ran when comes from ``sched_stat_runtime`` where it was recorded (each
event says a task ran for ``runtime`` ns up to now; a run starts no earlier
than the task's wake-up or its recorded switch-in), and from ``sched_switch``
where it was not: some kernels do not record tracepoints fired from the idle
task, so a switch out of idle can be missing while the runtime of the task
that followed is not, and a user's recording often has switches only.
Switch-outs, wake-ups, migrations and page faults of the thread refine the
picture and are counted. A window that overlaps events
the capture lost (on any CPU: the wake-up may have been on another) is
marked incomplete, as is every window of a capture whose losses cannot be
placed in time, and a window whose switch-in cannot be found.

Times are the kernel's CLOCK_MONOTONIC; a record's own times are moved onto
it by the host's time-namespace offset.

The split itself is native (``crates/ktrace/src/attrib.rs``): one call per
cluster of windows builds the CPUs' and the threads' pictures in one pass
over the cluster's events and splits every window, so explain's cost grows
with the events around the outliers, not with Python per outlier. This
module prepares the columns (text as indices into string tables), names
the lab's and the loads' threads, and turns the result into a table; the
per-CPU views below (the same pass's picture) serve the Perfetto export's
kernel tracks.
"""

from __future__ import annotations

from dataclasses import dataclass, field
import typing
from collections.abc import Iterator, Mapping
from typing import TYPE_CHECKING

from typing_extensions import TypedDict

import numpy as np
import polars as pl

from loopscope import _native
import re

if TYPE_CHECKING:
    from loopscope._native import _Split as Split
    from loopscope.kernel.store import Reads

#: the native split's name for a timer interrupt that came late while another task ran
LATE_IRQ: str = _native.LATE_IRQ

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
    "lab: emulator": "loopscope's user-space link emulator, standing in for the router of a real network (it forwards the emulated links' packets on the CPUs the probes use); emulator: {cpu: N, poll: true} moves it to a CPU of its own, a real router or netem on real machines removes it",
    "lab: agent": "loopscope's agent or controller (starts and stops probes and loads)",
    "lab: sync": "loopscope's clock-sync probes",
    "lab: probe": "a loopscope probe's own process besides its measuring threads: its start-up, its wait for them, its results and exit",
    LATE_IRQ: "the thread's timer expired while another task ran, and its interrupt came late: kernel code with interrupts off, or a hypervisor that delivered it late (a guest cannot tell which; the task that ran is not named, since it did not hold the wake-up otherwise)",
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
    names first (by thread id), then the names loopscope's components give
    themselves (one rule, in ``crates/ktrace``), else ``thread: <comm>``."""
    if roles and pid in roles:
        return roles[pid]
    return str(_native.ktrace_task_label(comm or "?", int(pid), perf_is_lab))


@dataclass
class CpuView:
    """One CPU as attribution reads it: its task runs (labelled as causes)
    and its interrupt segments (the innermost handler's label), in time order."""

    run_s: np.ndarray
    run_e: np.ndarray
    run_pid: np.ndarray
    run_label: list[str]
    irq_s: np.ndarray
    irq_e: np.ndarray
    irq_label: list[str]


def cpu_views(ev: pl.DataFrame, roles: dict[int, str] | None = None, perf_is_lab: bool = False) -> dict[int, CpuView]:
    """Per CPU: which task ran when and which interrupt handler, innermost
    first, as the native split reads them (a run's start no earlier than its
    wake-up or its recorded switch-in, the switches' runs where runtime
    accounting has none): the Perfetto export's kernel tracks show what
    explain's causes were split by."""
    k = Kernel.of(ev, 0, roles=roles, perf_is_lab=perf_is_lab)
    got = _native.ktrace_cpu_pictures(
        {c: a for c, a in k.cols.items()} if isinstance(k.cols, Mapping) else {},
        k.event_names,
        k.comms,
        k.states,
        k.names,
        list(k.roles),
        list(k.roles.values()),
        k.perf_is_lab,
        k.t_first,
        k.t_last,
    )
    return {int(c): CpuView(*v) for c, v in got.items()}


# A column the native split takes: an int64 or int32 array, or chunks of them in time order.
Column = np.ndarray | list[np.ndarray]
#: a string table: a list, or one made native once (``_native.StringTable``)
Strings = list[str] | _native.StringTable
NUMERIC = ("t_ns", "cpu", "pid", "target", "next_pid", "runtime", "expires", "softexpires", "prio", "next_prio")


@dataclass
class Kernel:
    """A cluster's events as the native attribution takes them: numeric
    columns (-1 for none) and text as indices into string tables."""

    #: the columns, batches of them in time order (``arrays``: read as they are split, once), or
    #: what the native split reads itself from the capture's files (``Store.reads``)
    cols: Mapping[str, Column] | Iterator[Mapping[str, Column]] | Reads
    event_names: list[str]
    #: string tables: a list, or a capture's ``_native.StringTable`` (shared by every cluster, not copied)
    comms: Strings
    states: Strings
    names: Strings
    lost: int
    t_first: int
    t_last: int
    # where the lost events were (cpu, start_ns, end_ns, events); None: unknown
    lost_at: pl.DataFrame | None = None
    roles: dict[int, str] = field(default_factory=dict)
    perf_is_lab: bool = False
    #: measured threads under a CPU limit → the limited cgroup's path (``host.cpulimit``)
    groups: dict[int, str] = field(default_factory=dict)

    @classmethod
    def of(
        cls, ev: pl.DataFrame, lost: int, lost_windows: pl.DataFrame | None = None, roles: dict[int, str] | None = None, perf_is_lab: bool = False
    ) -> "Kernel":
        """From events with text columns (a parsed perf.data, hand-made events)."""
        cols = _numbers(ev)
        tables: dict[str, list[str]] = {"event": [], "comm": [], "state": [], "name": []}
        for c, t in (("event", "event"), ("target_comm", "comm"), ("next_comm", "comm"), ("prev_state", "state"), ("name", "name")):
            s = ev[c].cast(pl.String) if c in ev.columns else pl.Series(c, [None] * len(ev), dtype=pl.String)
            new = [x for x in s.drop_nulls().unique(maintain_order=True).to_list() if x not in tables[t]]
            tables[t] += new
            cols[c] = (
                s.replace_strict(tables[t], list(range(len(tables[t]))), default=-1, return_dtype=pl.Int64).to_numpy()
                if tables[t]
                else np.full(len(ev), -1, dtype=np.int64)
            )
        ts = ev["t_ns"]
        return cls._make(
            cols,
            tables["event"],
            tables["comm"],
            tables["state"],
            tables["name"],
            lost,
            lost_windows,
            roles,
            perf_is_lab,
            int(ts.min()) if len(ts) else 0,  # type: ignore[arg-type]
            int(ts.max()) if len(ts) else 0,  # type: ignore[arg-type]
        )

    @classmethod
    def coded(
        cls,
        ev: pl.DataFrame,
        strings: list[str],
        event_names: list[str],
        lost: int,
        lost_windows: pl.DataFrame | None = None,
        roles: dict[int, str] | None = None,
        perf_is_lab: bool = False,
    ) -> "Kernel":
        """From a capture's stored events (text already indices into ``strings``)."""
        cols = _numbers(ev)
        for c in ("event", "target_comm", "next_comm", "prev_state", "name"):
            cols[c] = ev[c].fill_null(-1).cast(pl.Int64).to_numpy()
        t = ev["t_ns"].to_numpy()
        span = (int(t.min()), int(t.max())) if len(t) else (0, 0)
        return cls._make(cols, event_names, strings, strings, strings, lost, lost_windows, roles, perf_is_lab, *span)

    @classmethod
    def arrays(
        cls,
        cols: Mapping[str, Column] | Iterator[Mapping[str, Column]] | Reads,
        strings: Strings,
        event_names: list[str],
        lost: int,
        lost_windows: pl.DataFrame | None = None,
        roles: dict[int, str] | None = None,
    ) -> "Kernel":
        """From events as chunks of int64 or int32 arrays (-1: none; text as
        codes), as batches of them in time order (the split takes each as it
        comes and holds none, so it splits once), or as a capture's row ranges
        the split reads itself (``Store.reads``); in the last two,
        ``t_first``/``t_last`` are the caller's to set."""
        if not isinstance(cols, Mapping):
            return cls._make(cols, event_names, strings, strings, strings, lost, lost_windows, roles, False, 0, 0)
        t = [c for c in cols["t_ns"] if len(c)]
        return cls._make(
            dict(cols), event_names, strings, strings, strings, lost, lost_windows, roles, False, int(t[0][0]) if t else 0, int(t[-1][-1]) if t else 0
        )

    @classmethod
    def _make(
        cls,
        cols: Mapping[str, Column] | Iterator[Mapping[str, Column]] | Reads,
        event_names: list[str],
        comms: Strings,
        states: Strings,
        names: Strings,
        lost: int,
        lost_windows: pl.DataFrame | None,
        roles: dict[int, str] | None,
        perf_is_lab: bool,
        t_first: int,
        t_last: int,
    ) -> "Kernel":
        placed = lost_windows is not None and int(lost_windows["events"].sum() or 0) >= lost
        return cls(cols, event_names, comms, states, names, lost, t_first, t_last, lost_windows if placed else None, roles or {}, perf_is_lab)

    def lost_in(self, a: int, b: int) -> str | None:
        """Why [a, b) cannot be complete because of lost events, or None
        (what the native split says of a window)."""
        r = self.split(pl.DataFrame({"id": [0], "tid": [-2], "start_k": [a], "end_k": [b], "span": [False]}))
        m = r["missing"][0]
        if not m:
            return None
        lost = [x for x in m.split("; ") if "kernel events lost" in x]
        return lost[0] if lost else None

    def split(self, rows: pl.DataFrame) -> Split:
        """The native split of ``rows`` (``id``, ``tid``, ``start_k``, ``end_k``, ``span``)."""
        la = None
        if self.lost_at is not None:
            la = typing.cast(
                "tuple[list[int], list[int], list[int], list[int]]",
                tuple(self.lost_at[c].cast(pl.Int64).to_list() for c in ("cpu", "start_ns", "end_ns", "events")),
            )
        span = rows["span"].fill_null(False) if "span" in rows.columns else pl.Series([False] * len(rows))
        return _native.ktrace_attribute(
            self.cols,
            self.event_names,
            self.comms,
            self.states,
            self.names,
            list(self.roles),
            list(self.roles.values()),
            self.perf_is_lab,
            int(self.lost),
            la,
            int(self.t_first),
            int(self.t_last),
            rows["id"].cast(pl.Int64).to_numpy(),
            rows["tid"].cast(pl.Int64).to_numpy(),
            rows["start_k"].cast(pl.Int64).to_numpy(),
            rows["end_k"].cast(pl.Int64).to_numpy(),
            span.cast(pl.Boolean).to_numpy(),
            list(self.groups),
            list(self.groups.values()),
        )


def _numbers(ev: pl.DataFrame) -> dict[str, np.ndarray]:
    out = {}
    for c in NUMERIC:
        out[c] = ev[c].fill_null(-1).cast(pl.Int64).to_numpy() if c in ev.columns else np.full(len(ev), -1, dtype=np.int64)
    return out


class Attributed(TypedDict):
    """One window split into causes (ns each), with what the thread went through."""

    causes: dict[str, int]
    cpu: int | None
    migrations: int
    page_faults: int
    complete: bool
    missing: str | None


def _one(k: Kernel, tid: int, a: int, b: int, span: bool) -> Attributed:
    r = k.split(pl.DataFrame({"id": [0], "tid": [tid], "start_k": [a], "end_k": [b], "span": [span]}))
    causes = {r["causes"][int(c)]: int(ns) for c, ns in zip(r["cause"], r["ns"])}
    cpu = int(r["cpu"][0])
    return {
        "causes": causes if b > a else {},
        "cpu": None if cpu < 0 else cpu,
        "migrations": int(r["migrations"][0]),
        "page_faults": int(r["page_faults"][0]),
        "complete": bool(r["complete"][0]),
        "missing": r["missing"][0],
    }


def attribute(k: Kernel, tid: int, a: int, b: int) -> Attributed:
    """Split the wake-up window [a, b) (kernel CLOCK_MONOTONIC) of thread ``tid`` into causes (ns each)."""
    return _one(k, tid, a, b, False)


def attribute_span(k: Kernel, tid: int, a: int, b: int) -> Attributed:
    """Split [a, b), any interval of thread ``tid`` (work, a wait, a whole
    cycle), into what the thread was doing: ``running``, ``blocked: …``
    and, while it was runnable but not running, what ran instead."""
    return _one(k, tid, a, b, True)


SPLIT_SCHEMA = {
    "id": pl.Int64,
    "cause": pl.String,
    "ns": pl.Int64,
    "before_ns": pl.Int64,
    "cpu": pl.Int32,
    "migrations": pl.Int32,
    "page_faults": pl.Int32,
    "complete": pl.Boolean,
    "missing": pl.String,
    "rule": pl.String,
}


def attribute_many(k: Kernel, rows: pl.DataFrame) -> pl.DataFrame:
    """``rows`` with ``id``, ``tid``, ``start_k``, ``end_k`` (and optionally
    ``span``) → one row per (id, cause) with ``ns``, plus per id ``cpu``,
    ``migrations``, ``page_faults``, ``complete``, ``missing``. Each
    window's causes add up to its length (``unexplained`` takes the rest)."""
    return splits_table([k.split(rows)] if len(rows) else [])


def splits_table(splits: list[Split]) -> pl.DataFrame:
    """The native split's results (``Kernel.split``, one per cluster) as one
    table of ``SPLIT_SCHEMA``, built once for all of them."""
    if not splits:
        return pl.DataFrame(schema=SPLIT_SCHEMA)
    # each call numbers its causes from 0: one table of names for all
    names: dict[str, int] = {}
    codes = []
    for r in splits:
        remap = np.array([names.setdefault(c, len(names)) for c in r["causes"]], dtype=np.int64)
        codes.append(remap[r["cause"]] if len(remap) else np.zeros(0, dtype=np.int64))

    def cat(parts: list[np.ndarray]) -> np.ndarray:
        return np.concatenate(parts)

    causes = pl.Series("c", list(names), dtype=pl.String)
    per = pl.DataFrame(
        {
            "id": cat([r["w_id"] for r in splits]),
            "cpu": pl.Series(cat([r["cpu"] for r in splits])).replace(-1, None),
            "migrations": cat([r["migrations"] for r in splits]),
            "page_faults": cat([r["page_faults"] for r in splits]),
            "complete": cat([r["complete"] for r in splits]),
            "missing": pl.Series([m for r in splits for m in r["missing"]], dtype=pl.String),
            "rule": pl.Series([m for r in splits for m in r["rule"]], dtype=pl.String),
        }
    )
    rows_df = pl.DataFrame(
        {
            "id": cat([r["id"] for r in splits]),
            "cause": causes.gather(pl.Series(np.concatenate(codes))) if len(causes) else pl.Series([], dtype=pl.String),
            "ns": cat([r["ns"] for r in splits]),
            "before_ns": pl.Series(cat([r["before_ns"] for r in splits])).replace(-1, None),
        }
    )
    return rows_df.join(per, on="id", how="left", maintain_order="left").cast(SPLIT_SCHEMA).select(list(SPLIT_SCHEMA))  # type: ignore[arg-type]


# The states a thread sleeps in, as the labels of its sleep (a span's blocked time).
BLOCKED = {"S": "blocked: sleeping", "D": "blocked: uninterruptible (I/O)", "I": "blocked: idle kernel thread", "T": "blocked: stopped", "t": "blocked: traced"}


#: how a chain of causes is written: ``blocked: A ← preempted by B``
CHAIN = " \u2190 "


def cause_family(cause: str) -> str:
    """Group threads by name without their numbers (kworker/1:2 → kworker);
    in a chain, each task's name so."""

    if CHAIN in cause:
        head, _, tail = cause.partition(CHAIN)
        verb, _, who = tail.rpartition(" by ")
        return cause_family(head) + CHAIN + (f"{verb} by {cause_family(who)}" if verb else cause_family(tail))
    for pre in ("thread: ", "blocked: "):
        if cause.startswith(pre) and f"{cause}" not in BLOCKED.values() and not cause[len(pre) :].startswith(("lab: ", "load: ")):
            return pre + re.split(r"/|:|-\d|\.\d|\d+$", cause[len(pre) :])[0]
    return cause


def family(col: str = "cause") -> pl.Expr:
    """``cause_family`` of a column, as an expression. Applied once per row it
    dominated a report's explain (forty groups, each mapping every row in
    Python); this maps each distinct cause once, for any frame it is used on."""
    return pl.col(col).map_batches(_families, return_dtype=pl.String)


def _families(s: pl.Series) -> pl.Series:
    s = s.cast(pl.String)
    u = s.unique().drop_nulls()
    return s.replace_strict(u, [cause_family(str(c)) for c in u.to_list()], default=None, return_dtype=pl.String)
