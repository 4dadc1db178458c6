"""The global timeline: every record of every host on the reference's clock.

``build(run_dir)`` estimates the clocks (``loopscope.clock.sync``), then
reads every trace of the run and adds to each record ``t_global_ns`` (the
reference host's CLOCK_MONOTONIC) and ``bound_ns`` (how far the true
instant can be from it), writing ``RUN/timeline.parquet``. Records that
cannot be placed (a host without probes, a window without an estimate) keep
a null ``t_global_ns`` and are counted, never dropped.

Macro events spanning hosts are assembled from their parts: each message of
a distributed pipeline becomes one row of ``RUN/tables/pipeline_global.parquet``
with every stage's stamps on the global clock and each hop's network time
with its bound (the bounds of its two ends added). Consistency checks: a
one-way delay (a pipeline hop, a clock-sync probe) below zero by more than
its bound is listed; and where a pipeline's source and sink share a host the
round trip measured on that one clock is compared with the sum of the legs
reconstructed on the timeline. The emulator's trace (netns labs) is placed
too, as host ``router``: it shares the hosts' kernel, hence their
CLOCK_REALTIME.
"""

from __future__ import annotations

from pathlib import Path

from pydantic import TypeAdapter, ValidationError
from typing_extensions import TypedDict

import numpy as np
import polars as pl

from loopscope.clock import sync
from loopscope.errors import InputError
from loopscope.rundir import Derived, Provenance, RunDir, RunRecord
from loopscope.trace.files import Files
from loopscope.clock import estimate as E
from loopscope.probes.pipeline import messages_from
from loopscope.units import format_ns


class Placed(TypedDict):
    """A host's records, and how many have a place on the global clock."""

    records: int
    placed: int
    not_placed: int


class SyncCheck(TypedDict):
    """A host's clock-sync probes' own one-way delays on the timeline."""

    there_min_ns: float | None
    back_min_ns: float | None
    negative_beyond_bound: int


#: one hop of a pipeline on the timeline, or a loop's round trip against its legs
HopCheck = TypedDict(
    "HopCheck",
    {
        "rep": int,
        "phase": str,
        "probe": str,
        "hop": int,
        "from": str,
        "to": str,
        "messages": int,
        "min_net_ns": float | None,
        "min_raw_ns": float | None,
        "bound_median_ns": float | None,
        "negative_beyond_bound": int,
        "round_trip": bool,
        "max_abs_diff_ns": float | None,
    },
    total=False,
)


class Checks(TypedDict, total=False):
    clocksync: dict[str, SyncCheck]
    pipeline: list[HopCheck]


class TimelineDoc(TypedDict, total=False):
    """timeline.json: the reference, every host's placed records, the checks
    a timeline must pass, the clock estimate (when the run synchronised)."""

    hosts: dict[str, Placed]
    checks: Checks
    notes: list[str]
    reference: str
    records: int
    clock: sync.ClockSummary


_DOC = TypeAdapter(TimelineDoc)


def cached(run_dir: Path) -> TimelineDoc:
    """The run's timeline.json when it is newer than the run record, else built now (and written)."""
    tj, rj = run_dir / "timeline.json", run_dir / "run.json"
    if tj.exists() and rj.exists() and tj.stat().st_mtime >= rj.stat().st_mtime:
        try:
            return _DOC.validate_json(tj.read_bytes())
        except ValidationError as e:
            err = e.errors()[0]
            raise InputError(f"{tj}: {'.'.join(str(p) for p in err['loc'])}: {err['msg']} (`loopscope timeline {run_dir}` writes it again)") from None
    return build(run_dir)


COLUMNS = ["host", "source", "thread", "tid", "group", "name", "kind", "tag", "t_ns", "dur_ns", "value", "t_global_ns", "bound_ns"]


class TimelineError(InputError):
    """A run whose hosts cannot be placed on one timeline from what it recorded."""


