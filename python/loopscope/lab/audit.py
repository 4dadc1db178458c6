"""``loopscope audit``: the real-time set-up of some CPUs, read and then watched.

The set-up is read first (``lab/rtsetup.py``). Then the CPUs are watched for
``--for`` seconds: which IRQs and softirqs fired there (``/proc/interrupts``,
``/proc/softirqs``), steal and busy SMT siblings (``/proc/stat``), and which
tasks and kthreads ran there, for how long (a kernel capture of
``sched_switch`` filtered to those CPUs; the task running when the watch
began is counted from its start to the first switch). Audit's own threads
and its capture's reader run on the other CPUs while it watches, and are
left out of what ran. Configured but ineffective isolation (an isolated CPU
that still takes an IRQ or runs a task) is said in the finding.
"""

from __future__ import annotations

import os
import re
import time
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path

import polars as pl
from typing_extensions import TypedDict

from loopscope.kernel import capture as C
from loopscope.kernel import store as S
from loopscope.host.isolate import cpu_list
from loopscope.lab.rtsetup import SYS, Finding, Task, cpus_text, said, setup, sysread, tasks
from loopscope.host import scratch


class Ran(TypedDict):
    """A thread that ran on the watched CPUs: where, how long, what it is."""

    cpu: int
    tid: int
    comm: str
    ns: int
    #: task, movable kthread or per-CPU kthread
    what: str


class Fired(TypedDict):
    """A device interrupt that fired on the watched CPUs."""

    irq: int
    name: str
    count: int


class AuditJson(TypedDict):
    """What ``loopscope audit --json`` prints."""

    cpus: list[int]
    watched_s: float
    #: None: the watch recorded who ran on the CPUs; else why it could not
    capture_refused: str | None
    findings: list[Finding]
    #: every thread that ran on the CPUs in the watch, longest first (empty without the capture)
    ran: list[Ran]
    #: every device interrupt that fired on the CPUs in the watch, most first
    irqs: list[Fired]


@dataclass
class Counters:
    """What the watch counts, per CPU: IRQ lines, softirqs, /proc/stat's times."""

    irqs: dict[str, list[int]] = field(default_factory=dict)  # line -> per-CPU counts
    irq_names: dict[str, str] = field(default_factory=dict)
    softirqs: dict[str, list[int]] = field(default_factory=dict)
    stat: dict[int, list[int]] = field(default_factory=dict)  # cpu -> user nice system idle iowait irq softirq steal

    @classmethod
    def read(cls) -> Counters:
        c = cls()
        lines = (sysread("/proc/interrupts") or "").splitlines()
        ncpu = len(lines[0].split()) if lines else 0
        for line in lines[1:]:
            head, _, rest = line.partition(":")
            parts = rest.split()
            counts = [int(x) for x in parts[:ncpu] if x.isdigit()]
            if len(counts) == ncpu:
                c.irqs[head.strip()] = counts
                c.irq_names[head.strip()] = " ".join(parts[ncpu:])
        for line in (sysread("/proc/softirqs") or "").splitlines()[1:]:
            head, _, rest = line.partition(":")
            c.softirqs[head.strip()] = [int(x) for x in rest.split()]
        for line in (sysread("/proc/stat") or "").splitlines():
            m = re.match(r"cpu(\d+) (.*)", line)
            if m:
                c.stat[int(m.group(1))] = [int(x) for x in m.group(2).split()[:8]]
        return c

    def minus(self, before: Counters) -> Counters:
        d = Counters(irq_names=self.irq_names)
        d.irqs = {k: [a - b for a, b in zip(v, before.irqs[k])] for k, v in self.irqs.items() if k in before.irqs}
        d.softirqs = {k: [a - b for a, b in zip(v, before.softirqs[k])] for k, v in self.softirqs.items() if k in before.softirqs}
        d.stat = {k: [a - b for a, b in zip(v, before.stat[k])] for k, v in self.stat.items() if k in before.stat}
        return d


def fired_irqs(d: Counters, cpus: list[int]) -> list[Fired]:
    """The device interrupts that fired on ``cpus`` over the watch, most first (the finding and ``irqs`` read this once)."""
    dev = {k: sum(v[c] for c in cpus if c < len(v)) for k, v in d.irqs.items() if k.isdigit()}
    return [{"irq": int(k), "name": d.irq_names.get(k, ""), "count": n} for k, n in sorted(dev.items(), key=lambda x: -x[1]) if n]


