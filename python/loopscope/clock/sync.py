"""A run's clocks: every host's CLOCK_MONOTONIC mapped onto the reference's.

Three links make the chain for a record stamped ``t_ns`` on host h:

1. h's CLOCK_MONOTONIC → h's CLOCK_REALTIME, from the calibration pairs
   every trace of h logs once a second (paired reads, each with the
   half-width of its read window); piecewise-linear between pairs. Time
   namespaces shift only the first clock, so this link carries the
   namespace offset.
2. h's CLOCK_REALTIME → the reference's, from the clock-sync probes' kernel
   stamps (``estimate``): θ(t) per window, with its bound.
3. the reference's CLOCK_REALTIME → its CLOCK_MONOTONIC (its own pairs),
   the global clock of the run.

The bound of a mapped time is the bound of θ there plus the read windows
of the two pairs used. The probes are joined on (flow, seq, idx) between
the host's initiator trace and the reference's responder trace.

Coded pairs: a pair whose gap changed on the way by more than
``gap_tolerance_ns`` had one probe queued. Every probe's bound is valid
whether it queued or not (queueing only loosens it), and the estimator
depends only on the tightest bounds, so by default all probes are used and
the share of pure pairs is reported as a measure of the queueing on the
path. ``use="pairs"`` keeps only pure pairs (the classic filter), which is
worse behind a software forwarder: there the first probe of a pair wakes
the forwarder and the second rides along, so the fastest probes are exactly
the ones whose gap shrank (measured through the link emulator: p99 offset
error 18 µs with pure pairs only, 1.4 µs with all probes; docs/clock.md).
Steps of CLOCK_REALTIME (a jump of REALTIME − MONOTONIC between
consecutive pairs beyond what a 500 ppm slew explains) are listed with
their time, and the windows around them are not trusted.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from pathlib import Path

from typing_extensions import TypedDict

import numpy as np
import polars as pl

from loopscope.clock import estimate as E
from loopscope.trace.files import Files
from loopscope.trace.reader import CalPair
from loopscope.rundir import HubStep, ProcessStep, RunDir, RunRecord, StageStep

GAP_TOLERANCE_NS = 4_000
MIN_PURE = 20


def _payloads(df: pl.DataFrame, name: str) -> np.ndarray:
    ev = df.filter((pl.col("group").cast(pl.String) == "clocksync") & (pl.col("name").cast(pl.String) == name))
    p = [x for x in ev["payload"].to_list() if x is not None and len(x) == 40]
    if not p:
        return np.zeros((0, 5), dtype=np.int64)
    return np.frombuffer(b"".join(p), dtype="<i8").reshape(len(p), 5).copy()


class ClockStep(TypedDict):
    """CLOCK_REALTIME stepped between two calibration pairs."""

    after_mono_ns: int
    before_mono_ns: int
    step_ns: int


class ProbeCounts(TypedDict, total=False):
    """What became of a host's clock-sync probes (``sent`` only: none were read)."""

    sent: int
    reached_reference: int
    answered: int
    lost_there: int
    lost_back: int
    pure_there: int
    pure_back: int
    used_there: int
    used_back: int
    used: str
    min_rtt_ns: int | None


class WindowSummary(TypedDict):
    start_realtime_ns: int
    end_realtime_ns: int
    status: str
    offset_ns: float | None
    monotonic_offset_ns: float | None
    at_realtime_ns: int
    drift_ppm: float | None
    drift_lo_ppm: float | None
    drift_hi_ppm: float | None
    bound_mid_ns: float | None
    bound_max_ns: float | None
    margin_ns: float | None
    lower_bounds: int
    upper_bounds: int


class HostSummary(TypedDict):
    reference: bool
    windows: list[WindowSummary]
    probes: ProbeCounts
    problems: list[str]
    clock_steps: list[ClockStep]
    calibration_pairs: int
    pair_read_error_ns_median: float | None


class ClockSummary(TypedDict):
    """clock.json, and the ``clock`` part of timeline.json."""

    reference: str
    gap_tolerance_ns: int
    probes_used: str
    hosts: dict[str, HostSummary]