def _router_clock(files: Files, run: RunRecord, prov: Provenance, clocks: sync.RunClocks | None) -> sync.HostClock | None:
    """The emulator's process lives in the router namespace: same kernel, same REALTIME."""
    em = run.emulator
    inf = files.info(em.trace) if em else None
    if inf is None or clocks is None:
        return None
    pairs = sync.Pairs.of(inf.calibration)
    h = sync.HostClock("router", False, pairs)
    # Unskewed REALTIME; the reference's is skewed only under a test-only virtual clock.
    ref = prov.lab.hosts.get(clocks.reference)
    vc = ref.virtual_clock if ref is not None else None

    big = 1 << 62
    w = E.Window(start_ns=-big, end_ns=big, t_center_ns=0, offset_ns=0.0, drift_ppm=0.0, vertices=np.array([[0.0, 0.0]]))
    if vc:
        # θ(t_ref) = router − ref = −(offset + drift·(t − epoch)) to first order
        d = vc.drift_ppm * 1e-6
        w.t_center_ns = int(vc.epoch_realtime_ns or 0)
        w.offset_ns = -float(vc.offset_ns) / (1 + d)
        w.drift_ppm = -vc.drift_ppm / (1 + d)
        w.vertices = np.array([[w.drift_ppm * 1e3, w.offset_ns]])
    h.windows = [w]
    return h


def build(run_dir: Path, use: str = "all") -> TimelineDoc:
    """``place`` a run's records on its timeline and have the run directory
    write the result (timeline.json and .parquet, clock.json, the clock and
    pipeline tables); what timeline.json holds."""
    d = place(run_dir, use)
    RunDir(run_dir).write_derived(d)
    out: TimelineDoc = d.documents["timeline.json"]
    return out


def place(run_dir: Path, use: str = "all") -> Derived:
    """Every record of the run placed on the reference host's clock, with its bound; nothing written."""
    derived = Derived()
    rd = RunDir.open(run_dir)
    run, prov = rd.record(), rd.provenance()
    hosts = list(run.hosts) or ["localhost"]
    files = Files(rd.path)
    clocks = sync.estimate(run, files, use=use)
    out: TimelineDoc = {"hosts": {}, "checks": {}, "notes": []}
    if clocks is None:
        if len(hosts) > 1:
            out["notes"].append("this run has no clock-sync probes: only the first host's records are placed; the others keep t_ns only")
        ref = hosts[0]
    else:
        ref = clocks.reference
        derived.documents["clock.json"] = clocks.summary()
        derived.tables["tables/clock.parquet"] = clocks.series()
        router = _router_clock(files, run, prov, clocks)
        if router is not None:
            clocks.hosts["router"] = router
    out["reference"] = ref
    traces = sync.host_traces(run)
    if run.emulator and clocks is not None and "router" in clocks.hosts:
        traces.setdefault("router", []).append(run.emulator.trace)
    frames = []
    for host, paths in traces.items():
        n = placed = 0
        for rel in paths:
            df = files.trace(rel)
            if df is None or not len(df):
                continue
            t = df["t_ns"].to_numpy()
            if host == ref:
                g, b = t.astype(np.int64), np.zeros(len(t))
            elif clocks is not None and host in clocks.hosts:
                g, b = clocks.map_mono(host, t)
            else:
                g, b = np.zeros(len(t), np.int64), np.full(len(t), np.inf)
            ok = np.isfinite(b)
            frames.append(
                df.select("thread", "tid", "group", "name", "kind", "tag", "t_ns", "dur_ns", "value")
                .with_columns(pl.col("thread").cast(pl.String), pl.col("group").cast(pl.String), pl.col("name").cast(pl.String), pl.col("kind").cast(pl.String))
                .with_columns(
                    pl.lit(host).alias("host"),
                    pl.lit(rel).alias("source"),
                    pl.Series("t_global_ns", np.where(ok, g, 0).astype(np.int64)).alias("t_global_ns"),
                    pl.Series("bound_ns", np.where(ok, b, np.nan)),
                )
                .with_columns(pl.when(pl.Series(ok)).then(pl.col("t_global_ns")).otherwise(None).alias("t_global_ns"))
            )
            n += len(df)
            placed += int(ok.sum())
        out["hosts"][host] = {"records": n, "placed": placed, "not_placed": n - placed}
    tl = pl.concat(frames, how="vertical_relaxed").select(COLUMNS) if frames else pl.DataFrame(schema={c: pl.String for c in COLUMNS})
    derived.tables["timeline.parquet"] = tl
    out["records"] = len(tl)
    if clocks is not None:
        out["checks"]["clocksync"] = _sync_checks(clocks)
        pg, checks = _pipeline(files, run, clocks)
        if pg is not None:
            derived.tables["tables/pipeline_global.parquet"] = pg
        out["checks"]["pipeline"] = checks
        out["clock"] = clocks.summary()
    derived.documents["timeline.json"] = out
    return derived


