"""What a monitor asks of the machine before it starts: whether it can
watch the spec's hosts and probes (``check``), where its probes run so that
it does not measure itself (``own_cpus``), and what it will write and hold
(``footprint``, ``loopscope check``'s lines for a monitor).
"""

from __future__ import annotations

import os
from collections.abc import Iterator
from contextlib import contextmanager
from typing import TYPE_CHECKING

from loopscope.errors import InputError
from loopscope.kernel.capture import WATCH_BUFFER_MB
from loopscope.kinds import KINDS
from loopscope.monitor.keeper import DRAIN_KERNEL_NS, buffer_mb
from loopscope.spec import Experiment

if TYPE_CHECKING:
    from loopscope.spec.models import ProbeModel


# What a monitor writes, measured (docs/benchmarks.md "Monitoring"): a
# period's histogram in the interval log, its periods.jsonl line, an
# outlier's outliers.jsonl line, a kept window on disk once packed (blocks
# included: 2 kB at the demo's noise, 12 kB beside a context-switch storm).
HLOG_BYTES_PER_PERIOD = 1600
PERIOD_LINE_BYTES = 420
OUTLIER_LINE_BYTES = 450
WINDOW_BYTES = (2_000, 13_000)


def footprint(exp: Experiment) -> list[str]:
    """``loopscope check``'s lines for a monitor: per hour, and at most."""

    s = exp.monitor
    assert s is not None
    per_h = 3600e9 / s.period
    ln = lanes(exp)
    # every lane closes a period each period: its probes take turns
    n = len(ln)
    fixed = n * per_h * (HLOG_BYTES_PER_PERIOD + PERIOD_LINE_BYTES) / 1e6
    out_max = s.keep_per_minute * 60
    win = (out_max * WINDOW_BYTES[0] / 1e6, out_max * WINDOW_BYTES[1] / 1e6)
    ncpu = os.cpu_count() or 1
    drain = s.recorder == "drain"
    mb = buffer_mb(DRAIN_KERNEL_NS if drain else s.reach)
    sets = 2 if s.recorder == "alternate" else 1 if s.recorder in ("pause", "drain") else 0
    return [
        f"a monitor: {len(exp.probes)} probes, periods of {s.period / 1e9:g} s under {', '.join(exp.phases[0].loads) if exp.phases and exp.phases[0].loads else 'no load'}; threshold {s.threshold}",
        f"  {_lanes_line(ln)}",
        f"  disk per hour: histograms and periods {fixed:.2f} MB; outliers {OUTLIER_LINE_BYTES / 1e3:.2f} kB each; kept windows {WINDOW_BYTES[0] // 1000}-{WINDOW_BYTES[1] // 1000} kB each,"
        f" at most {win[0]:.0f}-{win[1]:.0f} MB an hour ({s.keep_per_minute} a minute), never more than monitor.retain ({s.retain / 1e9:g} GB) in all",
        f"  memory: kernel ring buffers {sets * mb * ncpu} MiB ({sets} × {mb} MiB per CPU × {ncpu} CPUs, sized for {(DRAIN_KERNEL_NS if drain else s.reach) / 1e9:g} s at 50 k events/s per CPU)"
        + (f"; the recorder's memory holds {s.reach / 1e9:g} s of events, up to {buffer_mb(s.reach) * ncpu} MiB at that rate" if drain else "")
        + "; the monitor's processes ~300 MB",
        *(
            [
                f"  a threads probe's period: a capture of the program's threads only, {WATCH_BUFFER_MB} MiB per CPU of kernel buffers and ~0.05 MB a second"
                f" on disk (1 kHz), removed with the period"
            ]
            if any(KINDS[p.kind].live_capture for p in exp.probes)
            else []
        ),
    ]


def recorded_cpus(exp: Experiment) -> list[int] | None:
    """The CPUs the flight recorder records, when every probe is pinned and
    of a kind held up only by what happens on its own CPUs (``timer``,
    ``sched``, ``syscall``): what the others run (a context-switch storm
    beside the probes) never reaches the recorder's buffers or its reader.
    None: every CPU."""
    cpus = {c for p in exp.probes for c in (getattr(p, "cpu", None) or [])}
    if not cpus or not all(KINDS[p.kind].windows_on_its_cpus and getattr(p, "cpu", None) for p in exp.probes):
        return None
    return sorted(cpus)


def _lanes_line(ln: list[list[ProbeModel]]) -> str:
    """How the probes measure: side by side, in turn, or both."""
    if len(ln) == 1:
        return "one probe measures at a time, in turn" if len(ln[0]) > 1 else "its probe measures every period"
    turns = [lane for lane in ln if len(lane) > 1]
    return f"{len(ln)} lanes measure side by side every period" + (
        f"; within a lane the probes take turns ({'; '.join(', '.join(str(p.name) for p in lane) for lane in turns)})" if turns else ""
    )


def check(exp: Experiment, file: str) -> None:
    """What a monitor can watch: probes whose windows come from their own
    traces (or a capture of their own threads). Hosts of every kind are
    accepted here; a host on another kernel is watched by a monitor of its
    own there (``monitor.far``), known once its agent has said hello."""
    for p in exp.probes:
        if KINDS[p.kind].windows_need_capture and not KINDS[p.kind].live_capture:
            raise InputError(
                f"{file}: probe {p.name} is a {p.kind} probe, whose windows come from a whole kernel capture; a monitor keeps only the windows around outliers"
            )


