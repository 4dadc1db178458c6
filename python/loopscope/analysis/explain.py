"""The outliers of a run and their causes, from its kernel captures.

For every probe step on a host a kernel capture covers, its kind hands
over the intervals explain may split (``ProbeKind.windows``: the timer's
and the sched probe's wake-ups, every pipeline stage's and both rr ends'
kernel-to-application waits, the syscall probe's batches, every interval a
``program`` or ``app`` logged); explain knows no kind by name, and a step
whose kind is not registered is said in ``not_explained``. Of those,
the records above the threshold (default: the p99 of that probe in that
phase, over all repetitions) are attributed (``attribution``): each
outlier's window split into causes. The capture is read in clusters of
outlier windows (``CHUNK_NS`` at most, ``MARGIN_NS`` around each), each
read by the native split itself from the row groups ``kernel.store`` names
(``Store.reads``), a run of groups at a time, so the memory explain needs is
that of a few row groups and the split's picture, whatever the run's length.

Causes that are loopscope's own components are named ``lab: capture``,
``lab: emulator``, ``lab: agent``, ``lab: sync``, ``lab: probe`` (a probe
process's own main thread), and background loads
``load: <name>``; each group carries the lab's share of the outliers' time
apart from the loads' and the system's, and the kernel threads it names
carry a one-line role.

Results:

- ``RUN/tables/attribution.parquet``: one row per outlier and cause
  (``rep``, ``phase``, ``probe``, ``host``, ``id``, ``t_ns``,
  ``latency_ns``, ``cause``, ``ns``, ``cpu``, ``migrations``,
  ``page_faults``, ``complete``);
- ``RUN/explain.json``: per probe and phase the top causes with their
  share of the outliers' time, the number of outliers attributed (the
  latest ``max_outliers`` of those above the threshold), whether every
  window was covered by a capture that lost nothing, the capture's counts,
  its size on disk and what its reader cost, and when the reader had to
  run during a window.
"""

from __future__ import annotations

import os
import time
from concurrent.futures import Future, ThreadPoolExecutor
from pathlib import Path
from typing import TYPE_CHECKING, Any

import numpy as np
import polars as pl

from loopscope import _native, progress
from loopscope.analysis import attribution as A
from loopscope.analysis import recorded as R
from loopscope.analysis import slowed as SL
from loopscope.analysis.limits import groups_of
from loopscope.kernel import store as S
from loopscope.trace import reader
from loopscope.rundir import Capture, Derived, RunDir, RunRecord, Step
from loopscope.analysis.registry import Registry

if TYPE_CHECKING:
    from loopscope._native import _Split as Split
from loopscope.analysis.explained import Cause, CaptureSummary, ExplainDoc, Found, Group, Parts, read
from loopscope.analysis.windows import WINDOWS
import re

# A cluster of outlier windows is at most this long, and gets the kernel
# events this far around its windows: runtime accounting comes at least
# every tick (4 ms at HZ=250), so 20 ms holds the run that ends a window and
# the switch-ins, wake-ups and interrupts around it. The length bounds the
# split's picture of the CPUs (its events it reads itself, a run of row
# groups at a time). On 2,000 outliers spread over a capture of 10.7 M events
# (`threads --comm stress-ng`), 125 ms clusters took 0.78-0.84 s, 250 ms ones
# 0.73-0.76 s (each cluster's margins read again: 12 % more events), 500 ms
# ones 0.75-0.81 s and 1 s ones 0.87-0.95 s (a larger picture, slower to
# look up) and 100-200 MB more.
CHUNK_NS = 250_000_000
MARGIN_NS = 20_000_000
# Windows closer than this share one native call: the events between them
# cost less to split than another call costs to prepare (the row groups
# they sit in are read whole either way).
JOIN_NS = 250_000_000
# A cluster longer than this is one long window (CHUNK_NS bounds the joined ones).
LONG_NS = CHUNK_NS + 2 * MARGIN_NS
# Threads splitting clusters at once, and clusters read ahead of the splits.
SPLITTERS = max(1, min(4, os.cpu_count() or 1))
IN_FLIGHT = 2 * SPLITTERS
# Traces a step's kind may read more than once are kept this many at a time.
TRACES_KEPT = 16


