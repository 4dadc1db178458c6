"""Every activation of chosen threads, from the kernel's scheduling events alone.

An activation is one stretch of a thread's life between two sleeps: it is
woken (``sched_wakeup`` or ``sched_waking``), waits runnable, is switched in
(``sched_switch`` naming it ``next``), runs (perhaps preempted and switched
back in, perhaps on another CPU), and is switched out asleep (``prev_state``
other than R). Nothing of the program is needed: its threads are measured
from what any kernel capture records, loopscope's own or an imported one.

Per activation: the wake-up latency (wake-up to first switch-in), the timer
lateness when the thread slept on a timer it armed itself (its
``hrtimer_start`` ``expires`` to its switch-in: the figure cyclictest
reports of itself), the run time (time on a CPU until it slept again), the
preemptions and migrations inside it, and the period (wake-up to wake-up).

A kernel may leave a switch out (this VM never traces the one from CPU 1's
idle task): the switch-in is then placed between the last event of anyone
else on that CPU and the thread's first event in its own context, and
``on_bound_ns`` carries the width of that interval (0 where the switch was
traced): the figure's error, said, as every figure's is.

Timer expiries are on CLOCK_MONOTONIC. A capture on another clock (an
imported trace.dat on trace-cmd's default ``local``, a perf.data on perf's
clock) has its expiries carried onto its own clock by the offset the
kernel's own timer interrupts show: each ``hrtimer_expire_entry`` carries
the base's ``now`` (CLOCK_MONOTONIC) read just before the event's stamp, so
stamp − now is the offset plus a little (the smallest of the neighbouring
ones is taken, timers on other bases left out); an expiry takes the offset
nearest in time, so a drift between the clocks over a long trace does not
add up. Without those events the lateness is not measured (null), never
guessed.

The pass is native (``KtraceActivations``, crates/ktrace
``activations``) and streams: the capture is fed in time order a stretch at
a time (``Feed``), each thread's events cut at every sleep as they come;
what happened between a sleep and the next switch-in (the wake-up, the
timer that ended the sleep) belongs to the activation that follows. Memory
is the rows and each thread's open activation, not the capture. An
activation the capture began or ended inside is marked incomplete, as is
one overlapping a window of lost events.
"""

from __future__ import annotations

import numpy as np
import polars as pl

#: per activation (ns, times on the capture's clock)
COLUMNS = {
    "tid": pl.Int64, "act": pl.Int64, "woken_ns": pl.Int64, "on_ns": pl.Int64, "off_ns": pl.Int64,
    "wakeup_latency_ns": pl.Int64, "timer_expires_ns": pl.Int64, "timer_lateness_ns": pl.Int64,
    "runtime_ns": pl.Int64, "preemptions": pl.Int64, "migrations": pl.Int64, "period_ns": pl.Int64, "on_bound_ns": pl.Int64, "complete": pl.Boolean,
}

WAKE_EVENTS = ("sched_wakeup", "sched_waking")


#: the function of the timer a thread sleeps on (nanosleep, clock_nanosleep, poll and select timeouts)
SLEEP_TIMER = "hrtimer_wakeup"
#: clocks whose stamps are CLOCK_MONOTONIC (timer expiries need no carrying)
MONO_CLOCKS = ("mono",)
#: the neighbouring offsets whose smallest is taken, and how far from the
#: capture's median an offset may be to count (further: a timer on another base)
OFFSET_WINDOW = 16
OFFSET_BAND_NS = 50_000_000


def mono_offsets(ev: pl.DataFrame) -> pl.DataFrame:
    """(t_ns, off_ns): the capture's clock minus CLOCK_MONOTONIC, along the
    capture, from its timer interrupts (``hrtimer_expire_entry``'s ``now``,
    decoded into ``expires``); empty when it has none."""
    x = ev.filter((pl.col("event") == "hrtimer_expire_entry") & pl.col("expires").is_not_null()).select("t_ns", (pl.col("t_ns") - pl.col("expires")).alias("off_ns"))
    if not len(x):
        return x
    med = x["off_ns"].median()
    x = x.filter((pl.col("off_ns") - med).abs() < OFFSET_BAND_NS).sort("t_ns")
    return x.with_columns(pl.col("off_ns").rolling_min(OFFSET_WINDOW, min_samples=1, center=True))


def _on_clock(arms: pl.DataFrame, offsets: pl.DataFrame | None) -> pl.DataFrame:
    """Timer arms' expiries (``value``) carried onto the capture's clock."""
    if offsets is None:
        return arms
    if not len(offsets) or not len(arms):
        return arms.with_columns(pl.lit(None, pl.Int64).alias("value"))
    got = arms.sort("t_ns").join_asof(offsets, on="t_ns", strategy="nearest")
    return got.with_columns((pl.col("value") + pl.col("off_ns")).alias("value")).drop("off_ns")


#: the kind of each event the native pass reads: a switch, a wake-up, a timer armed, run time accounted (else 0)
KIND_CODES = {"sched_switch": 1, "sched_wakeup": 2, "sched_waking": 2, "hrtimer_start": 3, "sched_stat_runtime": 4}