def watched(cpus: list[int], d: Counters, ran: pl.DataFrame | None, seconds: float, ts: list[Task]) -> list[Finding]:
    """What the watch counted on the CPUs."""
    f: list[Finding] = []
    want = cpus_text(cpus)
    isolated = set(cpu_list(sysread(SYS / "isolated") or ""))
    nohz = set(cpu_list(sysread(SYS / "nohz_full") or ""))
    ineff = sorted(isolated & set(cpus))
    for x in fired_irqs(d, cpus)[:8]:
        f.append(
            Finding(
                check="irq",
                cpus=cpus,
                what=f"IRQ {x['irq']} ({x['name']}) fired on CPU {want}" + (f" though CPU {cpus_text(ineff)} is isolated" if ineff else ""),
                why="each one stops your thread for the handler and the softirq it raises",
                evidence=f"{x['count']} times in {seconds:.1f} s (/proc/interrupts before and after)",
                remedy=f"echo <other CPUs> > /proc/irq/{x['irq']}/smp_affinity_list; stop irqbalance or --banirq {x['irq']}; "
                "a managed IRQ (the write refused) moves only with isolcpus=managed_irq at boot",
                remedy_kind="runtime",
            )
        )
    loc = sum(d.irqs.get("LOC", [0] * (max(cpus) + 1))[c] for c in sorted(nohz & set(cpus)))  # (the tick on the nohz_full ones)
    if loc and nohz & set(cpus):
        f.append(
            Finding(
                check="tick",
                cpus=sorted(nohz & set(cpus)),
                what="the timer interrupt still fires on a nohz_full CPU",
                why="nohz_full stops the tick only while one task runs there and nothing else needs it",
                evidence=f"LOC ×{loc} over {seconds:.1f} s ({loc / max(seconds, 1e-9):.0f}/s)",
                remedy="leave one runnable task on the CPU, and move timers and RCU off it (rcu_nocbs=, timer_migration)",
                remedy_kind="boot",
            )
        )
    soft = {k: sum(v[c] for c in cpus if c < len(v)) for k, v in d.softirqs.items()}
    soft = {k: n for k, n in soft.items() if n and k not in ("TIMER", "HRTIMER", "SCHED")}
    if soft:
        f.append(
            Finding(
                check="softirq",
                cpus=cpus,
                what=f"softirqs ran on CPU {want}",
                why="softirq work (network receive, block completion, RCU) runs before your thread gets the CPU back",
                evidence=f"over {seconds:.1f} s: " + ", ".join(f"{k} ×{n}" for k, n in sorted(soft.items(), key=lambda x: -x[1])),
                remedy="steer the interrupts that raise them (IRQ affinity, RPS masks of the receive queues); RCU: rcu_nocbs= at boot",
                remedy_kind="runtime",
            )
        )
    hz = os.sysconf("SC_CLK_TCK")
    steal = {c: d.stat.get(c, [0] * 8)[7] / hz for c in cpus}
    if any(s > 0 for s in steal.values()):
        f.append(
            Finding(
                check="steal",
                cpus=[c for c, s in steal.items() if s > 0],
                what=f"the hypervisor took CPU {want} away",
                why="a vCPU not run by the host delays everything on it, and no guest event shows it",
                evidence=", ".join(f"cpu{c}: {s * 1000:.0f} ms stolen of {seconds:.1f} s" for c, s in steal.items()),
                remedy="ask the host for dedicated (pinned) vCPUs; inside the guest there is no remedy",
                remedy_kind="none",
            )
        )
    f += _siblings_busy(cpus, d, seconds, hz)
    if ran is not None and len(ran):
        f += _ran(cpus, ran, seconds, ts, isolated)
    return said(f)