def _host_offsets(run_dir: Path) -> dict[str, int]:
    return RunDir(run_dir).provenance().offsets()


def _roles(run: RunRecord) -> dict[int, str]:
    """Threads the run knows by id: each load's (from its cgroup at stop), the
    lab's own processes' and the capture reader's (whatever their threads
    call themselves: polars' pool, jemalloc's, rich's refresh)."""
    out: dict[int, str] = {}
    for ld in run.loads:
        for t in ld.tids:
            out[t] = f"load: {ld.name}"
    for label, tids in run.lab_tids.items():
        for t in tids:
            out[t] = label
    for cap in run.captures:
        for t in cap.reader_tids:
            out[t] = "lab: capture"
    return out


def _count(v: float | None) -> int | None:
    return None if v is None else int(v)


def _capture_entry(run_dir: Path, cap: Capture, st: S.Store) -> CaptureSummary:
    span = ((st.t_last or 0) - (st.t_first or 0)) / 1e9 if st.events else 0
    secs = cap.seconds or span or None
    on_disk = st.bytes_on_disk()
    reader_cpu = cap.reader_cpu_s if "reader_cpu_s" in cap.model_fields_set else cap.perf_cpu_s
    rd = cap.reader or {}
    by_event = st.by_event()  # first: a file found damaged as it is read counts as lost below
    return {
        "host": cap.host,
        "covers": cap.covers,
        "format": cap.format or "perf.data",
        "events": st.events,
        "lost_events": st.lost_events,
        "lost_counted": st.lost_counted,
        "by_event": by_event,
        "t_first_ns": st.t_first,
        "t_last_ns": st.t_last,
        "seconds": secs,
        "bytes_on_disk": on_disk,
        "bytes_per_s": on_disk / secs if secs else None,
        "events_per_s": st.events / span if span else None,
        "reader_cpu_s": reader_cpu,
        "reader_cpu_share": reader_cpu / secs if reader_cpu is not None and secs else None,
        "reader_setup_cpu_s": cap.reader_setup_cpu_s,
        "perf_cpu_s": cap.perf_cpu_s,
        "perf_cpu_share": cap.perf_cpu_s / secs if cap.perf_cpu_s is not None and secs else None,
        "reads_between_windows": _count(rd.get("reads_asked")),
        "reads_during_windows": _count(rd.get("reads_half_full")),
        "reader_ran_during": cap.reader_ran_during,
        "buffer_mb_per_cpu": cap.buffer_mb_per_cpu,
        "missing_events": cap.missing_events or [],
        "not_recorded": R.unseen(st.by_event()),
        "lost_placed": not st.unknown_loss,
        "lost_unplaced": st.unknown_loss,
        "problems": st.problems,
        "lost_windows": len(st.lost),
        "lost_where": [
            {"cpu": r["cpu"], "start_ns": r["start_ns"], "end_ns": r["end_ns"], "events": r["events"]}
            for r in st.lost.sort("events", descending=True).head(20).iter_rows(named=True)
        ],
    }


def clusters(start: np.ndarray, end: np.ndarray) -> list[tuple[int, int]]:
    """Windows sorted by start, taken in clusters (at most ``JOIN_NS``
    apart, at most ``CHUNK_NS`` long): (first index, index after the last)."""
    out = []
    i, n = 0, len(start)
    while i < n:
        a, hi, j = int(start[i]), int(end[i]), i
        while j + 1 < n and int(start[j + 1]) - hi <= JOIN_NS and max(hi, int(end[j + 1])) - a <= CHUNK_NS:
            j += 1
            hi = max(hi, int(end[j]))
        out.append((i, j + 1))
        i = j + 1
    return out


