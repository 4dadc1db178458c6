"""How late each thread of a program ran, and why: from a kernel capture alone.

``summarize`` takes a capture (``kernel.store``) and the threads to measure
(their ids and names), finds every activation of each
(``analysis.activations``), and explains the late ones: the wake-ups above
the thread's p99 (at least one), each window from the wake-up to the
switch-in split into causes by the same native attribution every probe
kind's outliers go through (``analysis.explain.attribute_store``). The
causes of a thread are its outliers' time by cause, as shares 0–1, largest
first, with explain's labels.

What the capture lacks is said, never guessed: each class of events it
does not hold is listed with what that hides (``analysis.recorded``); no ``hrtimer_start`` of the
thread (a kernel or a recording without timer events, or a thread that does
not sleep on timers) gives ``timer_lateness_ns: null``; activations overlapping
lost events are left out of the figures and counted.
"""

from __future__ import annotations

import re

import numpy as np
import polars as pl
from typing_extensions import NotRequired, TypedDict

from loopscope.analysis import attribution as A
from loopscope.analysis.explained import Parts
from loopscope.analysis.recorded import Unseen, hedged, unseen
from loopscope.analysis.activations import MONO_CLOCKS, OFFSET_WINDOW, Feed, activations, mono_offsets
from loopscope.kernel import store as S


class Spread(TypedDict):
    p50: int
    p99: int
    max: int


class Share(TypedDict):
    cause: str
    share: float


class ThreadJson(TypedDict):
    """One thread: its activations' figures (ns) and its outliers' causes."""

    tid: int
    comm: str
    activations: int
    incomplete: int
    wakeup_latency_ns: Spread | None
    timer_lateness_ns: Spread | None
    runtime_ns: Spread | None
    period_ns: int | None
    preemptions: int
    migrations: int
    switch_in_bound_ns: Spread | None
    outliers: int
    explained_outliers: int
    causes: list[Share]
    #: the outliers' time before the wake-up (the timer's lateness) and after it, each part's causes
    parts: Parts | None


class Exited(TypedDict):
    tid: int
    comm: str


class ThreadsJson(TypedDict):
    """What ``loopscope probe threads --json`` prints."""

    threads: list[ThreadJson]
    kernel_events: int
    lost_kernel_events: int
    not_recorded: list[Unseen]
    timer_lateness_from: str
    exited: NotRequired[list[Exited]]


def _spread(s: pl.Series) -> Spread | None:
    v = s.drop_nulls().to_numpy()
    if not len(v):
        return None
    return {"p50": int(np.percentile(v, 50)), "p99": int(np.percentile(v, 99)), "max": int(v.max())}


def names_in(ev: pl.DataFrame) -> dict[int, str]:
    """Every thread the capture names (the latest name it ran under)."""
    sw = ev.filter(pl.col("event") == "sched_switch")
    pairs = (
        pl.concat(
            [
                sw.select(pl.col("target").cast(pl.Int64).alias("tid"), pl.col("target_comm").alias("comm"), "t_ns"),
                sw.select(pl.col("next_pid").cast(pl.Int64).alias("tid"), pl.col("next_comm").alias("comm"), "t_ns"),
            ]
        )
        .drop_nulls()
        .filter(pl.col("tid") > 0)
        .sort("t_ns")
    )
    return {int(t): str(c) for t, c in pairs.group_by("tid").agg(pl.col("comm").last()).iter_rows()}


def thread_activations(st: S.Store, tids: list[int]) -> pl.DataFrame:
    """Every activation of ``tids`` in the capture (``activations.COLUMNS``):
    its segment files streamed through the native pass one at a time, as
    stored (text as codes), only the columns the pass reads; memory is a
    file's events and the rows, whatever the capture's length."""
    if st.legacy is not None or not st.files():
        return activations(st.load(st.t_first or 0, st.t_last or 0), tids, st.lost, st.clock)
    coded = (st.event_names, st.strings)
    offsets = None
    if st.clock not in MONO_CLOCKS:
        # the capture's clock against CLOCK_MONOTONIC, from all of its timer interrupts (a small filtered read)
        code = st.event_names.index("hrtimer_expire_entry") if "hrtimer_expire_entry" in st.event_names else -2
        ex = pl.concat([pl.scan_parquet(f).filter(pl.col("event") == code).select("t_ns", "expires").collect() for f in st.files()])
        offsets = mono_offsets(ex.with_columns(pl.lit("hrtimer_expire_entry").alias("event")))
    # no timer interrupts to carry the expiries with: they stay on CLOCK_MONOTONIC, carried below from the wake-ups
    raw = offsets is not None and not len(offsets)
    feed = Feed(tids, st.lost, st.clock, coded, pl.DataFrame({"t_ns": [0], "off_ns": [0]}) if raw else offsets)
    for part in st.stretches(["t_ns", "cpu", "pid", "event", "target", "next_pid", "prev_state", "name", "runtime", "expires", "softexpires"]):
        feed.feed(part)
    return carried_by_wakeups(feed.rows()) if raw else feed.rows()