def _sync_checks(clocks: sync.RunClocks) -> dict[str, SyncCheck]:
    """The probes' own one-way delays on the timeline: none may be negative beyond its bound."""
    res: dict[str, SyncCheck] = {}
    for host, h in clocks.hosts.items():
        if h.is_reference or host == "router" or not len(h.t_lo):
            continue
        # way there: rx_ref − tx_h mapped = −(lo − θ(t)) ; way back: rx_h mapped − tx_ref = up − θ(t)
        th_l, b_l = h.theta(h.t_lo)
        th_u, b_u = h.theta(h.t_up)
        there = th_l - h.lo
        back = h.up - th_u
        res[host] = {
            "there_min_ns": float(np.nanmin(there)) if len(there) else None,
            "back_min_ns": float(np.nanmin(back)) if len(back) else None,
            "negative_beyond_bound": int(np.sum(there < -b_l) + np.sum(back < -b_u)),
        }
    return res


def _pipeline(files: Files, run: RunRecord, clocks: sync.RunClocks) -> tuple[pl.DataFrame | None, list[HopCheck]]:

    frames: list[pl.DataFrame] = []
    checks: list[HopCheck] = []
    for st in run.steps:
        if not st.stages:  # a step whose messages pass through stages (a pipeline's)
            continue
        sink = files.trace(st.trace)
        if sink is None:
            continue
        m = messages_from(sink)
        if not len(m):
            continue
        hosts = [sg.host for sg in st.stages]
        n_nodes = len(hosts) - 2
        cols: dict[str, object] = {"rep": [st.rep] * len(m), "phase": [st.phase] * len(m), "probe": [st.probe] * len(m), "seq": m["seq"].to_numpy()}
        g_prev, b_prev = clocks.map_real(hosts[0], m["sent_rt_ns"].to_numpy())
        cols["sent_global_ns"] = g_prev
        legs = []
        for k in range(n_nodes + 1):
            if k < n_nodes:
                krx_col, h = f"node{k + 1}_krx_rt_ns", hosts[k + 1]
            else:
                krx_col, h = "sink_krx_rt_ns", hosts[-1]
            g_rx, b_rx = clocks.map_real(h, m[krx_col].to_numpy())
            bound = b_rx + b_prev
            net = np.where(np.isfinite(bound), (g_rx - g_prev).astype(np.float64), np.nan)
            cols[f"hop{k}_net_global_ns"] = net
            cols[f"hop{k}_bound_ns"] = bound
            raw = m[f"hop{k}_net_ns"].to_numpy()
            ok = np.isfinite(bound)
            checks.append(
                {
                    "rep": st.rep,
                    "phase": st.phase,
                    "probe": st.probe,
                    "hop": k,
                    "from": hosts[k],
                    "to": hosts[k + 1],
                    "messages": int(ok.sum()),
                    "min_net_ns": float(np.min(net[ok])) if ok.any() else None,
                    "min_raw_ns": float(np.min(raw)) if len(raw) else None,
                    "bound_median_ns": float(np.median(bound[ok])) if ok.any() else None,
                    "negative_beyond_bound": int(np.sum(net[ok] < -bound[ok])),
                }
            )
            legs.append(net)
            if k < n_nodes:
                # the node's residence, kernel RX to send, on its own clock mapped
                g_t, b_t = clocks.map_real(h, m[f"node{k + 1}_utx_rt_ns"].to_numpy())
                cols[f"node{k + 1}_krx_global_ns"] = g_rx
                legs.append(g_t - g_rx)
                g_prev, b_prev = g_t, b_t
        g_sink, _ = clocks.map_real(hosts[-1], m["sink_urx_rt_ns"].to_numpy())
        legs.append(g_sink - g_rx)
        cols["sink_global_ns"] = g_sink
        if hosts[0] == hosts[-1]:
            # a loop: the round trip on the source's one clock against the sum of its legs on the timeline
            one_clock = m["e2e_ns"].to_numpy().astype(np.float64)
            d = np.sum(legs, axis=0) - one_clock
            checks.append(
                {
                    "rep": st.rep,
                    "phase": st.phase,
                    "probe": st.probe,
                    "round_trip": True,
                    "messages": len(d),
                    "max_abs_diff_ns": float(np.nanmax(np.abs(d))) if len(d) else None,
                }
            )
        frames.append(pl.DataFrame(cols))
    return (pl.concat(frames, how="diagonal_relaxed") if frames else None), checks