def attribute_store(st: S.Store, outl: pl.DataFrame, roles: dict[int, str] | None = None, groups: dict[int, str] | None = None) -> pl.DataFrame:
    """Attribute the windows of ``outl`` (``id``, ``tid``, ``start_k``, ``end_k``,
    ``span``) from the capture, a cluster of windows at a time
    (``clusters``), each with the kernel events from ``MARGIN_NS`` before
    its first window to ``MARGIN_NS`` after its last: one native call per
    cluster, which reads the rows it needs from the capture's files itself
    (``Store.reads``)."""
    o = outl.sort("start_k")
    start, end = o["start_k"].to_numpy(), o["end_k"].to_numpy()
    lost = st.lost_events if not st.unknown_loss else max(1, st.lost_events)
    lost_at = st.lost if not st.unknown_loss else None
    cl = clusters(start, end)
    spans = [(int(start[i]) - MARGIN_NS, int(end[i:j].max()) + MARGIN_NS) for i, j in cl]
    if st.legacy is not None:
        return pl.concat(
            [A.attribute_many(A.Kernel.of(st.load(a, b), lost, lost_at, roles=roles, perf_is_lab=True), o[i:j]) for (i, j), (a, b) in zip(cl, spans)]
            or [A.splits_table([])]
        )
    # The splits run on SPLITTERS threads, each reading its cluster's row groups itself (the native call releases
    # the interpreter lock, and streams a run of groups at a time: a long window's memory is a group's and the
    # split's picture); at most IN_FLIGHT clusters wait.
    done: list[Future[Split]] = []
    t_first, t_last = st.t_first or 0, st.t_last or 0
    # the capture's string table made native once, not copied at every cluster's call
    strings = _native.StringTable(st.strings)
    # what each cluster's split frees (runs, per-thread lists) serves the next one, not new zeroed pages
    with _native.FreedKept(), ThreadPoolExecutor(SPLITTERS, thread_name_prefix="ls-explain") as pool:
        for n, ((i, j), (a, b)) in enumerate(zip(cl, spans)):
            k = A.Kernel.arrays(st.reads(a, b), strings, st.event_names, lost, lost_at, roles=roles)
            k.t_first, k.t_last = t_first, t_last
            k.groups = groups or {}
            done.append(pool.submit(k.split, o[i:j]))
            if n >= IN_FLIGHT:
                done[n - IN_FLIGHT].result()
            progress.step("explain: attributing outliers", j, len(o))
        splits = [f.result() for f in done]
    return A.splits_table(splits)


class RunSource:
    """What kinds read to hand explain their windows (``kinds.base.WindowSource``):
    the run's record and spec, and its traces, each read once."""

    def __init__(self, run_dir: Path, run: RunRecord, kernels: dict[str, int]) -> None:
        self.run_dir, self.run = run_dir, run
        self.spec: dict[str, object] = RunDir(run_dir).spec()
        self._kernels = kernels
        # a step's traces read once (a pipeline's sink trace serves its messages, its stage and its calibration)
        self._traces: dict[str, tuple[pl.DataFrame, Any] | None] = {}

    def trace(self, rel: str) -> pl.DataFrame | None:
        got = self.trace_info(rel)
        return None if got is None else got[0]

    def trace_info(self, rel: str) -> tuple[pl.DataFrame, Any] | None:
        if rel not in self._traces:
            p = self.run_dir / rel
            self._traces[rel] = reader.read_with_info(p, sort=False) if p.exists() else None
            while len(self._traces) > TRACES_KEPT:
                self._traces.pop(next(iter(self._traces)))
        return self._traces[rel]

    def host_of(self, step: Step) -> str:
        return self.run.host_of(step)

    def same_kernel(self, a: str, b: str) -> bool:
        return a in self._kernels and self._kernels.get(a) == self._kernels.get(b)


def windows_of(run_dir: Path, run: RunRecord, kinds: Registry, caps: list[Capture]) -> tuple[pl.DataFrame, list[str]]:
    """Every step's windows through its kind's hook (``ProbeKind.windows``),
    and the steps no registered kind answers for (said, never skipped silently)."""
    kernels = {h: i for i, c in enumerate(caps) for h in c.covers}
    src = RunSource(run_dir, run, kernels)
    parts, unknown = [], []
    steps = run.steps
    for n, st in enumerate(steps, 1):
        progress.step("explain: reading probe traces", n, len(steps))
        kind = kinds.get(st.kind) if kinds is not None else None
        if kind is None:
            unknown.append(f"{st.probe} ({st.kind})")
            continue
        w = kind.windows(st, src)
        if len(w):
            parts.append(w)

    return (pl.concat(parts) if parts else pl.DataFrame(schema=WINDOWS)), sorted(set(unknown))