def _arrays(ev: pl.DataFrame, clock: str, coded: tuple[list[str], list[str]] | None, offsets: pl.DataFrame | None = None) -> dict[str, np.ndarray]:
    """The int64 columns the native pass reads (-1: none). ``ev`` is decoded
    text, or as stored (``coded``: the capture's event names and strings);
    ``offsets``: the capture's ``mono_offsets`` (found in ``ev`` when None)."""
    if coded is None:
        kind = pl.col("event").replace_strict(KIND_CODES, default=0, return_dtype=pl.Int64)
        asleep = pl.col("prev_state").fill_null("R") != "R"
        timer_ok = pl.col("name").is_null() | (pl.col("name") == SLEEP_TIMER)
    else:
        names, strings = coded
        table = np.array([KIND_CODES.get(n, 0) for n in names] or [0], dtype=np.int64)
        kind = pl.lit(pl.Series("kind", table[ev["event"].cast(pl.Int64).fill_null(0).to_numpy()]))
        asleep = pl.col("prev_state").fill_null(0) != 0  # 0: "R", the string table's first entry
        sleep_code = strings.index(SLEEP_TIMER) if SLEEP_TIMER in strings else -2
        timer_ok = pl.col("name").is_null() | (pl.col("name") == sleep_code)
    df = ev.select(
        pl.col("t_ns").cast(pl.Int64), pl.col("cpu").cast(pl.Int64), kind.alias("kind"), pl.col("pid").cast(pl.Int64).fill_null(-1),
        pl.col("target").cast(pl.Int64).fill_null(-1), pl.col("next_pid").cast(pl.Int64).fill_null(-1), asleep.cast(pl.Int64).alias("asleep"),
        # a sleep timer's soft expiry (the hard one adds its slack); a run's ns; else none
        pl.when((kind == 3) & pl.col("expires").is_not_null() & timer_ok).then(pl.coalesce("softexpires", "expires"))
        .when(kind == 4).then(pl.col("runtime")).cast(pl.Int64).alias("value"),
    ).with_columns(pl.when((pl.col("kind") == 3) & pl.col("value").is_null()).then(0).otherwise(pl.col("kind")).alias("kind"))
    if clock not in MONO_CLOCKS:
        if offsets is None:
            offsets = mono_offsets(ev if coded is None else _expire_entries(ev, coded[0]))
        arms = df.with_row_index("i").filter(pl.col("kind") == 3).select("i", "t_ns", "value")
        moved = _on_clock(arms, offsets)
        df = df.with_row_index("i").join(moved.select("i", pl.col("value").alias("moved")), on="i", how="left").with_columns(
            pl.when(pl.col("kind") == 3).then(pl.col("moved")).otherwise(pl.col("value")).alias("value")).drop("i", "moved")
    return {c: df[c].fill_null(-1).to_numpy() for c in df.columns}


def _expire_entries(ev: pl.DataFrame, names: list[str]) -> pl.DataFrame:
    """A coded frame's timer interrupts, with their event named (for ``mono_offsets``)."""
    code = names.index("hrtimer_expire_entry") if "hrtimer_expire_entry" in names else -2
    return ev.filter(pl.col("event") == code).select("t_ns", pl.lit("hrtimer_expire_entry").alias("event"), "expires")


class Feed:
    """The native pass fed a stretch of the capture at a time (each in time
    order, each after the last), then ``rows``."""

    def __init__(self, tids: list[int], lost: pl.DataFrame | None, clock: str, coded: tuple[list[str], list[str]] | None = None,
                 offsets: pl.DataFrame | None = None) -> None:
        from loopscope import _native

        ls = lost["start_ns"].to_list() if lost is not None and len(lost) else []
        le = lost["end_ns"].to_list() if lost is not None and len(lost) else []
        self.clock, self.coded, self.offsets = clock, coded, offsets
        self.native = _native.KtraceActivations(sorted({int(t) for t in tids}), ls, le)

    def feed(self, ev: pl.DataFrame) -> None:
        """Every event of a stretch (``kernel.store`` columns, text decoded or as stored)."""
        if not len(ev):
            return
        a = _arrays(ev, self.clock, self.coded, self.offsets)
        self.native.feed(a["t_ns"], a["cpu"], a["kind"], a["pid"], a["target"], a["next_pid"], a["asleep"], a["value"])

    def rows(self) -> pl.DataFrame:
        """One row per activation (``COLUMNS``), by thread then activation."""
        got = self.native.finish()
        null = np.iinfo(np.int64).min
        out = pl.DataFrame({k: pl.Series(k, v) for k, v in got.items()}).with_columns(
            pl.when(pl.col(c) != null).then(pl.col(c)).alias(c) for c in COLUMNS if c not in ("tid", "act", "complete"))
        return out.select(list(COLUMNS)).cast(COLUMNS)  # type: ignore[arg-type]


def activations(ev: pl.DataFrame, tids: list[int], lost: pl.DataFrame | None = None, clock: str = "mono",
                coded: tuple[list[str], list[str]] | None = None) -> pl.DataFrame:
    """One row per activation of each thread in ``tids`` (``COLUMNS``).
    ``ev``: every kernel event of a stretch, time-sorted (``kernel.store``
    columns, text decoded, or as stored with ``coded`` its event names and
    strings); ``lost``: windows of lost events (cpu, start_ns, end_ns), each
    making the activations it overlaps incomplete; ``clock``: the capture's
    trace clock."""
    if not len(ev) or not tids:
        return pl.DataFrame(schema=COLUMNS)
    f = Feed(tids, lost, clock, coded)
    f.feed(ev)
    return f.rows()
