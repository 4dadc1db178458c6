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
from collections.abc import Mapping

import polars as pl
from typing_extensions import NotRequired, TypedDict

from loopscope.analysis import attribution as A
from loopscope.analysis.explained import Parts
from loopscope.analysis.recorded import Unseen, hedged, unseen
from loopscope.analysis.activations import FIGURES, MONO_CLOCKS, OFFSET_WINDOW, SUMMARY, WORST, Feed, activations, mono_offsets
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


def _spread(r: Mapping[str, int | None], figure: str) -> Spread | None:
    """A figure of a thread's summary row: None when it has no value."""
    p50, p99, most = (r.get(f"{figure}_{q}") for q in ("p50", "p99", "max"))
    if p50 is None or p99 is None or most is None:
        return None
    return {"p50": p50, "p99": p99, "max": most}


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


def capture_offsets(st: S.Store) -> pl.DataFrame | None:
    """The capture's clock against CLOCK_MONOTONIC (``mono_offsets``), from all
    of its timer interrupts (a small filtered read); None on CLOCK_MONOTONIC."""
    if st.clock in MONO_CLOCKS:
        return None
    code = st.event_names.index("hrtimer_expire_entry") if "hrtimer_expire_entry" in st.event_names else -2
    ex = pl.concat([pl.scan_parquet(f).filter(pl.col("event") == code).select("t_ns", "expires").collect() for f in st.checked_files()])
    return mono_offsets(ex.with_columns(pl.lit("hrtimer_expire_entry").alias("event")))


def _feed(st: S.Store, tids: list[int], top_k: int | None = None, window: tuple[int, int] | None = None) -> tuple[Feed, bool]:
    """The native pass over the capture's segment files, which it reads
    itself (a run of row groups read ahead of its folding; text stays codes);
    and whether its timer expiries are still on CLOCK_MONOTONIC
    (``carried_by_wakeups``)."""
    offsets = capture_offsets(st)
    # no timer interrupts to carry the expiries with: they stay on CLOCK_MONOTONIC (carried by nothing), carried
    # later from the wake-ups, which needs the rows
    raw = offsets is not None and not len(offsets)
    feed = Feed(
        tids,
        st.lost,
        st.clock,
        (st.event_names, st.strings),
        pl.DataFrame({"t_ns": [0], "off_ns": [0]}) if raw else offsets,
        top_k if not raw else None,
        window,
    )
    feed.feed_files(st)
    return feed, raw


def thread_activations(st: S.Store, tids: list[int]) -> pl.DataFrame:
    """Every activation of ``tids`` in the capture (``activations.COLUMNS``),
    the capture streamed through the native pass a segment file at a time;
    memory is a file's events and the rows, whatever the capture's length."""
    if st.legacy is not None or not st.files():
        return activations(st.load(st.t_first or 0, st.t_last or 0), tids, st.lost, st.clock)
    feed, raw = _feed(st, tids)
    return carried_by_wakeups(feed.rows()) if raw else feed.rows()


def thread_summary(st: S.Store, tids: list[int], window: tuple[int, int] | None = None) -> tuple[pl.DataFrame, pl.DataFrame]:
    """Each thread's activations folded (``activations.SUMMARY``) and its
    ``MAX_EXPLAINED`` latest outliers (``activations.WORST``), only those woken
    inside ``window`` when given: the native pass folds them as they close, so
    memory is the threads' histograms, not the activations. A capture the
    fold cannot take (a legacy one, or timer expiries carried by the wake-ups,
    which needs every activation) is summarised from its rows, exactly."""
    if st.legacy is None and st.files():
        feed, raw = _feed(st, tids, MAX_EXPLAINED, window)
        if not raw:
            return feed.summary()
        act = carried_by_wakeups(feed.rows())
    else:
        act = thread_activations(st, tids)
    if window is not None:
        act = act.filter(pl.coalesce("woken_ns", "on_ns").is_between(*window))
    return summary_of_rows(act)


#: the outliers of a thread whose causes are found: its largest (a busy thread's p99 is thousands of wake-ups)
MAX_EXPLAINED = 500


