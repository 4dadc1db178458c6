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

The events are taken apart per thread with polars, vectorised: a
thread's own events sorted by time are cut at every sleep; what happened
between a sleep and the next switch-in (the wake-up, the timer that ended
the sleep) belongs to the activation that follows. An activation the
capture began or ended inside is marked incomplete, as is one overlapping
a window of lost events.
"""

from __future__ import annotations

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


def _thread_events(ev: pl.DataFrame, tids: list[int], clock: str = "mono") -> pl.DataFrame:
    """The events that concern ``tids`` as one time-sorted stream per thread:
    ``kind`` in (run, out, arm, wake, in), its time and CPU; for ``out``
    whether the thread went to sleep, for ``arm`` the timer's expiry, for
    ``run`` the CPU time it accounts (``sched_stat_runtime``: the thread ran
    from ``t - runtime`` to ``t``)."""
    want = pl.Series(tids, dtype=pl.Int64).implode()
    sw = ev.filter(pl.col("event") == "sched_switch")

    def part(df: pl.DataFrame, tid: str, kind: str, sleep: pl.Expr | None = None, value: pl.Expr | None = None) -> pl.DataFrame:
        return df.select(pl.col(tid).cast(pl.Int64).alias("tid"), "t_ns", pl.col("cpu").cast(pl.Int32), pl.lit(kind).alias("kind"),
                         (sleep if sleep is not None else pl.lit(False)).alias("sleep"), (value if value is not None else pl.lit(None, pl.Int64)).cast(pl.Int64).alias("value"))

    parts = [
        part(sw.filter(pl.col("next_pid").cast(pl.Int64).is_in(want)), "next_pid", "in"),
        part(sw.filter(pl.col("target").cast(pl.Int64).is_in(want)), "target", "out", sleep=pl.col("prev_state").fill_null("R") != "R"),
        part(ev.filter(pl.col("event").is_in(WAKE_EVENTS) & pl.col("target").cast(pl.Int64).is_in(want)), "target", "wake"),
        # the time the thread asked for: the soft expiry (the hard one adds its timer slack)
        # a sleep's own timer (hrtimer_wakeup); a capture that filtered them in the kernel keeps no name
        _on_clock(part(ev.filter((pl.col("event") == "hrtimer_start") & pl.col("pid").cast(pl.Int64).is_in(want) & pl.col("expires").is_not_null()
                                 & (pl.col("name").is_null() | (pl.col("name") == SLEEP_TIMER))), "pid", "arm",
                       value=pl.coalesce("softexpires", "expires")), None if clock in MONO_CLOCKS else mono_offsets(ev)),
        part(ev.filter((pl.col("event") == "sched_stat_runtime") & pl.col("target").cast(pl.Int64).is_in(want) & pl.col("runtime").is_not_null()), "target", "run",
             value=pl.col("runtime")),
    ]
    # at one instant: the run accounted at a switch-out before the switch-out,
    # a thread switched out before it is woken, woken before it is switched in
    order = pl.col("kind").replace_strict({"run": 0, "out": 1, "arm": 2, "wake": 3, "in": 4}, return_dtype=pl.Int8)
    return pl.concat(parts).sort("tid", "t_ns", order)


def _first_in_missing(per: pl.DataFrame, ev: pl.DataFrame, tids: list[int], others: pl.DataFrame | None = None) -> pl.DataFrame:
    """Per activation whose switch-in the kernel did not trace (this VM
    leaves out the switches of one CPU's idle task), when it began to run:
    no later than the first event recorded in the thread's own context after
    its sleep (``seen``: a timer it arms, a fault, its run time accounted),
    and no earlier than the last event of anyone else on that CPU before it
    (``lower``: typically an interrupt's exit). Every event between the two
    is the thread's, so the switch lies in between; ``on_bound_ns`` says how
    far apart they are: the estimate's error."""
    need = per.filter(pl.col("first_in").is_null()).select(
        "tid", "act", pl.coalesce(pl.col("prev_off") + 1, pl.col("first_wake")).alias("after")).drop_nulls("after").sort("after")
    empty = pl.DataFrame(schema={"tid": pl.Int64, "act": pl.Int64, "lower": pl.Int64, "seen": pl.Int64})
    if not len(need):
        return empty
    mine = ev.filter(pl.col("pid").cast(pl.Int64).is_in(pl.Series(tids, dtype=pl.Int64).implode())).select(
        pl.col("pid").cast(pl.Int64).alias("tid"), pl.col("t_ns").alias("seen"), pl.col("cpu").cast(pl.Int32)).sort("seen")
    got = need.join_asof(mine, left_on="after", right_on="seen", by="tid", strategy="forward", check_sortedness=False).drop_nulls("seen")
    if not len(got):
        return empty
    others = (others if others is not None else ev).select(pl.col("t_ns").alias("lower"), pl.col("cpu").cast(pl.Int32)).sort("lower")
    return got.with_columns((pl.col("seen") - 1).alias("before")).sort("before").join_asof(
        others, left_on="before", right_on="lower", by="cpu", strategy="backward", check_sortedness=False).select("tid", "act", "lower", "seen")


def activations(ev: pl.DataFrame, tids: list[int], lost: pl.DataFrame | None = None, clock: str = "mono", others: pl.DataFrame | None = None) -> pl.DataFrame:
    """One row per activation of each thread in ``tids`` (``COLUMNS``).
    ``ev``: kernel events (``kernel.store`` columns, text decoded): all of
    them, or at least those of the threads and their wake-ups, switches and
    timers, with ``others`` the (t_ns, cpu) of every event; ``lost``:
    windows of lost events (cpu, start_ns, end_ns), each making the
    activations it overlaps incomplete; ``clock``: the capture's trace clock."""
    if not len(ev) or not tids:
        return pl.DataFrame(schema=COLUMNS)
    te = _thread_events(ev, tids, clock)
    if not len(te):
        return pl.DataFrame(schema=COLUMNS)
    # activation k of a thread: everything after its k-th sleep up to and including its (k+1)-th
    # (``sleep`` is true only on a switch-out asleep)
    te = te.with_columns(pl.col("sleep").cast(pl.Int64).cum_sum().shift(1, fill_value=0).over("tid").alias("act"))
    is_in, is_out = pl.col("kind") == "in", pl.col("kind") == "out"
    per = te.group_by("tid", "act").agg(
        pl.col("t_ns").filter(is_in).min().alias("first_in"),
        pl.col("t_ns").filter(is_out & pl.col("sleep")).max().alias("off_ns"),
        pl.col("t_ns").filter(pl.col("kind") == "wake").min().alias("first_wake"),
        pl.col("value").filter(pl.col("kind") == "arm").last().alias("armed"),
        pl.col("t_ns").filter(is_out).sum().alias("sum_out"), pl.col("t_ns").filter(is_in).sum().alias("sum_in"),
        (is_out & ~pl.col("sleep")).sum().cast(pl.Int64).alias("preemptions"),
        (pl.col("cpu").filter(is_in | (pl.col("kind") == "run")).diff().fill_null(0) != 0).sum().cast(pl.Int64).alias("migrations"),
        is_in.sum().alias("n_in"), is_out.sum().alias("n_out"),
    ).sort("tid", "act").with_columns(pl.col("off_ns").shift(1).over("tid").alias("prev_off"))
    inferred = _first_in_missing(per, ev, tids, others)
    per = per.join(inferred, on=["tid", "act"], how="left").with_columns(
        # its first switch-in, traced or inferred (never before its wake-up)
        pl.when(pl.col("seen").is_not_null())
        .then(pl.max_horizontal("lower", pl.when(pl.col("first_wake") <= pl.col("seen")).then(pl.col("first_wake"))))
        .otherwise(pl.col("first_in")).alias("on_ns"),
    )
    per = per.with_columns(
        pl.when(pl.col("first_wake") <= pl.col("on_ns")).then(pl.col("first_wake")).alias("woken_ns"),
        # with the first switch-in inferred, the outs pair with the ins traced and that one
        pl.when(pl.col("seen").is_not_null() & (pl.col("n_out") == pl.col("n_in") + 1)).then(pl.col("sum_out") - pl.col("sum_in") - pl.col("on_ns"))
        .when(pl.col("seen").is_null() & (pl.col("n_out") == pl.col("n_in"))).then(pl.col("sum_out") - pl.col("sum_in")).alias("runtime_ns"),
    ).with_columns(
        # the timer the thread armed in the activation before, ending the sleep before this one
        pl.col("armed").shift(1).over("tid").alias("timer_expires_ns"),
        pl.col("woken_ns").diff().over("tid").alias("period_ns"),
        (pl.col("on_ns") - pl.col("woken_ns")).alias("wakeup_latency_ns"),
        pl.when(pl.col("seen").is_not_null()).then(pl.col("seen") - pl.col("on_ns")).otherwise(0).alias("on_bound_ns"),
        # whole: begun inside the capture (after a sleep it saw) and ended asleep
        (pl.col("off_ns").is_not_null() & (pl.col("act") > 0) & pl.col("on_ns").is_not_null()).alias("complete"),
    ).with_columns(
        pl.when(pl.col("timer_expires_ns") <= pl.col("on_ns")).then(pl.col("on_ns") - pl.col("timer_expires_ns")).alias("timer_lateness_ns"),
    )
    per = per.filter(pl.col("on_ns").is_not_null())
    per = per.with_columns(pl.when(pl.col("complete")).then(pl.col("runtime_ns")).alias("runtime_ns"))
    if lost is not None and len(lost):
        hit = per.select("tid", "act", "woken_ns", "on_ns", "off_ns").join_where(
            lost.select(pl.col("start_ns").alias("ls"), pl.col("end_ns").alias("le")),
            pl.col("ls") <= pl.coalesce("off_ns", "on_ns"), pl.col("le") >= pl.coalesce("woken_ns", "on_ns"),
        ).select("tid", "act").unique()
        per = per.join(hit.with_columns(pl.lit(True).alias("lost")), on=["tid", "act"], how="left").with_columns(
            pl.col("complete") & pl.col("lost").is_null())
    return per.select(list(COLUMNS)).cast(COLUMNS)  # type: ignore[arg-type]