def _siblings_busy(cpus: list[int], d: Counters, seconds: float, hz: int) -> list[Finding]:
    f: list[Finding] = []
    for c in cpus:
        for s in cpu_list(sysread(SYS / f"cpu{c}" / "topology" / "thread_siblings_list") or ""):
            if s == c or s in cpus or s not in d.stat:
                continue
            busy = sum(d.stat[s][i] for i in (0, 1, 2, 5, 6)) / hz
            if busy > 0.1 * seconds:
                f.append(
                    Finding(
                        check="busy sibling",
                        cpus=[c],
                        what=f"CPU {c}'s SMT sibling, CPU {s}, was busy {busy / seconds:.0%} of the watch",
                        why="it shares the core with yours",
                        evidence=f"/proc/stat cpu{s}: {busy:.2f} s busy of {seconds:.1f} s",
                        remedy=f"keep CPU {s} idle while you measure (isolate it too)",
                        remedy_kind="runtime",
                    )
                )
    return f


def _ran(cpus: list[int], ran: pl.DataFrame, seconds: float, ts: list[Task], isolated: set[int]) -> list[Finding]:
    """Tasks and kthreads that ran on the CPUs (``ran``: cpu, tid, comm, ns)."""
    f: list[Finding] = []
    kinds = {t.tid: t for t in ts}
    me = os.getpid()
    rows = [r for r in ran.sort("ns", descending=True).iter_rows(named=True) if r["tid"] and (kinds.get(r["tid"]) is None or kinds[r["tid"]].pid != me)]
    groups: list[tuple[str, Callable[[Task | None], bool], str, str]] = [
        (
            "tasks",
            lambda t: t is None or not t.kthread,
            "move them off (the isolate tuning; taskset -acp <other CPUs> PID), or confine them with a cpuset",
            "runtime",
        ),
        (
            "movable kthreads",
            lambda t: t is not None and t.kthread and not t.bound,
            "taskset -cp <other CPUs> PID for each; unbound kworkers: the workqueue cpumask",
            "runtime",
        ),
        (
            "per-CPU kthreads",
            lambda t: t is not None and t.bound,
            "boot with nohz_full= and rcu_nocbs=; keep work (timers, IRQs) off the CPU so they have none",
            "boot",
        ),
    ]
    for label, pick, remedy, rk in groups:
        mine = [r for r in rows if pick(kinds.get(r["tid"]))]
        if not mine:
            continue
        on_isol = sorted({int(r["cpu"]) for r in mine} & isolated)
        f.append(
            Finding(
                check=label,
                cpus=sorted({int(r["cpu"]) for r in mine}),
                what=f"{len(mine)} {label} ran on CPU {cpus_text(cpus)}" + (f", isolated CPU {cpus_text(on_isol)} among them" if on_isol else ""),
                why="each run there is time your thread waits or is preempted",
                evidence=f"over {seconds:.1f} s: " + ", ".join(f"{r['comm']} ({r['tid']}) {_ns(int(r['ns']))} on cpu{r['cpu']}" for r in mine[:6]),
                remedy=remedy,
                remedy_kind=rk,  # type: ignore[typeddict-item]
            )
        )
    return f


def _never_switched(cpus: list[int], ran: pl.DataFrame, d: Counters, ns: int) -> pl.DataFrame:
    """A CPU with no switch in the watch yet busy ran one task throughout (a
    spinner nothing preempted): the running threads /proc last saw there, each
    given the CPU's busy time."""
    hz = os.sysconf("SC_CLK_TCK")
    rows = []
    for c in cpus:
        busy = sum(d.stat.get(c, [0] * 8)[i] for i in (0, 1, 2)) / hz * 1e9
        if c in ran["cpu"].to_list() or busy < ns / 2:
            continue
        for t in Path("/proc").glob("[0-9]*/task/[0-9]*/stat"):
            st = sysread(t) or ""
            rest = st[st.rfind(")") + 2 :].split()
            if len(rest) > 36 and rest[0] == "R" and rest[36] == str(c) and int(t.parent.name) != os.getpid():
                rows.append({"cpu": c, "tid": int(t.parent.name), "comm": st[st.find("(") + 1 : st.rfind(")")], "ns": int(busy)})
    return pl.DataFrame(rows, schema=ran.schema)


def _comm_of(tid: int) -> str:
    return sysread(f"/proc/{tid}/comm") or "?"


def _ns(ns: int) -> str:
    return f"{ns / 1e6:.1f} ms" if ns >= 1_000_000 else f"{ns / 1e3:.0f} µs"