def explain(run_dir: Path, kinds: Registry, quantile: float = 0.99, max_outliers: int = 5000, all_causes: bool = False) -> ExplainDoc | None:
    """``attribute`` a run and have its run directory write the result
    (explain.json, tables/attribution.parquet); what explain.json holds."""
    d = attribute(run_dir, kinds, quantile, max_outliers, all_causes)
    if d is None:
        return None
    RunDir(run_dir).write_derived(d)
    out: ExplainDoc = d.documents["explain.json"]
    return out


def cached(run_dir: Path, kinds: Registry) -> ExplainDoc | None:
    """The run's explain.json when it is newer than the run record, else
    explained now (and written); None when no capture holds data."""
    ej, rj = run_dir / "explain.json", run_dir / "run.json"
    if ej.exists() and rj.exists() and ej.stat().st_mtime >= rj.stat().st_mtime:
        return read(ej)
    return explain(run_dir, kinds)


def attribute(run_dir: Path, kinds: Registry, quantile: float = 0.99, max_outliers: int = 5000, all_causes: bool = False) -> Derived | None:
    """Attribute every covered probe's outliers; ``kinds`` is the kind
    registry whose ``windows`` hook gives each step's intervals;
    ``all_causes`` adds every cause of each group (``all_causes``), not only
    the top eight. Nothing is written: the result is returned."""
    run = RunDir(run_dir).record()
    caps = [c for c in run.captures if c.data]
    if not caps:
        return None
    t0 = time.perf_counter()
    offsets = _host_offsets(run_dir)
    roles = _roles(run)
    out: ExplainDoc = {"captures": [], "groups": [], "threshold": f"p{quantile * 100:g} of each probe in each phase", "max_outliers": max_outliers}
    frames = []
    wins, unknown = windows_of(run_dir, run, kinds, caps)
    next_id = 0
    if unknown:
        out["not_explained"] = [f"{u}: no registered kind gives its windows" for u in unknown]
    off = pl.col("host").cast(pl.String).replace_strict(offsets, default=0, return_dtype=pl.Int64) if offsets else pl.lit(0, dtype=pl.Int64)
    wins = wins.with_columns((pl.col("t_ns") - off).alias("start_k"), (pl.col("t_ns") + pl.col("latency_ns") - off).alias("end_k"))
    refs = _slow_references(run_dir, wins)
    for cap in caps:
        progress.step(f"explain: opening the kernel capture of {cap.host}")
        try:
            st = S.open_capture(run_dir, cap)
        except S.CaptureError as e:
            out["captures"].append({**cap.model_dump(mode="json", exclude_unset=True), "error": str(e)})  # type: ignore[arg-type]
            continue
        if cap.read == "imported":
            R.need_scheduler(st.by_event(), str(run_dir), "explain")
        out["captures"].append(_capture_entry(run_dir, cap, st))
        # The outliers of each probe and phase, without a copy of every record
        # (a long run has millions): the threshold per row is a window
        # expression, and only the rows above it are made.
        recs = wins.lazy().filter(pl.col("host").is_in(cap.covers)).with_row_index("id").with_columns(pl.col("id").cast(pl.Int64) + next_id)
        thr = recs.group_by("probe", "phase").agg(pl.col("latency_ns").quantile(quantile, "linear").alias("threshold_ns"), pl.len().alias("records")).collect()
        if not len(thr):
            continue
        next_id += int(thr["records"].sum())
        above = recs.filter(pl.col("latency_ns") > pl.col("latency_ns").quantile(quantile, "linear").over("probe", "phase")).collect()
        above = above.with_columns(pl.col(c).cast(pl.String) for c in ("probe", "phase", "host")).sort("latency_ns", descending=True)
        thr = thr.with_columns(pl.col(c).cast(pl.String) for c in ("probe", "phase"))
        n_above = above.group_by("probe", "phase").len()
        # The ``max_outliers`` largest of each probe and phase (a long run's p99 is thousands).
        outl = above.group_by("probe", "phase", maintain_order=True).head(max_outliers)
        del above
        att = SL.split(attribute_store(st, outl, roles, groups_of(cap.cpu_limits, st)), outl, refs)
        # what the capture recorded: its enabled set (an event that never fired was still recorded), else what it holds
        if hedge := R.hedged([e.split(":")[-1] for e in cap.events or []] or st.by_event()):
            # what was not recorded may be in an idle-looking gap: the label says so, it does not guess
            att = att.with_columns(pl.col("cause").replace(hedge))
        frames.append(att.join(outl.select("id", "rep", "phase", "probe", "host", "t_ns", "latency_ns", "span"), on="id"))
        for (probe, phase), g in (
            att.join(outl.select("id", "probe", "phase"), on="id").with_columns(A.family().alias("family")).group_by("probe", "phase", maintain_order=True)
        ):
            out["groups"].append(_group_entry(probe, phase, cap, g, thr, n_above, all_causes, refs))
    att_all = pl.concat(frames) if frames else pl.DataFrame()
    out["seconds"] = time.perf_counter() - t0
    return Derived(documents={"explain.json": out}, tables={"tables/attribution.parquet": att_all} if len(att_all) else {})