def _f(x: float | None) -> str:
    return "?" if x is None else f"{x:+.3f}"


def _s(ns: float | None) -> str:
    if ns is None:
        return "?"
    return f"{ns / 1e9:+.9f} s" if abs(ns) >= 1e8 else f"{ns / 1e6:+.6f} ms"


def summary_lines(out: TimelineDoc) -> list[str]:
    """What a reader needs first: each host's offset, drift and bound, then anything wrong."""

    lines = [f"global clock: CLOCK_MONOTONIC of {out['reference']}; {out['records']:,} records"]
    clock = out.get("clock")
    nowhere: Placed = {"records": 0, "placed": 0, "not_placed": 0}
    for host, h in (clock["hosts"] if clock else {}).items():
        placed = out["hosts"].get(host, nowhere)
        if h["reference"]:
            lines.append(f"  {host}: the reference")
            continue
        if host == "router":
            lines.append(f"  router (the link emulator): shares the hosts' kernel and CLOCK_REALTIME; {placed.get('placed', 0):,} records placed")
            continue
        ok = [w for w in h["windows"] if w["offset_ns"] is not None]
        if ok:
            w = ok[len(ok) // 2]
            bmax = max((x["bound_max_ns"] or 0) for x in ok)
            p = h["probes"]
            lines.append(
                f"  {host}: CLOCK_MONOTONIC {_s(w['monotonic_offset_ns'])}, CLOCK_REALTIME {_s(w['offset_ns'])} from the reference's; drift {w['drift_ppm']:+.3f} ppm [{_f(w['drift_lo_ppm'])}, {_f(w['drift_hi_ppm'])}], "
                f"bound ±{format_ns(w['bound_mid_ns'] or 0)} (max {format_ns(bmax)}) over {len(ok)} window(s); "
                f"{p.get('used_there', 0) + p.get('used_back', 0):,} probes, {p.get('lost_there', 0) + p.get('lost_back', 0)} lost, best round trip {format_ns(p.get('min_rtt_ns') or 0)}"
            )
        else:
            lines.append(f"  {host}: not placed")
        if placed.get("not_placed"):
            lines.append(f"    {placed['not_placed']:,} of {placed['records']:,} records could not be placed")
        for pr in h["problems"]:
            lines.append(f"    ! {pr}")
    for note in out.get("notes") or []:
        lines.append(f"  ! {note}")
    checks = out.get("checks") or {}
    for c in checks.get("pipeline") or []:
        if c.get("negative_beyond_bound"):
            lines.append(
                f"  ! {c['probe']} hop {c['hop']} ({c['from']} → {c['to']}, {c['phase']}): {c['negative_beyond_bound']} messages arrive before they left by more than the bound"
            )
        if c.get("round_trip") and c.get("max_abs_diff_ns") is not None:
            lines.append(
                f"  {c['probe']} ({c['phase']}, rep {c['rep']}): round trip on one clock vs its legs on the timeline differ by at most {format_ns(c['max_abs_diff_ns'] or 0)}"
            )
    for host, sc in (checks.get("clocksync") or {}).items():
        if sc["negative_beyond_bound"]:
            lines.append(f"  ! {host}: {sc['negative_beyond_bound']} clock-sync probes arrive before they left by more than the bound")
    return lines