def run_times(events: pl.DataFrame, cpus: list[int], t0: int, t1: int) -> pl.DataFrame:
    """Per (cpu, thread) the time it ran on ``cpus`` between ``t0`` and ``t1``, from sched_switch events."""
    schema = {"cpu": pl.Int32, "tid": pl.Int32, "comm": pl.String, "ns": pl.Int64}
    sw = events.filter((pl.col("event") == "sched_switch") & pl.col("cpu").is_in(cpus)).sort("cpu", "t_ns")
    if not len(sw):
        return pl.DataFrame(schema=schema)
    sw = sw.with_columns(pl.col("t_ns").shift(-1).over("cpu").fill_null(t1).alias("until"))
    after = sw.filter(pl.col("next_pid") != 0).select(
        "cpu", pl.col("next_pid").alias("tid"), pl.col("next_comm").alias("comm"), (pl.col("until") - pl.col("t_ns")).alias("ns")
    )
    # what ran from the watch's start to each CPU's first switch: that switch's previous task
    first = sw.group_by("cpu").first().filter(pl.col("pid") != 0)
    before = first.select("cpu", pl.col("pid").alias("tid"), "comm", (pl.col("t_ns") - t0).alias("ns"))
    both = pl.concat([after.cast(schema), before.cast(schema)])  # type: ignore[arg-type]
    # (a switch names the task it switches to; the one before the first switch is named by its other runs, or /proc)
    out = both.group_by("cpu", "tid").agg(pl.col("comm").drop_nulls().first(), pl.col("ns").sum())
    return out.with_columns(pl.col("comm").fill_null(pl.col("tid").map_elements(_comm_of, return_dtype=pl.String)))


def audit(cpus: list[int], seconds: float) -> AuditJson:
    """The set-up read, the CPUs watched for ``seconds``, every finding."""
    ts = tasks()
    found = setup(cpus, ts)
    refused: str | None = None
    ran = None
    # audit's own threads and its capture's reader (started after, inheriting it) keep off the CPUs they watch
    was = os.sched_getaffinity(0)
    away = was - set(cpus)
    moved = bool(away) and away != was
    if moved:
        os.sched_setaffinity(0, away)
    own: set[int] = set()
    with scratch.directory("audit") as tmp:
        cap = C.Capture(Path(tmp) / "kernel", events=["sched:sched_switch"], buffer_mb=4, name=f"loopscope-audit{os.getpid()}", cpus=cpus)
        meta = cap.start()
        refused = meta.refused
        try:
            off = C.timens_offset_ns()
            a = time.clock_gettime_ns(time.CLOCK_MONOTONIC) - off
            before = Counters.read()
            time.sleep(seconds)
            delta = Counters.read().minus(before)
            b = time.clock_gettime_ns(time.CLOCK_MONOTONIC) - off
            if not refused:
                cap.drain("end")
        finally:
            cap.stop()
            own = set(cap.tids)  # (known once it stops)
            # (given back only if still as audit left it: an isolation that ended meanwhile has given its own back)
            if moved and os.sched_getaffinity(0) == away:
                os.sched_setaffinity(0, was)
        if not refused:
            st = S.open_dir(Path(tmp) / "kernel")
            ran = run_times(st.load(a, b), cpus, a, b).filter(~pl.col("tid").is_in(list(own)))
            ran = pl.concat([ran, _never_switched(cpus, ran, delta, b - a)])
    everyone = tasks() + ts  # (those that ran and those that have gone since)
    found += watched(cpus, delta, ran, seconds, everyone)
    known = {t.tid: t for t in everyone}

    def what(tid: int) -> str:
        t = known.get(tid)
        return "task" if t is None or not t.kthread else "per-CPU kthread" if t.bound else "movable kthread"

    rows = [] if ran is None else ran.sort("ns", descending=True).iter_rows(named=True)
    listed: list[Ran] = [{"cpu": int(r["cpu"]), "tid": int(r["tid"]), "comm": str(r["comm"]), "ns": int(r["ns"]), "what": what(int(r["tid"]))} for r in rows]
    irqs = fired_irqs(delta, cpus)
    return {"cpus": cpus, "watched_s": seconds, "capture_refused": refused, "findings": found, "ran": listed, "irqs": irqs}
