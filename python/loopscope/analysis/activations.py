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

from typing import TYPE_CHECKING

import numpy as np
import polars as pl
from loopscope import _native

if TYPE_CHECKING:
    from loopscope.kernel.store import Store

#: per activation (ns, times on the capture's clock)
COLUMNS = {
    "tid": pl.Int64,
    "act": pl.Int64,
    "woken_ns": pl.Int64,
    "on_ns": pl.Int64,
    "off_ns": pl.Int64,
    "wakeup_latency_ns": pl.Int64,
    "timer_expires_ns": pl.Int64,
    "timer_lateness_ns": pl.Int64,
    "runtime_ns": pl.Int64,
    "preemptions": pl.Int64,
    "migrations": pl.Int64,
    "period_ns": pl.Int64,
    "on_bound_ns": pl.Int64,
    "complete": pl.Boolean,
}

#: what a folding pass gives per thread (``Feed.summary``)
FIGURES = ("wakeup_latency_ns", "timer_lateness_ns", "runtime_ns", "period_ns", "on_bound_ns")
SUMMARY = {
    "tid": pl.Int64,
    "activations": pl.Int64,
    "complete": pl.Int64,
    "preemptions": pl.Int64,
    "migrations": pl.Int64,
    "outliers": pl.Int64,
    **{f"{f}_{q}": pl.Int64 for f in FIGURES for q in ("p50", "p99", "max")},
}
#: a thread's kept outliers: lateness and window (``Feed.summary``)
WORST = {"tid": pl.Int64, "late": pl.Int64, "start_k": pl.Int64, "end_k": pl.Int64}
#: the precision of a folding pass's quantiles, in significant decimal digits (its histograms')
SIG_DIGITS = 3

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
    x = ev.filter((pl.col("event") == "hrtimer_expire_entry") & pl.col("expires").is_not_null()).select(
        "t_ns", (pl.col("t_ns") - pl.col("expires")).alias("off_ns")
    )
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


def _ints(ev: pl.DataFrame, c: str) -> np.ndarray:
    """A column as int64 (-1: none)."""
    s = ev[c]
    return (s.fill_null(-1) if s.null_count() else s).cast(pl.Int64).to_numpy()


def _arrays(ev: pl.DataFrame, clock: str, coded: tuple[list[str], list[str]] | None, offsets: pl.DataFrame | None = None) -> dict[str, np.ndarray]:
    """The int64 columns the native pass reads (-1: none). ``ev`` is decoded
    text, or as stored (``coded``: the capture's event names and strings);
    ``offsets``: the capture's ``mono_offsets`` (found in ``ev`` when None)."""
    if coded is None:
        names = sorted(set(ev["event"].drop_nulls().unique().to_list()))
        strings = sorted(set(ev["name"].drop_nulls().unique().to_list()) | set(ev["prev_state"].drop_nulls().unique().to_list()) | {"R"})
        strings.remove("R")
        strings.insert(0, "R")
        ev = ev.with_columns(
            pl.col("event").replace_strict(names, list(range(len(names))), default=None, return_dtype=pl.Int32),
            *(pl.col(c).replace_strict(strings, list(range(len(strings))), default=None, return_dtype=pl.Int32) for c in ("name", "prev_state")),
        )
        coded = (names, strings)
    names, strings = coded
    table = np.array([KIND_CODES.get(n, 0) for n in names] or [0], dtype=np.int64)
    kind = table[_ints(ev, "event").clip(0, len(table) - 1)]
    value = np.full(len(ev), -1, dtype=np.int64)
    arm = np.flatnonzero(kind == 3)
    if len(arm):
        # a sleep timer's soft expiry (the hard one adds its slack); an arm of another timer, or without one, is no arm
        sleep_code = strings.index(SLEEP_TIMER) if SLEEP_TIMER in strings else -2
        name, exp, soft = (_ints(ev, c)[arm] for c in ("name", "expires", "softexpires"))
        ok = ((name == -1) | (name == sleep_code)) & (exp != -1)
        value[arm] = np.where(soft != -1, soft, exp)
        value[arm[~ok]] = -1
        kind[arm[~ok]] = 0
    run = np.flatnonzero(kind == 4)
    if len(run):
        value[run] = _ints(ev, "runtime")[run]
    out = {
        "t_ns": _ints(ev, "t_ns"),
        "cpu": _ints(ev, "cpu"),
        "kind": kind,
        "pid": _ints(ev, "pid"),
        "target": _ints(ev, "target"),
        "next_pid": _ints(ev, "next_pid"),
        "asleep": (_ints(ev, "prev_state") > 0).astype(np.int64),
        "value": value,
    }
    if clock not in MONO_CLOCKS:
        if offsets is None:
            offsets = mono_offsets(_expire_entries(ev, names))
        # only the arms move: carried onto the capture's clock, put back in place
        at = np.flatnonzero(kind == 3)
        if len(at):
            moved = _on_clock(pl.DataFrame({"i": at, "t_ns": out["t_ns"][at], "value": value[at]}), offsets)
            value[moved["i"].to_numpy()] = moved["value"].fill_null(-1).to_numpy()
    return out


