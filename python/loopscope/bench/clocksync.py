"""``loopscope bench clocksync``: how well does the timeline place records, and does its bound hold?

Three netns hosts on this machine, a the reference; b and c carry injected
clock errors that the probes must find: a time namespace shifts their
CLOCK_MONOTONIC (+1.5 s, −0.7 s) and the test-only virtual clock skews
every timestamp their processes produce, kernel packet stamps included
(+3 ms at +20 ppm, −1.2 ms at −35 ppm). Each condition is one ``loopscope
run`` of ``seconds`` (60 by default: the drift target is over a 60 s run):

- **idle**: the probes alone (and a timer probe on b);
- **load**: a CPU load on every host (three busy processes on two cores)
  and two 200 Mbit/s UDP streams b → a and c → a through the router.

Each condition runs on both networks the probes can take
(``clocksync.network``): ``sync``, a veth of their own from each host to
the reference, and ``experiment``, the hosts' network through the router
that the loads also cross. Every row says which.

Then ``loopscope timeline`` and, per host, the mapped global time of 600
instants spread over the run against the truth (undo the host's namespace
offset and virtual clock, apply the reference's): the error's p50/p99/max,
the reported bound (median; ``bound_holds`` when every error lies within
its own bound) and the drift error. The baseline on the same probes is
NTP's clock filter: in each run of eight exchanges, the offset of the one
with the smallest round trip, held until the next ``ntp_err_*``.
"""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path
from typing import Callable

from typing_extensions import TypedDict

import numpy as np

from loopscope.errors import RunError
from loopscope.clock.sync import HostClock, ProbeCounts
from loopscope.rundir import RunDir, VirtualClock
import polars as pl
from loopscope.clock import sync, validate
from loopscope.timeline import build
from loopscope.units import format_ns
from loopscope.host import scratch

HOSTS = """hosts:
  - {name: a}
  - {name: b, clock_offset: 1.5s, virtual_clock: {offset: 3ms, drift_ppm: 20}}
  - {name: c, clock_offset: -700ms, virtual_clock: {offset: -1200us, drift_ppm: -35}}
"""

IDLE = """name: bench-clocksync-idle
{hosts}clocksync: {{network: {network}}}
probes:
  - {{kind: timer, host: b, interval_us: 1000}}
baseline: true
duration: {seconds}s
"""

LOAD = """name: bench-clocksync-load
{hosts}clocksync: {{network: {network}}}
probes:
  - {{kind: timer, host: b, interval_us: 1000}}
loads:
  - {{name: cpu-a, kind: cpu, host: a, level: 1}}
  - {{name: cpu-b, kind: cpu, host: b, level: 1}}
  - {{name: cpu-c, kind: cpu, host: c, level: 1}}
  - {{name: net-b, kind: net, host: b, dest: "a:9000", rate: 200Mbit, size: 1400}}
  - {{name: net-c, kind: net, host: c, dest: "a:9001", rate: 200Mbit, size: 1400}}
phases:
  - {{name: load, loads: [cpu-a, cpu-b, cpu-c, net-b, net-c]}}
duration: {seconds}s
"""


def _ntp_filter(h: HostClock, t_eval: np.ndarray) -> np.ndarray:
    """θ by NTP's clock filter: in each run of eight complete exchanges (probe
    there, answer back), the offset of the one with the smallest round trip."""

    if h.exchanges is None:
        return np.full(t_eval.shape, np.nan)
    x = h.exchanges.filter(
        (pl.col("tx_h") != 0) & (pl.col("rx_h") != 0) & pl.col("rx_ref").is_not_null() & (pl.col("rx_ref") != 0) & (pl.col("tx_ref") != 0)
    ).sort("rx_ref")
    n = len(x)
    if n < 8:
        return np.full(t_eval.shape, np.nan)
    tx_h, rx_ref, tx_ref, rx_h = (x[c].to_numpy().astype(np.float64) for c in ("tx_h", "rx_ref", "tx_ref", "rx_h"))
    rtt = (rx_h - tx_h) - (tx_ref - rx_ref)
    theta = ((tx_h - rx_ref) + (rx_h - tx_ref)) / 2
    est_t, est_v = [], []
    for k in range(0, n - 7, 8):
        j = k + int(np.argmin(rtt[k : k + 8]))
        est_t.append(rx_ref[k + 7])
        est_v.append(theta[j])
    idx = np.clip(np.searchsorted(np.array(est_t), t_eval, side="right") - 1, 0, len(est_t) - 1)
    return np.array(est_v)[idx]


class ClockRow(TypedDict):
    """One skewed host under one condition: the estimate's error against the
    truth the bench injected, its bound, and NTP's filter on the same probes."""

    condition: str
    host: str
    network: str
    true_offset_ns: float
    true_drift_ppm: float
    err_p50_ns: float | None
    err_p99_ns: float | None
    err_max_ns: float | None
    drift_err_ppm: float | None
    bound_ns: float | None
    bound_max_ns: float | None
    bound_holds: bool
    realtime_err_p99_ns: float | None
    ntp_err_p50_ns: float | None
    ntp_err_p99_ns: float | None
    probes: ProbeCounts
    windows: int
    points: int
    not_placed: int
    seconds: float


class ClocksyncBench(TypedDict):
    """What ``loopscope bench clocksync --json`` prints."""

    rows: list[ClockRow]
    context: dict[str, float | str | list[str]]