def summary_of_rows(act: pl.DataFrame) -> tuple[pl.DataFrame, pl.DataFrame]:
    """``thread_summary`` from activation rows (``activations.COLUMNS``),
    with exact quantiles (linear between ranks): its outliers are the complete
    activations whose lateness is at or above the thread's p99 (at least one)."""
    ok = pl.col("complete")
    aggs: list[pl.Expr] = [pl.len().alias("activations"), ok.sum().cast(pl.Int64).alias("complete"), pl.col("preemptions").sum(), pl.col("migrations").sum()]
    for f in FIGURES:
        v = pl.col(f).filter(ok & pl.col(f).is_not_null() & ((pl.col(f) > 0) if f == "on_bound_ns" else pl.lit(True)))
        aggs += [v.quantile(0.5, "linear").round().alias(f"{f}_p50"), v.quantile(0.99, "linear").round().alias(f"{f}_p99"), v.max().alias(f"{f}_max")]
    per = act.group_by("tid").agg(aggs)
    timed = pl.col("timer_expires_ns").is_not_null() & (pl.col("timer_expires_ns") <= pl.col("woken_ns"))
    late = (
        act.lazy()
        .filter(ok & pl.col("wakeup_latency_ns").is_not_null())
        .select(
            "tid",
            pl.coalesce(pl.when(timed).then(pl.col("timer_lateness_ns")), pl.col("wakeup_latency_ns")).alias("late"),
            pl.when(timed).then(pl.col("timer_expires_ns")).otherwise(pl.col("woken_ns")).alias("start_k"),
            # a window runs to the latest its switch-in can have been (attribution finds the run itself)
            (pl.col("on_ns") + pl.col("on_bound_ns").fill_null(0)).alias("end_k"),
        )
    )
    thr = late.group_by("tid").agg(pl.col("late").quantile(0.99, "linear").alias("thr"))
    top = late.join(thr, on="tid").filter(pl.col("late") >= pl.col("thr")).drop("thr").collect()
    counts = top.group_by("tid").agg(pl.len().cast(pl.Int64).alias("outliers"))
    per = per.join(counts, on="tid", how="left").with_columns(pl.col("outliers").fill_null(0))
    worst = top.sort(["tid", "late"], descending=[False, True]).group_by("tid", maintain_order=True).head(MAX_EXPLAINED)
    return per.select(list(SUMMARY)).cast(SUMMARY), worst.select(list(WORST)).cast(WORST)  # type: ignore[arg-type]


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
    if (kept := _kept_names(st)) is not None:
        return kept
    code = st.event_names.index("sched_switch")
    # per segment file, each side's (the task switched out, the one switched in) last name of each thread: a file is
    # in time order and a group keeps it, so no sort; of the two sides, the later is the thread's (the files are read
    # one at a time)
    parts = []
    for f in st.checked_files():
        sw = pl.scan_parquet(f).filter(pl.col("event") == code).select("t_ns", "target", "target_comm", "next_pid", "next_comm").collect()
        for tid, comm in (("target", "target_comm"), ("next_pid", "next_comm")):
            side = sw.filter(pl.col(tid).is_not_null() & pl.col(comm).is_not_null()).group_by(tid).agg(pl.col(comm).last(), pl.col("t_ns").last())
            parts.append(side.select(pl.col(tid).cast(pl.Int64).alias("tid"), pl.col(comm).alias("comm"), "t_ns"))
    if not parts:
        return {}
    last = pl.concat(parts).filter(pl.col("tid") > 0).sort("t_ns").group_by("tid").agg(pl.col("comm").last())
    table = st.strings
    return {int(t): table[int(c)] if 0 <= int(c) < len(table) else "?" for t, c in last.iter_rows()}


def _kept_names(st: S.Store) -> dict[int, str] | None:
    """The names each segment's writer saw in its switches, kept in its line
    (an import's): no switch is read again, a later segment's name is the
    later one. None when a segment lacks them (a run's capture, an older
    import) or holds something else."""
    written = [seg for seg in st.segments if seg.get("file") and seg.get("readable", True)]
    if not all("names" in seg for seg in written):
        return None
    codes: dict[int, int] = {}
    try:
        for seg in written:
            codes.update((int(t), int(c)) for t, c in seg["names"])
    except (TypeError, ValueError):
        return None  # a line whose names are not [tid, code] pairs (edited by hand): every switch is read instead
    return {t: st.strings[c] if 0 <= c < len(st.strings) else "?" for t, c in codes.items() if t > 0}


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


Causes = tuple[int, list[Share], "Parts | None"]


def _causes(st: S.Store, worst: pl.DataFrame, roles: dict[int, str], groups: dict[int, str] | None = None) -> dict[int, Causes]:
    """Per thread, how many of its kept outliers (``worst``, ``thread_summary``)
    were explained, their causes, and their time before and after the wake-up."""
    from loopscope.analysis.explain import attribute_store, parts_of

    if not len(worst):
        return {}
    outl = worst.with_row_index("id").select(pl.col("id").cast(pl.Int64), "tid", "start_k", "end_k", pl.lit(False).alias("span"))
    att = attribute_store(st, outl, roles, groups)
    if hedge := hedged(st.by_event()):
        # what was not recorded may be in an idle-looking gap: the label says so (as explain's does)
        att = att.with_columns(pl.col("cause").replace(hedge))
    if not len(att):
        return {}
    att = att.join(outl.select("id", "tid"), on="id").with_columns(A.family().alias("family"))
    out: dict[int, Causes] = {}
    for (tid,), g in att.group_by("tid"):
        by = g.group_by("family").agg(pl.col("ns").sum()).sort("ns", descending=True)
        total = int(by["ns"].sum())
        shares: list[Share] = [{"cause": str(f), "share": int(ns) / total} for f, ns in by.iter_rows()] if total else []
        out[int(tid)] = (int(g["id"].n_unique()), shares, parts_of(g))
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
    per, worst = thread_summary(st, list(threads), window)
    causes = _causes(st, worst, roles or {}, groups)
    got = {int(r["tid"]): r for r in per.iter_rows(named=True)}
    rows: list[ThreadJson] = []
    for tid, name in sorted(threads.items()):
        r = got.get(tid)
        if r is None:
            r = {c: 0 for c in ("activations", "complete", "preemptions", "migrations", "outliers")}
        n_explained, shares, parts = causes.get(tid, (0, [], None))
        rows.append(
            {
                "tid": tid,
                "comm": name,
                "activations": r["activations"],
                "incomplete": r["activations"] - r["complete"],
                "wakeup_latency_ns": _spread(r, "wakeup_latency_ns"),
                "timer_lateness_ns": _spread(r, "timer_lateness_ns"),
                "runtime_ns": _spread(r, "runtime_ns"),
                "period_ns": r.get("period_ns_p50"),
                "preemptions": r["preemptions"],
                "migrations": r["migrations"],
                "switch_in_bound_ns": _spread(r, "on_bound_ns"),
                "outliers": r["outliers"],
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