def _expire_entries(ev: pl.DataFrame, names: list[str]) -> pl.DataFrame:
    """A coded frame's timer interrupts, with their event named (for ``mono_offsets``)."""
    code = names.index("hrtimer_expire_entry") if "hrtimer_expire_entry" in names else -2
    return ev.filter(pl.col("event") == code).select("t_ns", pl.lit("hrtimer_expire_entry").alias("event"), "expires")


#: row-group runs ``Feed.feed_files`` hands the native pass at once
RUNS_A_CALL = 32


class Feed:
    """The native pass fed a stretch of the capture at a time (each in time
    order, each after the last), then ``rows``."""

    def __init__(
        self,
        tids: list[int],
        lost: pl.DataFrame | None,
        clock: str,
        coded: tuple[list[str], list[str]] | None = None,
        offsets: pl.DataFrame | None = None,
        top_k: int | None = None,
        window: tuple[int, int] | None = None,
    ) -> None:
        """``top_k``: fold the activations as they close (``summary``), each
        thread's ``top_k`` outliers kept, only those woken inside ``window``
        when given; else keep them as rows (``rows``)."""
        ls = lost["start_ns"].to_list() if lost is not None and len(lost) else []
        le = lost["end_ns"].to_list() if lost is not None and len(lost) else []
        self.clock, self.coded, self.offsets = clock, coded, offsets
        self.native = _native.KtraceActivations(sorted({int(t) for t in tids}), ls, le, top_k, window)

    def feed(self, ev: pl.DataFrame) -> None:
        """Every event of a stretch (``kernel.store`` columns, text decoded or as stored)."""
        self.feed_arrays(self.prepare(ev))

    def prepare(self, ev: pl.DataFrame) -> dict[str, np.ndarray] | None:
        """A stretch as the arrays the native pass reads (None: no events):
        ``feed``'s first half, which another thread can do for the next stretch."""
        return _arrays(ev, self.clock, self.coded, self.offsets) if len(ev) else None

    def feed_arrays(self, a: dict[str, np.ndarray] | None) -> None:
        """``feed``'s second half: the native pass over ``prepare``'s arrays (the interpreter lock released)."""
        if a is not None:
            self.native.feed(a["t_ns"], a["cpu"], a["kind"], a["pid"], a["target"], a["next_pid"], a["asleep"], a["value"])

    def feed_files(self, st: Store) -> None:
        """Every event of a stored capture, its files read by the native pass
        itself (``Store.reads``): no table or array is made. On another clock
        than CLOCK_MONOTONIC, the arms are carried by ``offsets`` (not empty)."""
        assert self.coded is not None and (self.offsets is None or len(self.offsets)), "feed_files reads a stored capture whose arms it can carry"
        names, strings = self.coded
        _, _, runs = st.reads(-(2**63), 2**63 - 1)
        off = None if self.offsets is None else (self.offsets["t_ns"].cast(pl.Int64).to_list(), self.offsets["off_ns"].cast(pl.Int64).to_list())
        kinds, sleep = [KIND_CODES.get(n, 0) for n in names] or [0], strings.index(SLEEP_TIMER) if SLEEP_TIMER in strings else -2
        # RUNS_A_CALL runs (about 2 M events) a call: Ctrl-C is seen between calls, not only at a long capture's end
        for i in range(0, len(runs), RUNS_A_CALL):
            self.native.feed_files(runs[i : i + RUNS_A_CALL], kinds, sleep, off)

    def summary(self) -> tuple[pl.DataFrame, pl.DataFrame]:
        """A folding pass's result: a row per thread (``SUMMARY``: counts, and
        each figure's p50, p99 and max, null where it has none; quantiles at
        ``SIG_DIGITS`` significant digits) and its kept outliers (``WORST``),
        latest first within a thread."""
        got = self.native.finish_summary()
        null = np.iinfo(np.int64).min
        per = pl.DataFrame({c: got[c] for c in SUMMARY}).with_columns(
            pl.when(pl.col(c) != null).then(pl.col(c)).alias(c) for c in SUMMARY if c[-4:] in ("_p50", "_p99", "_max")
        )
        worst = pl.DataFrame({"tid": got["worst_tid"], "late": got["worst_late"], "start_k": got["worst_start"], "end_k": got["worst_end"]})
        return per.cast(SUMMARY), worst.cast(WORST)  # type: ignore[arg-type]

    def rows(self) -> pl.DataFrame:
        """One row per activation (``COLUMNS``), by thread then activation."""
        got = self.native.finish()
        null = np.iinfo(np.int64).min
        cols: dict[str, pl.Series] = {}
        for c in COLUMNS:
            # a column at a time, each native array let go once its table column is made (memory: the rows and one column)
            s = pl.Series(c, got.pop(c))
            cols[c] = s if c in ("tid", "act", "complete") else pl.select(pl.when(s != null).then(s)).to_series().alias(c)
        return pl.DataFrame(cols).cast(COLUMNS)  # type: ignore[arg-type]


def activations(
    ev: pl.DataFrame, tids: list[int], lost: pl.DataFrame | None = None, clock: str = "mono", coded: tuple[list[str], list[str]] | None = None
) -> pl.DataFrame:
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