#: a wake-up this much earlier than the typical one against its timer's expiry ended its sleep for another reason
EARLY_WAKE_NS = 1_000_000


def carried_by_wakeups(act: pl.DataFrame) -> pl.DataFrame:
    """Activations whose timer expiries are still on CLOCK_MONOTONIC while
    the capture's clock is another (no ``hrtimer_expire_entry`` to carry
    them): the offset between the clocks is the smallest gap from an
    expiry to the wake-up that followed it, among the neighbouring ones
    (``OFFSET_WINDOW``; a timer's wake-up comes after its expiry), wake-ups
    far earlier than the typical one left out (their sleep ended for
    another reason). The lateness is then short by at most the smallest
    wake-up delay near it (a few µs when the timer interrupt is not held
    up): a lower bound, said as such (``timer_from``)."""
    d = act.filter(pl.col("timer_expires_ns").is_not_null() & pl.col("woken_ns").is_not_null()).select(
        pl.col("woken_ns").alias("_t"), (pl.col("woken_ns") - pl.col("timer_expires_ns")).alias("_clocks")
    )
    if not len(d):
        return act.with_columns(pl.lit(None, pl.Int64).alias("timer_expires_ns"), pl.lit(None, pl.Int64).alias("timer_lateness_ns"))
    med = int(d["_clocks"].median() or 0)  # type: ignore[arg-type]
    d = d.filter(pl.col("_clocks") >= med - EARLY_WAKE_NS).sort("_t").with_columns(pl.col("_clocks").rolling_min(OFFSET_WINDOW, min_samples=1, center=True))
    keyed = act.with_row_index("_i").with_columns(pl.coalesce("woken_ns", "on_ns").alias("_k")).sort("_k")
    got = keyed.join_asof(d, left_on="_k", right_on="_t", strategy="nearest").sort("_i")
    exp = pl.col("timer_expires_ns") + pl.col("_clocks")
    late = pl.when(exp <= pl.col("on_ns")).then(pl.col("on_ns") - exp)
    return got.with_columns(exp.alias("timer_expires_ns"), late.alias("timer_lateness_ns")).select(act.columns)


def timer_from(st: S.Store) -> str:
    """How the timer lateness of a capture's threads was measured, or why not."""
    have = st.by_event()
    if "hrtimer_start" not in have:
        return "not measured: no hrtimer_start events (record timer:hrtimer_start)"
    if st.clock in MONO_CLOCKS:
        return "the capture's clock is CLOCK_MONOTONIC, the timers' own"
    if "hrtimer_expire_entry" in have:
        return "expiries carried onto the capture's clock by its timer interrupts (hrtimer_expire_entry)"
    return (
        "expiries carried onto the capture's clock by the wake-ups that followed them (no hrtimer_expire_entry): "
        "a lower bound, short by at most the smallest wake-up delay nearby"
    )


def thread_names(st: S.Store) -> dict[int, str]:
    """``names_in`` over a whole capture, reading its switches alone."""
    if st.legacy is not None:
        return names_in(st.legacy)
    if "sched_switch" not in st.event_names or not st.files():
        return {}
    code = st.event_names.index("sched_switch")
    # per segment file: each thread's last name there (the files are read one at a time)
    parts = []
    for f in st.files():
        sw = pl.scan_parquet(f).filter(pl.col("event") == code)
        parts.append(
            pl.concat(
                [
                    sw.select(pl.col("target").cast(pl.Int64).alias("tid"), pl.col("target_comm").alias("comm"), "t_ns"),
                    sw.select(pl.col("next_pid").cast(pl.Int64).alias("tid"), pl.col("next_comm").alias("comm"), "t_ns"),
                ]
            )
            .drop_nulls()
            .filter(pl.col("tid") > 0)
            .sort("t_ns")
            .group_by("tid")
            .agg(pl.col("comm").last(), pl.col("t_ns").last())
            .collect()
        )
    if not parts:
        return {}
    last = pl.concat(parts).sort("t_ns").group_by("tid").agg(pl.col("comm").last())
    table = st.strings
    return {int(t): table[int(c)] if 0 <= int(c) < len(table) else "?" for t, c in last.iter_rows()}


def matching(names: dict[int, str], comm: str | None = None, threads: str | None = None, tids: set[int] | None = None) -> dict[int, str]:
    """The threads to measure: those in ``tids`` (when given), whose name
    matches ``comm`` (a regular expression, anywhere in the name) and ``threads``."""
    out = {}
    for tid, name in names.items():
        if tids is not None and tid not in tids:
            continue
        if comm is not None and not re.search(comm, name):
            continue
        if threads is not None and not re.search(threads, name):
            continue
        out[tid] = name
    return out


#: the outliers of a thread whose causes are found: its largest (a busy thread's p99 is thousands of wake-ups)
MAX_EXPLAINED = 500


Causes = tuple[int, int, list[Share], "Parts | None"]