def condition(name: str, text: str, work: Path, seconds: float, network: str = "sync") -> list[ClockRow]:

    tag = f"{name}-{network}"
    (work / f"{tag}.yaml").write_text(text)
    r = subprocess.run(
        [sys.executable, "-m", "loopscope.cli", "run", f"{tag}.yaml", "--run-dir", tag, "--no-report"],
        cwd=work,
        capture_output=True,
        text=True,
        timeout=seconds + 300,
    )
    if r.returncode != 0:
        raise RunError(f"bench clocksync: the {name} run on the {network} network failed: {r.stderr.strip()[-600:]}")
    run_dir = work / tag
    cs = RunDir(run_dir).record().clocksync
    used = {h: i.network for h, i in cs.initiators.items()} if cs else {}
    build(run_dir)
    clocks = sync.estimate_run(run_dir)
    if clocks is None:
        raise RunError(f"bench clocksync: the {name} run has no clock-sync probes")
    truth = validate.Truth.of_run(run_dir)
    rows: list[ClockRow] = []
    for host, h in clocks.hosts.items():
        if h.is_reference or host == "router":
            continue
        m = h.pairs.mono
        grid = np.linspace(m.min() + 0.5e9, m.max() - 0.5e9, 600).astype(np.int64) if len(m) > 1 else m
        e = validate.errors(run_dir, clocks, truth, host, grid)
        good = [w for w in h.windows if w.drift_ppm is not None]
        span = sum(w.end_ns - w.start_ns for w in good)
        drift = sum((w.drift_ppm or 0.0) * (w.end_ns - w.start_ns) for w in good) / span if span else None
        # the truth of θ (REALTIME domain) drifts at the skew's rate against the reference's
        true_drift = truth.drift_ppm(host)
        # NTP's clock filter on the same exchanges, compared in the REALTIME domain
        vc = truth.hosts[host].virtual_clock or VirtualClock()
        t_eval = np.unique(np.concatenate([h.t_lo, h.t_up]))
        true_theta = vc.offset_ns + vc.drift_ppm * 1e-6 * (t_eval - float(vc.epoch_realtime_ns or 0))
        ntp = np.abs(_ntp_filter(h, t_eval) - true_theta)
        ntp = ntp[np.isfinite(ntp)]
        th, _ = h.theta(t_eval)
        own = np.abs(th - true_theta)
        rows.append(
            {
                "condition": f"{name}/{host}",
                "host": host,
                "network": used.get(host) or network,
                "true_offset_ns": truth.offset_ns(host),
                "true_drift_ppm": true_drift,
                "err_p50_ns": e["err_p50_ns"],
                "err_p99_ns": e["err_p99_ns"],
                "err_max_ns": e["err_max_ns"],
                "drift_err_ppm": abs(drift - true_drift) if drift is not None else None,
                "bound_ns": e["bound_ns"],
                "bound_max_ns": e["bound_max_ns"],
                "bound_holds": e["bound_holds"],
                "realtime_err_p99_ns": float(np.percentile(own[np.isfinite(own)], 99)) if np.isfinite(own).any() else None,
                "ntp_err_p50_ns": float(np.percentile(ntp, 50)) if len(ntp) else None,
                "ntp_err_p99_ns": float(np.percentile(ntp, 99)) if len(ntp) else None,
                "probes": h.counts,
                "windows": len(h.windows),
                "points": e["n"],
                "not_placed": e["not_placed"],
                "seconds": seconds,
            }
        )
    return rows


NETWORKS = ("sync", "experiment")


def run(
    *, quick: bool = False, seconds: float | None = None, networks: tuple[str, ...] = NETWORKS, progress: Callable[[str], None] | None = None
) -> ClocksyncBench:
    if not (hasattr(__import__("os"), "geteuid") and __import__("os").geteuid() == 0):
        raise RunError("bench clocksync needs root: it runs netns hosts with time namespaces")
    say = progress or (lambda s: None)
    secs = seconds or (10.0 if quick else 60.0)
    rows: list[ClockRow] = []
    with scratch.directory("bench-clock") as d:
        work = Path(d)
        for network in networks:
            for name, tmpl in (("idle", IDLE), ("load", LOAD)):
                say(f"  {name} on the {network} network: three hosts, b and c with injected offsets and drifts, {secs:g} s …")
                rows += condition(name, tmpl.format(hosts=HOSTS, seconds=f"{secs:g}", network=network), work, secs, network)
    return {"rows": rows, "context": {"seconds": secs, "hosts": HOSTS.strip(), "networks": list(networks)}}


def _ns(x: float | None) -> str:

    return format_ns(x) if x is not None else "n/a"


def _ppm(x: float | None) -> str:
    return f"{x:.4f} ppm" if x is not None else "n/a"


def print_human(r: ClocksyncBench) -> None:

    print(f"clock sync, {r['context']['seconds']:g} s per condition; error = mapped − true global time of 600 instants per host")
    for x in r["rows"]:
        print(
            f"  {x['network']:10s} {x['condition']:8s} true {x['true_offset_ns'] / 1e9:+.6f} s at {x['true_drift_ppm']:+g} ppm: "
            f"error p50 {_ns(x['err_p50_ns'])}, p99 {_ns(x['err_p99_ns'])}, max {_ns(x['err_max_ns'])}; "
            f"bound {_ns(x['bound_ns'])} (holds: {x['bound_holds']}); drift error {_ppm(x['drift_err_ppm'])}; "
            f"NTP filter p99 {format_ns(x['ntp_err_p99_ns'] or 0)}"
        )
    print(json.dumps({"probes": {f"{x['network']}:{x['condition']}": x["probes"] for x in r["rows"]}}))
