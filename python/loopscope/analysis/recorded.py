"""What a recording can show: the event classes attribution reads, and what each one's absence hides.

Users bring recordings with the events they chose: ``perf sched record``
has the scheduler's and nothing else, ``trace-cmd record -e sched -e irq``
has no timer vectors, few record ``sched_stat_runtime``. Attribution works
from whatever is there (who ran comes from ``sched_switch`` when runtime
events are absent), and what it cannot see is said, class by class, never
guessed: interrupt time without ``irq`` events lands in the thread the
interrupt stopped, and that thread is then named, so the output says so
beside it.

``unseen`` lists the classes a capture lacks, each with what it hides and
what records it; ``need_scheduler`` refuses a capture with no scheduler
events at all (nothing can be measured from it).
"""

from __future__ import annotations

from dataclasses import dataclass
from collections.abc import Iterable

from typing_extensions import TypedDict

from loopscope.errors import InputError


class Unseen(TypedDict):
    """One class of events a capture lacks: which, what that hides, how to record it."""

    events: list[str]
    hides: str
    record: str


@dataclass(frozen=True)
class EventClass:
    name: str
    #: any of these present: the class is recorded
    events: tuple[str, ...]
    hides: str
    record: str


#: the classes attribution reads, in the order they matter to it
CLASSES = (
    EventClass(
        "wake-ups",
        ("sched_wakeup", "sched_waking"),
        "wake-up latency cannot start at the wake-up, and who woke a blocked thread is not known",
        "sched:sched_wakeup and sched:sched_waking",
    ),
    EventClass(
        "runtime",
        ("sched_stat_runtime",),
        "who ran comes from sched_switch alone: a switch the kernel did not record (out of the idle task, on some kernels) "
        "leaves the task that followed unseen until its first event",
        "sched:sched_stat_runtime",
    ),
    EventClass(
        "irq", ("irq_handler_entry",), "interrupt time is counted in the thread it interrupted", "irq:irq_handler_entry and irq:irq_handler_exit (irq:*)"
    ),
    EventClass(
        "softirq",
        ("softirq_entry",),
        "soft-interrupt time (network receive, timers, RCU) is counted in the thread it interrupted",
        "irq:softirq_entry and irq:softirq_exit (irq:*)",
    ),
    EventClass(
        "timer-interrupt",
        ("local_timer_entry",),
        "the timer interrupt's own time is counted in the thread it interrupted",
        "irq_vectors:local_timer_entry and _exit",
    ),
    EventClass(
        "ipi",
        ("call_function_single_entry", "call_function_entry", "reschedule_entry"),
        "cross-CPU calls (IPIs) are counted in the thread they interrupted",
        "irq_vectors:call_function* and irq_vectors:reschedule*",
    ),
    EventClass(
        "timers", ("hrtimer_start",), "timer lateness and timer slack are not measured (the expiry a thread slept to is not known)", "timer:hrtimer_start"
    ),
    EventClass("page-faults", ("page_fault_user",), "a wait for a page shows as an uninterruptible sleep, not as page faults", "exceptions:page_fault_user"),
    EventClass("migrations", ("sched_migrate_task",), "migrations are not counted", "sched:sched_migrate_task"),
)

#: what every measure needs: who ran, and when a thread was woken
SCHEDULER = ("sched_switch",)
RECORD_SCHEDULER = "perf sched record -- CMD, or trace-cmd record -e sched:sched_switch -e sched:sched_wakeup -- CMD"


def unseen(present: Iterable[str]) -> list[Unseen]:
    """Each class of ``CLASSES`` none of whose events is in ``present``."""
    have = set(present)
    return [{"events": list(c.events), "hides": c.hides, "record": c.record} for c in CLASSES if not have & set(c.events)]


#: classes whose time, unrecorded, looks like an idle CPU (or a woken thread not yet running): short names
LOOK_IDLE = {"irq": "interrupts", "softirq": "soft interrupts", "timer-interrupt": "timer interrupts", "ipi": "IPIs", "timers": "timer slack"}


#: the split's label for a timer interrupt that came late while a task ran (``_native.LATE_IRQ``); without
#: interrupt events an unrecorded handler (interrupts off) looks the same
LATE_IRQ = "timer interrupt late"


def hedged(present: Iterable[str]) -> dict[str, str]:
    """``CPU idle``, ``scheduling latency`` and ``timer interrupt late`` as
    a capture without some of ``LOOK_IDLE``'s classes must say them: the
    time may be those (``{}``: every class recorded, the labels stand)."""
    have = set(present)
    gone = [short for c in CLASSES if c.name in LOOK_IDLE and not have & set(c.events) for short in (LOOK_IDLE[c.name],)]
    if not gone:
        return {}
    tail = f" or not recorded ({', '.join(gone)})"
    return {k: k + tail for k in ("CPU idle", "scheduling latency", LATE_IRQ)}


def line(u: Unseen) -> str:
    """One class as a sentence: "no irq events: …; record irq:* to see it"."""
    return f"no {' or '.join(u['events'])} events: {u['hides']}; record {u['record']} to see it"


def need_scheduler(present: Iterable[str], where: str, what: str) -> None:
    """Refuse (exit 2) a capture without ``sched_switch`` events: ``what``
    (a command's name) cannot measure or explain anything from it."""
    have = set(present)
    lacking = [e for e in SCHEDULER if e not in have]
    if lacking:
        raise InputError(
            f"{where}: its capture has no {', '.join(lacking)} events, so {what} cannot tell who ran when; "
            f"it needs sched:sched_switch and sched:sched_wakeup: record them with {RECORD_SCHEDULER}"
        )