def _slow_references(run_dir: Path, wins: pl.DataFrame) -> pl.DataFrame:
    """Each probe and phase's reference for ``slowed: no kernel event``: the
    phases in the run's order, each compared with its ``compare_with``."""
    try:
        spec = RunDir(run_dir).spec()
    except (OSError, ValueError):
        spec = {}
    phases = [p["name"] for p in spec.get("phases") or [] if p.get("name")]
    against = {p["name"]: p["compare_with"] for p in spec.get("phases") or [] if p.get("compare_with")}
    return SL.references(wins, phases, against)


def _group_entry(
    probe: str, phase: str, cap: Capture, g: pl.DataFrame, thr: pl.DataFrame, n_above: pl.DataFrame, all_causes: bool, refs: pl.DataFrame | None = None
) -> Group:
    """One probe × phase of explain's result: its causes and shares."""
    total = int(g["ns"].sum())
    by = (g if "family" in g.columns else g.with_columns(A.family().alias("family"))).group_by("family").agg(pl.col("ns").sum()).sort("ns", descending=True)
    t = thr.filter((pl.col("probe") == probe) & (pl.col("phase") == phase))
    fam = {r["family"]: int(r["ns"]) for r in by.iter_rows(named=True)}
    lab = {c: ns for c, ns in fam.items() if c.startswith("lab: ")}
    loads = sum(ns for c, ns in fam.items() if c.startswith("load: "))
    causes: list[Cause] = [
        {"cause": r["family"], "ns": int(r["ns"]), "share": r["ns"] / total if total else None, "role": A.role_of(r["family"])}
        for r in by.head(8).iter_rows(named=True)
    ]
    entry: Group = {
        "probe": probe,
        "phase": phase,
        "host_kernel": cap.host,
        "records": int(t["records"][0]),
        "threshold_ns": float(t["threshold_ns"][0]),
        "outliers": int(g["id"].n_unique()),
        "outlier_ns": total,
        "above_threshold": int(n_above.filter((pl.col("probe") == probe) & (pl.col("phase") == phase))["len"][0]),
        "complete": bool(g["complete"].all()),
        "incomplete_outliers": int(g.filter(~pl.col("complete"))["id"].n_unique()),
        "incomplete_why": _why_counts(g),
        "lab_share": sum(lab.values()) / total if total else 0.0,
        "lab": {c: ns / total for c, ns in sorted(lab.items(), key=lambda kv: -kv[1])} if total else {},
        "load_share": loads / total if total else 0.0,
        "system_share": (total - sum(lab.values()) - loads) / total if total else 0.0,
        "causes": causes,
    }
    parts = parts_of(g)
    if parts is not None:
        entry["parts"] = parts
    if cpus := _cpus_of(g):
        entry["cpus"] = cpus
    if SL.LABEL in fam and refs is not None and len(r := refs.filter((pl.col("probe") == probe) & (pl.col("phase") == phase))):
        entry["slowed"] = {"reference_phase": str(r["ref_phase"][0]), "reference_ns": int(r["ref_ns"][0]), "candidates": SL.candidates(_cpus_of(g))}
    if all_causes:
        entry["all_causes"] = [{"cause": r["family"], "ns": int(r["ns"]), "share": r["ns"] / total if total else None} for r in by.iter_rows(named=True)]
    return entry