def lanes(exp: Experiment) -> list[list[ProbeModel]]:
    """The probes that measure at once, as lanes: every lane measures in
    every period, side by side; a lane's probes take turns. Probes that share
    a host share a lane (they would measure each other), and so do the kinds
    that record their threads with a capture of their own (one such capture
    at a time). A fleet with one probe per host measures every host at once."""
    first = exp.hosts[0].name
    group = list(range(len(exp.probes)))

    def root(i: int) -> int:
        while group[i] != i:
            i = group[i]
        return i

    for i, a in enumerate(exp.probes):
        for j in range(i):
            b = exp.probes[j]
            shared = set(a.hosts(first)) & set(b.hosts(first))
            if shared or (KINDS[a.kind].live_capture and KINDS[b.kind].live_capture):
                group[root(i)] = root(j)
    out: dict[int, list[ProbeModel]] = {}
    for i, p in enumerate(exp.probes):
        out.setdefault(root(i), []).append(p)
    return list(out.values())


def own_cpus(exp: Experiment, usable: list[int] | None = None) -> str | None:
    """Keep the monitor off its probes' CPUs. A probe that names no CPU is
    pinned to one (the last this process may use that leaves another free),
    so that the monitor's own threads (its controller, agents and recorder,
    moved by ``away_from_probes``) run on the others instead of showing up
    in the probe's outliers as ``lab: agent`` and ``lab: capture``. Returns
    the note to say (None: every probe names its CPUs). With one CPU neither
    is possible, and the note says the monitor shares it."""
    cpus = sorted(usable if usable is not None else os.sched_getaffinity(0))
    # (a threads probe attached to a running program measures it where it runs: nothing to pin)
    unpinned = [p for p in exp.probes if "cpu" in type(p).model_fields and not getattr(p, "cpu", None) and not getattr(p, "attach", None)]
    loose = [str(p.name) for p in exp.probes if "cpu" not in type(p).model_fields]
    beside = (
        f"; probe {', '.join(loose)} cannot be pinned (its kind runs where the kernel puts it): the monitor's own threads may run beside it" if loose else ""
    )
    if not unpinned:
        taken = {c for p in exp.probes for c in (getattr(p, "cpu", None) or [])}
        if taken and not set(cpus) - taken:
            beside += (
                f"; probes are pinned to every CPU it may use ({', '.join(map(str, cpus))}): the monitor's own threads (its controller, agents and"
                " recorder) share their CPUs and show among the causes of their outliers (lab: agent, lab: capture); leave one CPU without a probe"
            )
        return beside[2:] or None
    names = ", ".join(str(p.name) for p in unpinned)
    taken = {c for p in exp.probes for c in (getattr(p, "cpu", None) or [])}
    pick = next((c for c in reversed(cpus) if set(cpus) - taken - {c}), None)
    if pick is None:
        return (
            f"probe {names} names no CPU and none is left for the monitor's own threads: they share the probes' CPUs, "
            "and show among the causes of its outliers (lab: agent, lab: capture); give the monitor a CPU no probe uses" + beside
        )
    for p in unpinned:
        setattr(p, "cpu", [pick])
    rest = ",".join(str(c) for c in cpus if c != pick and c not in taken)
    return (
        f"probe {names} named no CPU: the monitor pins it to CPU {pick} and keeps its own threads on CPU {rest}, off the probe's (set the probe's cpu: to choose)"
        + beside
    )


# The monitor's own threads, once they are off the probes' CPUs, run at this
# nice: there they compete only with loads nobody measures, and at nice 0 a
# context-switch storm beside them left the tail and the recorder's reader a
# few per cent of their CPU (outliers reached the keeper 8-20 s late, when
# the kernel's buffers no longer held them).
OWN_NICE = -10


def away_from_probes(exp: Experiment, tids: list[int] | None = None, elsewhere: set[str] = set()) -> None:
    """This process's threads, and ``tids``, onto the CPUs no probe is pinned
    to, and this process's threads (and those they start) at ``OWN_NICE``.
    Nothing changes when no probe is pinned (the monitor would then compete
    with its probes, and shows in their attribution as ``lab: agent``).
    The probes named in ``elsewhere`` measure on another machine: their CPUs are not this one's."""
    pinned = {c for p in exp.probes if str(p.name) not in elsewhere for c in (getattr(p, "cpu", None) or [])}
    try:
        rest = os.sched_getaffinity(0) - pinned
        if not rest or not pinned:
            return
        mine = {int(x) for x in os.listdir("/proc/self/task")}
        for t in mine | set(tids or []):
            try:
                os.sched_setaffinity(t, rest)
                if t in mine:
                    os.setpriority(os.PRIO_PROCESS, t, OWN_NICE)
            except OSError:
                pass
    except OSError:
        pass


@contextmanager
def as_at_start(cpus: set[int]) -> Iterator[None]:
    """The calling thread back on ``cpus`` (the CPUs the monitor started
    with) at nice 0 while it starts a process, which inherits both (an agent
    started again would otherwise find only the monitor's own CPUs, and
    refuse its probe's), then as it was."""
    mine = os.sched_getaffinity(0)
    nice = os.getpriority(os.PRIO_PROCESS, 0)
    try:
        os.sched_setaffinity(0, cpus)
        os.setpriority(os.PRIO_PROCESS, 0, 0)
        yield
    finally:
        os.sched_setaffinity(0, mine)
        os.setpriority(os.PRIO_PROCESS, 0, nice)