@dataclass
class Pairs:
    """Calibration pairs of one host: CLOCK_MONOTONIC ↔ CLOCK_REALTIME."""

    mono: np.ndarray
    real: np.ndarray
    err: np.ndarray
    steps: list[ClockStep] = field(default_factory=list)

    @classmethod
    def of(cls, cals: list[CalPair]) -> "Pairs":
        if not cals:
            return cls(np.zeros(0, np.int64), np.zeros(0, np.int64), np.zeros(0, np.int64))
        a = np.array([(c["mono_ns"], c["realtime_ns"], c["realtime_err_ns"]) for c in cals], dtype=np.int64)
        a = a[np.argsort(a[:, 0], kind="stable")]
        _, first = np.unique(a[:, 0], return_index=True)
        a = a[first]
        p = cls(a[:, 0], a[:, 1], a[:, 2])
        p.steps = p._find_steps()
        return p

    def _find_steps(self) -> list[ClockStep]:
        if len(self.mono) < 2:
            return []
        off = self.real - self.mono
        d = np.diff(off)
        allow = 500e-6 * np.diff(self.mono) + self.err[1:] + self.err[:-1] + 1000
        out: list[ClockStep] = []
        for i in np.flatnonzero(np.abs(d) > allow):
            out.append({"after_mono_ns": int(self.mono[i]), "before_mono_ns": int(self.mono[i + 1]), "step_ns": int(d[i])})
        return out

    def real_of(self, mono: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
        """REALTIME (int64 ns) at these MONOTONIC times, and the read error of the pair used.

        Integer arithmetic throughout: a REALTIME value in float64 is only
        good to 256 ns. The offset REALTIME − MONOTONIC is interpolated
        between pairs (it changes only when REALTIME is slewed or stepped)."""
        m = np.asarray(mono).astype(np.int64)
        if not len(self.mono):
            return np.zeros(m.shape, np.int64), np.full(m.shape, np.inf)
        off = self.real - self.mono
        base = off[0]
        o = np.interp((m - self.mono[0]).astype(np.float64), (self.mono - self.mono[0]).astype(np.float64), (off - base).astype(np.float64))
        e = self.err[np.clip(np.searchsorted(self.mono, m), 0, len(self.mono) - 1)].astype(np.float64)
        return m + base + np.rint(o).astype(np.int64), e

    def mono_of(self, real: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
        """MONOTONIC (int64 ns) at these REALTIME times, and the pair's read error."""
        r = np.asarray(real).astype(np.int64)
        if not len(self.mono):
            return np.zeros(r.shape, np.int64), np.full(r.shape, np.inf)
        order = np.argsort(self.real, kind="stable")
        rs = self.real[order]
        off = (self.real - self.mono)[order]
        base = off[0]
        o = np.interp((r - rs[0]).astype(np.float64), (rs - rs[0]).astype(np.float64), (off - base).astype(np.float64))
        e = self.err[order][np.clip(np.searchsorted(rs, r), 0, len(self.mono) - 1)].astype(np.float64)
        return r - base - np.rint(o).astype(np.int64), e


@dataclass
class HostClock:
    host: str
    is_reference: bool
    pairs: Pairs
    windows: list[E.Window] = field(default_factory=list)
    counts: ProbeCounts = field(default_factory=lambda: ProbeCounts())
    problems: list[str] = field(default_factory=list)
    # lower/upper bounds used (for the report and for validation)
    t_lo: np.ndarray = field(default_factory=lambda: np.zeros(0, np.int64))
    lo: np.ndarray = field(default_factory=lambda: np.zeros(0, np.int64))
    t_up: np.ndarray = field(default_factory=lambda: np.zeros(0, np.int64))
    up: np.ndarray = field(default_factory=lambda: np.zeros(0, np.int64))
    exchanges: pl.DataFrame | None = None  # one row per probe: tx_h, rx_ref, tx_ref, rx_h

    def theta(self, real_ref: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
        """θ = this host's REALTIME − the reference's, at reference times, with bound."""
        r = np.asarray(real_ref, dtype=np.int64)
        if self.is_reference:
            return np.zeros(r.shape), np.zeros(r.shape)
        th, b, _ = E.evaluate(self.windows, r)
        return th, b

    def real_to_ref(self, real: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
        """This host's REALTIME values (int64) on the reference's REALTIME (int64), with bound
        (infinite where the host's clock has no estimate; the time is then meaningless)."""
        r = np.asarray(real).astype(np.int64)
        if self.is_reference:
            return r, np.zeros(r.shape)
        th, _ = self.theta(r)
        t_ref = r - np.rint(np.nan_to_num(th)).astype(np.int64)
        th, b = self.theta(t_ref)
        bad = ~np.isfinite(th)
        out = r - np.rint(np.nan_to_num(th)).astype(np.int64)
        b = np.where(bad, np.inf, b)
        return out, b


@dataclass
class RunClocks:
    reference: str
    hosts: dict[str, HostClock]
    gap_tolerance_ns: int
    use: str = "all"

    def map_mono(self, host: str, t_ns: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
        """Host CLOCK_MONOTONIC ns → global ns (the reference's CLOCK_MONOTONIC), bound ns."""
        t = np.asarray(t_ns).astype(np.int64)
        if host == self.reference:
            return t, np.zeros(t.shape)
        h, ref = self.hosts[host], self.hosts[self.reference]
        r, e1 = h.pairs.real_of(t)
        rr, b = h.real_to_ref(r)
        g, e2 = ref.pairs.mono_of(rr)
        return g, b + e1 + e2

    def map_real(self, host: str, r_ns: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
        """Host CLOCK_REALTIME (kernel stamps) → global ns, bound ns."""
        rr, b = self.hosts[host].real_to_ref(np.asarray(r_ns).astype(np.int64))
        g, e = self.hosts[self.reference].pairs.mono_of(rr)
        return g, b + e

    def summary(self) -> ClockSummary:
        out: ClockSummary = {"reference": self.reference, "gap_tolerance_ns": self.gap_tolerance_ns, "probes_used": self.use, "hosts": {}}
        ref = self.hosts[self.reference]
        for name, h in self.hosts.items():
            ws: list[WindowSummary] = []
            for w in h.windows:
                ts = np.linspace(w.start_ns, w.end_ns, 9).astype(np.int64)
                b = w.bound(ts) if w.offset_ns is not None else np.full(ts.shape, np.inf)
                mono_off = None
                if w.offset_ns is not None and len(h.pairs.mono) and len(ref.pairs.mono):
                    # what the records see: the host's CLOCK_MONOTONIC minus the global clock at the window's centre
                    hm, _ = h.pairs.mono_of(np.array([w.t_center_ns + int(round(w.offset_ns))]))
                    rm, _ = ref.pairs.mono_of(np.array([w.t_center_ns]))
                    mono_off = float(hm[0] - rm[0])
                ws.append(
                    {
                        "start_realtime_ns": w.start_ns,
                        "end_realtime_ns": w.end_ns,
                        "status": w.status,
                        "offset_ns": w.offset_ns,
                        "monotonic_offset_ns": mono_off,
                        "at_realtime_ns": w.t_center_ns,
                        "drift_ppm": w.drift_ppm,
                        "drift_lo_ppm": w.drift_lo_ppm,
                        "drift_hi_ppm": w.drift_hi_ppm,
                        "bound_mid_ns": float(w.bound(np.array([w.t_center_ns]))[0]) if w.offset_ns is not None else None,
                        "bound_max_ns": float(b.max()) if np.isfinite(b).all() else None,
                        "margin_ns": w.margin_ns,
                        "lower_bounds": w.n_lower,
                        "upper_bounds": w.n_upper,
                    }
                )
            out["hosts"][name] = {
                "reference": h.is_reference,
                "windows": ws,
                "probes": h.counts,
                "problems": h.problems,
                "clock_steps": h.pairs.steps,
                "calibration_pairs": int(len(h.pairs.mono)),
                "pair_read_error_ns_median": float(np.median(h.pairs.err)) if len(h.pairs.err) else None,
            }
        return out

    def series(self) -> pl.DataFrame:
        """θ and its bound per host at every probe time used (for charts)."""
        rows = []
        for name, h in self.hosts.items():
            if h.is_reference or not h.windows:
                continue
            t = np.unique(np.concatenate([h.t_lo, h.t_up]))
            th, b = h.theta(t)
            g, _ = self.hosts[self.reference].pairs.mono_of(t)
            ok = np.isfinite(th)
            rows.append(pl.DataFrame({"host": [name] * int(ok.sum()), "t_global_ns": g[ok], "offset_ns": th[ok], "bound_ns": b[ok]}))
        return pl.concat(rows) if rows else pl.DataFrame(schema={"host": pl.String, "t_global_ns": pl.Int64, "offset_ns": pl.Float64, "bound_ns": pl.Float64})


def _join(init: np.ndarray, serve: np.ndarray, flow: int) -> pl.DataFrame:
    """One row per probe: tx_h, rx_ref (the way there), tx_ref, rx_h (the way back)."""
    a = pl.DataFrame({"seq": init[:, 0], "idx": init[:, 1], "tx_h": init[:, 3], "rx_h": init[:, 4]})
    s = serve[serve[:, 0] == flow]
    b = pl.DataFrame({"seq": s[:, 1], "idx": s[:, 2], "rx_ref": s[:, 3], "tx_ref": s[:, 4]})
    return a.join(b, on=["seq", "idx"], how="left").sort("seq", "idx")


def _pure(df: pl.DataFrame, tol: int) -> pl.DataFrame:
    """Flag the probes of pairs whose gap survived each way."""
    w = df.pivot(on="idx", index="seq", values=["tx_h", "rx_ref", "tx_ref", "rx_h"])
    need = ["tx_h_0", "tx_h_1", "rx_ref_0", "rx_ref_1", "tx_ref_0", "tx_ref_1", "rx_h_0", "rx_h_1"]
    for c in need:
        if c not in w.columns:
            w = w.with_columns(pl.lit(None, dtype=pl.Int64).alias(c))

    def ok(c: str) -> pl.Expr:
        return pl.col(c).is_not_null() & (pl.col(c) != 0)

    w = w.with_columns(
        (
            ok("tx_h_0")
            & ok("tx_h_1")
            & ok("rx_ref_0")
            & ok("rx_ref_1")
            & (((pl.col("rx_ref_1") - pl.col("rx_ref_0")) - (pl.col("tx_h_1") - pl.col("tx_h_0"))).abs() <= tol)
        )
        .fill_null(False)
        .alias("fwd_pure"),
        (
            ok("tx_ref_0")
            & ok("tx_ref_1")
            & ok("rx_h_0")
            & ok("rx_h_1")
            & (((pl.col("rx_h_1") - pl.col("rx_h_0")) - (pl.col("tx_ref_1") - pl.col("tx_ref_0"))).abs() <= tol)
        )
        .fill_null(False)
        .alias("bwd_pure"),
    )
    return df.join(w.select("seq", "fwd_pure", "bwd_pure"), on="seq", how="left").with_columns(
        pl.col("fwd_pure").fill_null(False), pl.col("bwd_pure").fill_null(False)
    )


def _min_rtt(df: pl.DataFrame) -> int | None:
    ok = df.filter((pl.col("tx_h") != 0) & (pl.col("rx_h") != 0))
    return int((ok["rx_h"] - ok["tx_h"]).min()) if len(ok) else None  # type: ignore[arg-type]


def host_traces(run: RunRecord) -> dict[str, list[str]]:
    """Every trace of the run, by the host that wrote it."""
    out: dict[str, list[str]] = {}
    for st in run.steps:
        if st.host and st.trace:
            out.setdefault(st.host, []).append(st.trace)
        parts: list[StageStep | ProcessStep | HubStep] = [*(st.stages or []), *(st.processes or [])[1:], *(st.hubs or [])]
        for sg in parts:
            out.setdefault(sg.host, []).append(sg.trace)
    cs = run.clocksync
    if cs is not None and cs.responder is not None:
        out.setdefault(cs.responder.host or cs.reference, []).append(cs.responder.trace)
    for h, i in (cs.initiators if cs is not None else {}).items():
        out.setdefault(h, []).append(i.trace)
    return out


def estimate_run(
    run_dir: Path, *, use: str = "all", gap_tolerance_ns: int = GAP_TOLERANCE_NS, min_window_s: float = 2.0, max_window_s: float = 120.0
) -> RunClocks | None:
    """``estimate`` of the run in ``run_dir`` (opened here)."""
    return estimate(RunDir(run_dir).record(), Files(run_dir), use=use, gap_tolerance_ns=gap_tolerance_ns, min_window_s=min_window_s, max_window_s=max_window_s)


def estimate(
    run: RunRecord, files: Files, *, use: str = "all", gap_tolerance_ns: int = GAP_TOLERANCE_NS, min_window_s: float = 2.0, max_window_s: float = 120.0
) -> RunClocks | None:
    """Every host's clock against the reference, from the traces ``files``
    holds; None for a run without clock-sync probes."""
    cs = run.clocksync
    if cs is None or cs.responder is None:
        return None
    ref = cs.reference
    traces = host_traces(run)
    clocks: dict[str, HostClock] = {}
    for host in run.hosts:
        cals: list[CalPair] = []
        for t in traces.get(host, []):
            inf = files.info(t)  # a damaged trace costs its pairs only
            if inf is not None:
                cals += inf.calibration
        clocks[host] = HostClock(host, host == ref, Pairs.of(cals))
        if not cals:
            clocks[host].problems.append("no calibration pairs: no trace of this host could be read, so its records cannot be placed")
        for s in clocks[host].pairs.steps:
            clocks[host].problems.append(
                f"CLOCK_REALTIME stepped by {s['step_ns'] / 1e6:+.3f} ms between monotonic {s['after_mono_ns']} and {s['before_mono_ns']} ns: records around it are placed with the windows on each side"
            )
    served = files.trace(cs.responder.trace)
    serve = _payloads(served, "serve") if served is not None else np.zeros((0, 5), np.int64)
    for host, ini in cs.initiators.items():
        hc = clocks[host]
        sent_by = files.trace(ini.trace)
        init = _payloads(sent_by, "probe") if sent_by is not None else np.zeros((0, 5), np.int64)
        if not len(init):
            hc.problems.append(f"no clock-sync probes from {host}: its records cannot be placed on the global clock")
            hc.counts = {"sent": 0}
            continue
        df = _pure(_join(init, serve, int(ini.flow or 0)), gap_tolerance_ns)
        hc.exchanges = df
        sent = len(df)
        answered = int((df["rx_h"] != 0).sum())
        reached = int(df["rx_ref"].is_not_null().sum())
        fwd = df.filter(pl.col("rx_ref").is_not_null() & (pl.col("tx_h") != 0) & (pl.col("rx_ref") != 0))
        bwd = df.filter(pl.col("rx_ref").is_not_null() & (pl.col("tx_ref") != 0) & (pl.col("rx_h") != 0))
        nf, nb = int(fwd["fwd_pure"].sum()), int(bwd["bwd_pure"].sum())
        used = "all probes"
        if use == "pairs":
            if nf >= MIN_PURE and nb >= MIN_PURE:
                fwd, bwd = fwd.filter(pl.col("fwd_pure")), bwd.filter(pl.col("bwd_pure"))
                used = "pure pairs"
            else:
                used = "all probes (too few pure pairs)"
                hc.problems.append(f"only {nf} + {nb} probes in pairs that kept their gap (of {len(fwd)} + {len(bwd)}): the estimate uses every probe")
        hc.counts = {
            "sent": sent,
            "reached_reference": reached,
            "answered": answered,
            "lost_there": sent - reached,
            "lost_back": reached - answered,
            "pure_there": nf,
            "pure_back": nb,
            "used_there": len(fwd),
            "used_back": len(bwd),
            "used": used,
            "min_rtt_ns": _min_rtt(df),
        }
        if sent and reached < sent * 0.5:
            hc.problems.append(f"{sent - reached} of {sent} probes from {host} never reached the reference")
        hc.t_lo = fwd["rx_ref"].to_numpy()
        hc.lo = (fwd["tx_h"] - fwd["rx_ref"]).to_numpy()
        hc.t_up = bwd["tx_ref"].to_numpy()
        hc.up = (bwd["rx_h"] - bwd["tx_ref"]).to_numpy()
        if len(hc.lo) < 3 or len(hc.up) < 3:
            hc.problems.append(f"too few probes came back from {host} ({len(hc.lo)} there, {len(hc.up)} back): no estimate")
            continue
        hc.windows = E.fit(hc.t_lo, hc.lo, hc.t_up, hc.up, min_window_s=min_window_s, max_window_s=max_window_s)
        for w in hc.windows:
            if w.offset_ns is None:
                hc.problems.append(
                    f"no estimate from REALTIME {w.start_ns} to {w.end_ns} ({(w.end_ns - w.start_ns) / 1e9:.1f} s): {w.status}; records in that window are not placed"
                )
    return RunClocks(ref, clocks, gap_tolerance_ns, use)