def _causes(st: S.Store, act: pl.DataFrame, roles: dict[int, str], groups: dict[int, str] | None = None) -> dict[int, Causes]:
    """Per thread, its outliers (activations whose lateness, from the timer's
    expiry where it slept on one, else from its wake-up, is above its p99; at
    least one), how many were explained (the largest ``MAX_EXPLAINED``), their
    causes, and their time before and after the wake-up."""
    from loopscope.analysis.explain import attribute_store, parts_of

    # only the columns this needs (a dense capture has millions of activations); a window starts at the
    # timer's expiry when the thread slept on one (the part before its wake-up is the timer's lateness)
    timed = pl.col("timer_expires_ns").is_not_null() & (pl.col("timer_expires_ns") <= pl.col("woken_ns"))
    ok = (
        act.lazy()
        .filter(pl.col("complete") & pl.col("wakeup_latency_ns").is_not_null())
        .select(
            "tid",
            pl.when(timed).then(pl.col("timer_expires_ns")).otherwise(pl.col("woken_ns")).alias("start_k"),
            # a window runs to the latest its switch-in can have been (attribution finds the run itself)
            (pl.col("on_ns") + pl.col("on_bound_ns").fill_null(0)).alias("on_ns"),
            pl.coalesce(pl.when(timed).then(pl.col("timer_lateness_ns")), pl.col("wakeup_latency_ns")).alias("late"),
        )
    )
    thr = ok.group_by("tid").agg(pl.col("late").quantile(0.99, "linear").alias("thr"))
    top = ok.join(thr, on="tid").filter(pl.col("late") >= pl.col("thr")).collect()
    if not len(top):
        return {}
    counts = dict(top.group_by("tid").len().iter_rows())
    top = top.sort("late", descending=True).group_by("tid", maintain_order=True).head(MAX_EXPLAINED)
    outl = top.with_row_index("id").select(pl.col("id").cast(pl.Int64), "tid", "start_k", pl.col("on_ns").alias("end_k"), pl.lit(False).alias("span"))
    att = attribute_store(st, outl, roles, groups)
    if hedge := hedged(st.by_event()):
        # what was not recorded may be in an idle-looking gap: the label says so (as explain's does)
        att = att.with_columns(pl.col("cause").replace(hedge))
    if not len(att):
        return {}
    att = att.join(outl.select("id", "tid"), on="id").with_columns(pl.col("cause").map_elements(A.cause_family, return_dtype=pl.String).alias("family"))
    out: dict[int, Causes] = {}
    for (tid,), g in att.group_by("tid"):
        by = g.group_by("family").agg(pl.col("ns").sum()).sort("ns", descending=True)
        total = int(by["ns"].sum())
        shares: list[Share] = [{"cause": str(f), "share": int(ns) / total} for f, ns in by.iter_rows()] if total else []
        out[int(tid)] = (int(counts.get(tid, 0)), int(g["id"].n_unique()), shares, parts_of(g))
    return out


def summarize(
    st: S.Store, threads: dict[int, str], roles: dict[int, str] | None = None, window: tuple[int, int] | None = None, groups: dict[int, str] | None = None
) -> ThreadsJson:
    """Every activation of ``threads`` (tid → name) in the capture, summarised
    per thread and explained; ``roles`` names the measuring side's own threads
    (``lab: …``), so that loopscope is told apart from the program's neighbours;
    ``window`` (kernel CLOCK_MONOTONIC ns): only the activations woken inside it
    (a command's start and its stop are the measuring side's doing, not its);
    ``groups``: threads under a CPU limit → the limited cgroup's path, which
    names their throttled time."""
    act = thread_activations(st, list(threads))
    if window is not None:
        act = act.filter(pl.coalesce("woken_ns", "on_ns").is_between(*window))
    causes = _causes(st, act, roles or {}, groups)
    rows: list[ThreadJson] = []
    for tid, name in sorted(threads.items()):
        a = act.filter(pl.col("tid") == tid)
        ok = a.filter(pl.col("complete"))
        n_out, n_explained, shares, parts = causes.get(tid, (0, 0, [], None))
        period = ok["period_ns"].drop_nulls()
        rows.append(
            {
                "tid": tid,
                "comm": name,
                "activations": len(a),
                "incomplete": len(a) - len(ok),
                "wakeup_latency_ns": _spread(ok["wakeup_latency_ns"]),
                "timer_lateness_ns": _spread(ok["timer_lateness_ns"]),
                "runtime_ns": _spread(ok["runtime_ns"]),
                "period_ns": int(np.median(period.to_numpy())) if len(period) else None,
                "preemptions": int(a["preemptions"].sum()),
                "migrations": int(a["migrations"].sum()),
                "switch_in_bound_ns": _spread(ok["on_bound_ns"].filter(ok["on_bound_ns"] > 0)),
                "outliers": n_out,
                "explained_outliers": n_explained,
                "causes": shares,
                "parts": parts,
            }
        )
    return {
        "threads": rows,
        "kernel_events": st.events,
        "lost_kernel_events": st.lost_events,
        "not_recorded": unseen(st.by_event()),
        "timer_lateness_from": timer_from(st),
    }