def _cpus_of(g: pl.DataFrame) -> list[int]:
    """The CPUs a group's outliers ran on (the native split's ``cpu``)."""
    return sorted({int(c) for c in g["cpu"].drop_nulls().unique().to_list() if c is not None and int(c) >= 0}) if "cpu" in g.columns else []


def parts_of(g: pl.DataFrame, top: int = 4) -> Parts | None:
    """The outliers' time before the wake-up and after it, each part's
    causes (families, largest first), over the outliers whose wake-up was
    recorded; None when none was (spans, a recording without wake-ups)."""
    k = g.filter(pl.col("before_ns").is_not_null()) if "before_ns" in g.columns else g.clear()
    total = int(k["ns"].sum() or 0) if len(k) else 0
    if not total:
        return None
    if "family" not in k.columns:
        k = k.with_columns(A.family().alias("family"))
    by = k.group_by("family").agg(pl.col("before_ns").sum().alias("pre"), (pl.col("ns") - pl.col("before_ns")).sum().alias("post"))
    pre = int(by["pre"].sum())

    def ranked(col: str) -> list[Cause]:
        r = by.filter(pl.col(col) > 0).sort(col, descending=True).head(top)
        return [{"cause": str(f), "ns": int(ns), "share": int(ns) / total} for f, ns in r.select("family", col).iter_rows()]

    return {
        "before_wakeup_share": pre / total,
        "headline": "before the wake-up" if 2 * pre > total else "after the wake-up",
        "before": ranked("pre"),
        "after": ranked("post"),
    }


def _why_counts(g: pl.DataFrame) -> list[str]:
    """The reasons outliers are incomplete, each with how many it touches
    (the per-window event counts folded into one reason)."""

    per = g.filter(~pl.col("complete")).group_by("id").agg(pl.col("missing").drop_nulls().first())
    counts: dict[str, int] = {}
    for m in per["missing"].to_list():
        for part in (m or "unknown").split("; "):
            key = re.sub(r"^\d+ kernel events lost inside the window \(CPU [^)]*\)", "kernel events lost inside the window", part)
            counts[key] = counts.get(key, 0) + 1
    return [f"{k} ({n})" for k, n in sorted(counts.items(), key=lambda kv: -kv[1])]


def causes_in(att: pl.DataFrame, windows: list[tuple[int, int]]) -> Found | None:
    """What explain found in an anomaly's windows: ``att``, the attribution
    rows of one probe, phase and repetition (``id``, ``t_ns``, ``cause``,
    ``ns``); ``windows``, the finding's stretches of the same clock (none:
    all of them). The cause with the most of the outliers' time there, its
    share, and in how many windows it is present (a window with no
    attributed outlier counts against it)."""
    if att is None or not len(att):
        return None
    a = att.with_columns(A.family().alias("family"))
    if windows:
        ws = pl.DataFrame({"w": list(range(len(windows))), "lo": [w[0] for w in windows], "hi": [w[1] for w in windows]})
        a = a.join_where(ws, pl.col("t_ns") >= pl.col("lo"), pl.col("t_ns") < pl.col("hi"))
    else:
        a = a.with_columns(pl.lit(0).alias("w"))
    if not len(a):
        return {"cause": None, "share": 0.0, "windows_with": 0, "windows": len(windows), "outliers": 0}
    by = a.group_by("family").agg(pl.col("ns").sum()).sort("ns", descending=True)
    top = str(by["family"][0])
    total = int(a["ns"].sum())
    return {
        "cause": top,
        "share": int(by["ns"][0]) / total if total else 0.0,
        "windows_with": int(a.filter(pl.col("family") == top)["w"].n_unique()),
        "windows": len(windows) or 1,
        "outliers": int(a["id"].n_unique()),
    }
