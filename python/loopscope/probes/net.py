"""Network probes: front ends of ``crates/probes/src/net``.

``send`` paces UDP packets on absolute deadlines and says whether it kept
up; ``recv`` counts, orders and times what arrives with kernel timestamps;
``echo`` and ``rr`` measure request/response exchanges; ``bulk`` pushes a TCP
or UDP stream as competing load. Rates are payload bits (the UDP payload,
as iperf3 counts) or packets per second. Every delay is reported from a
fixed-memory histogram whose bucket width (1.6 %) is the figure's error, and
every packet also goes into the trace unless ``records`` is off.
"""

from __future__ import annotations

import math
import os
import sys
import socket as _socket
from dataclasses import dataclass, field
from collections.abc import Mapping
from typing import TYPE_CHECKING, Any


import numpy as np

from loopscope import _native
from loopscope.rundir import HistQuantiles
from loopscope.stats import summarize
from loopscope.errors import InputError
from loopscope.probes.common import envelope, traced
from loopscope.probes.params import EchoParams, Launch, RrParams
from loopscope.units import format_bps, parse_rate
from loopscope.probes.netjson import Spread, SendJson, RecvJson, RrJson, EchoJson

if TYPE_CHECKING:
    from loopscope._native import _RecvRun as RecvRun

HEADER = 48


# ---- parsing ------------------------------------------------------------------------


@dataclass(frozen=True)
class Rate:
    """A rate as packets per second num/den (exact for bit rates) and, for
    bit rates, the bits per second."""

    pps_num: int
    pps_den: int
    bps: float | None

    @property
    def pps(self) -> float:
        return self.pps_num / self.pps_den


def rate(text: str, size: int, option: str = "--rate") -> Rate:
    try:
        v, kind = parse_rate(text)
    except ValueError as e:
        raise InputError(f"{option}: {e}") from None
    if kind == "pps":
        num, den = _fraction(v)
        return Rate(num, den, None)
    # bits per second -> packets per second = bps / (size * 8), kept exact.
    num, den = _fraction(v)
    return Rate(num, den * size * 8, v)


def _fraction(v: float) -> tuple[int, int]:
    den = 1
    while v != int(v) and den < 10**6:
        v *= 10
        den *= 10
    return int(round(v)), den


@dataclass(frozen=True)
class PatternSpec:
    name: str
    seed: int = 1
    on_ns: int = 0
    off_ns: int = 0
    replay: str | None = None


def pattern(text: str, seed: int = 1) -> PatternSpec:
    """cbr | poisson | onoff[:ON/OFF] | replay:FILE."""
    from loopscope.units import parse_duration_ns

    t = text.strip()
    if t in ("cbr", "poisson"):
        return PatternSpec(t, seed)
    if t.startswith("onoff"):
        spec = t[5:].lstrip(":") or "100ms/100ms"
        try:
            on, off = spec.split("/")
            return PatternSpec("onoff", seed, parse_duration_ns(on), parse_duration_ns(off))
        except ValueError as e:
            raise InputError(f"--pattern: {text!r}: write onoff:ON/OFF, e.g. onoff:100ms/400ms ({e})") from None
    if t.startswith("replay:"):
        path = t[7:]
        if not os.path.exists(path):
            raise InputError(f"--pattern: {path}: no such replay file")
        return PatternSpec("replay", seed, replay=path)
    raise InputError(f"--pattern: {text!r} is not one of cbr, poisson, onoff:ON/OFF, replay:FILE")


def hostport(text: str, option: str) -> str:
    if ":" not in text:
        raise InputError(f"{option}: {text!r} needs a port: write HOST:PORT, e.g. 127.0.0.1:9000")
    host, _, port = text.rpartition(":")
    if not port.isdigit() or not 0 <= int(port) <= 65535:
        raise InputError(f"{option}: {text!r}: the port must be 0..65535")
    return text


def is_local(host: str) -> bool:
    """Whether ``host`` is an address of this machine (so both ends share a clock)."""
    try:
        ip = _socket.gethostbyname(host)
        s = _socket.socket(_socket.AF_INET, _socket.SOCK_DGRAM)
        try:
            s.bind((ip, 0))
            return True
        finally:
            s.close()
    except OSError:
        return False


# ---- histogram summaries ------------------------------------------------------------

QUANTILE_KEYS = ("p50", "p99", "p999")


def hist_quantiles(h: Mapping[str, Any], scale: str, qs: tuple[float, ...] = (0.5, 0.99, 0.999)) -> HistQuantiles:
    """Quantiles of a native histogram snapshot: each the bucket that holds it
    (its bounds are the error), plus exact min, max and mean."""
    idx = np.asarray(h["idx"], dtype=np.uint32)
    cnt = np.asarray(h["count"], dtype=np.uint64)
    total = int(cnt.sum()) + int(h["under"]) + int(h["over"])
    out: HistQuantiles = {"n": total, "under": int(h["under"]), "over": int(h["over"])}
    if total == 0:
        return out
    lo, hi = _native.hist_bounds(scale, idx)
    cum = np.cumsum(cnt) + int(h["under"])
    for q in qs:
        rank = max(1, math.ceil(q * total))
        name = f"p{str(q * 100).rstrip('0').rstrip('.').replace('.', '')}"
        if name not in QUANTILE_KEYS:
            raise ValueError(f"hist_quantiles: no key for the {q} quantile (HistQuantiles has {', '.join(QUANTILE_KEYS)})")
        if rank <= int(h["under"]):
            out[name] = None  # type: ignore[literal-required]
            continue
        k = int(np.searchsorted(cum, rank))
        if k >= len(idx):
            out[name] = None  # type: ignore[literal-required]  # in the overflow
            continue
        out[name] = int((int(lo[k]) + int(hi[k])) // 2)  # type: ignore[literal-required]
        out[f"{name}_bucket"] = [int(lo[k]), int(hi[k])]  # type: ignore[literal-required]
    out["min"] = int(h["min"])
    out["max"] = int(h["max"])
    out["mean"] = round(h["sum"] / total, 1)
    return out


# ---- what the probes print -----------------------------------------------------------


# ---- send ---------------------------------------------------------------------------


@dataclass
class SendResult:
    dest: str
    size: int
    rate: Rate
    pattern: str
    workers: int
    duration_ns: int | None
    count: int | None
    sent: int
    unsent: int
    errors: int
    first_error: str | None
    scheduled_ns: int
    elapsed_ns: int
    batches: int
    largest_batch: int
    tx_sched: int
    tx_sw: int
    tx_stamped: bool
    interrupted: bool
    trace: str | None
    trace_records: int | None = None
    trace_lost: int | None = None
    dep_err_ns: np.ndarray = field(default_factory=lambda: np.zeros(0, dtype=np.int32), repr=False)

    @property
    def requested_bps(self) -> float:
        return self.rate.bps if self.rate.bps is not None else self.rate.pps * self.size * 8

    @property
    def sent_bps(self) -> float:
        return self.sent * self.size * 8 / (self.scheduled_ns / 1e9) if self.scheduled_ns else 0.0

    @property
    def kept_up(self) -> bool:
        slack = max(1_000_000, self.scheduled_ns // 100)
        return self.unsent == 0 and self.errors == 0 and self.elapsed_ns <= self.scheduled_ns + slack

    @property
    def tx_missing(self) -> int:
        """Kernel TX stamps asked for but never read (two per packet sent):
        the kernel drops them when the error queue is full, and says nothing."""
        return max(0, 2 * self.sent - self.tx_sched - self.tx_sw) if self.tx_stamped else 0

    def shortfall(self) -> str | None:
        if self.kept_up or self.interrupted:
            return None
        total = self.sent + self.unsent
        why = f"; first error: {self.first_error}" if self.first_error else ""
        return f"could not keep up: sent {format_bps(self.sent_bps)} of {format_bps(self.requested_bps)} ({self.sent:,} of {total:,} packets on time){why}"

    def to_json(self) -> SendJson:
        s = summarize(self.dep_err_ns.astype(np.int64))
        dep: Spread = {}
        if s.n:
            dep = {
                "n": s.n,
                "p50": int(s.p50.value),
                "p99": int(s.p99.value),
                "p999": int(s.p999.value),
                "max": int(s.max),
                "mean": round(s.mean.value, 1),
                "ci95": {"p50": [s.p50.lo, s.p50.hi], "p99": [s.p99.lo, s.p99.hi]},
            }
        return {
            "sent": self.sent,
            "unsent": self.unsent,
            "send_errors": self.errors,
            "first_error": self.first_error,
            "requested_bps": self.requested_bps,
            "requested_pps": self.rate.pps,
            "sent_bps": self.sent_bps,
            "kept_up": self.kept_up,
            "shortfall": self.shortfall(),
            "departure_err_ns": dep,
            "batches": self.batches,
            "largest_batch": self.largest_batch,
            "tx_timestamps": {"sched": self.tx_sched, "software": self.tx_sw, "missing": self.tx_missing},
            "dest": self.dest,
            "size": self.size,
            "pattern": self.pattern,
            "workers": self.workers,
            "scheduled_ns": self.scheduled_ns,
            "elapsed_ns": self.elapsed_ns,
            "interrupted": self.interrupted,
            "trace": self.trace,
            "trace_records": self.trace_records,
            "trace_lost_records": self.trace_lost,
            "version": envelope("send"),
        }


def obvious_shortfall(r: Rate, workers: int) -> str | None:
    """A rate no machine reaches with this many workers (about 1 µs per packet each)."""
    per = r.pps / workers
    if per > 1_500_000:
        return f"{r.pps:,.0f} packets/s is {per:,.0f} per worker; a core sends about a million a second at best: expect a shortfall (add --workers)"
    return None


def send(
    dest: str,
    *,
    rate_text: str,
    size: int = 1400,
    duration_ns: int | None = None,
    count: int | None = None,
    pattern_text: str = "cbr",
    seed: int = 1,
    workers: int = 1,
    flow: int = 1,
    tx_timestamps: bool = True,
    records: bool = True,
    trace_path: str | os.PathLike[str] | None = None,
) -> SendResult:
    hostport(dest, "--dest")
    if not HEADER <= size <= 65507:
        raise InputError(f"--size: must be {HEADER}..65507 bytes (the loopscope header is {HEADER}) [got {size}]")
    if not 1 <= workers <= 256:
        raise InputError(f"--workers: must be 1..256 [got {workers}]")
    if duration_ns is None and count is None and not pattern_text.startswith("replay:"):
        raise InputError("give --duration or --count")
    r = rate(rate_text, size)
    p = pattern(pattern_text, seed)
    with traced(trace_path, ["net"]) as tr:
        raw = _native.net_send(
            dest, size, r.pps_num, r.pps_den, p.name, count, duration_ns, workers, flow, tx_timestamps, records, p.seed, p.on_ns, p.off_ns, p.replay
        )
    ws = raw["workers"]
    return SendResult(
        dest=dest,
        size=size,
        rate=r,
        pattern=pattern_text,
        workers=workers,
        duration_ns=duration_ns,
        count=count,
        sent=sum(w["sent"] for w in ws),
        unsent=sum(w["unsent"] for w in ws),
        errors=sum(w["errors"] for w in ws),
        first_error=next((w["first_error"] for w in ws if w["first_error"]), None),
        scheduled_ns=int(raw["scheduled_ns"]),
        elapsed_ns=int(raw["elapsed_ns"]),
        batches=sum(w["batches"] for w in ws),
        largest_batch=max(w["largest_batch"] for w in ws),
        tx_sched=sum(w["tx_sched"] for w in ws),
        tx_sw=sum(w["tx_sw"] for w in ws),
        tx_stamped=tx_timestamps,
        interrupted=bool(raw["interrupted"]),
        trace=tr.path,
        trace_records=tr.records,
        trace_lost=tr.lost,
        dep_err_ns=np.concatenate([np.asarray(w["dep_err_ns"]) for w in ws]) if ws else np.zeros(0, dtype=np.int32),
    )


# ---- recv ---------------------------------------------------------------------------


@dataclass
class RecvResult:
    raw: RecvRun
    trace: str | None
    trace_records: int | None = None
    trace_lost: int | None = None

    @property
    def packets(self) -> int:
        return int(self.raw["packets"])

    @property
    def interrupted(self) -> bool:
        return bool(self.raw["interrupted"])

    def per_second_bps(self) -> list[float]:
        return [b * 8.0 for b in np.asarray(self.raw["per_second_bytes"])]

    def cv_per_second(self) -> float | None:
        """Coefficient of variation of the throughput over full seconds (the
        last, partial second is left out)."""
        v = np.asarray(self.raw["per_second_bytes"], dtype=np.float64)[:-1]
        if len(v) < 2 or v.mean() == 0:
            return None
        return float(v.std(ddof=1) / v.mean())

    def to_json(self) -> RecvJson:
        raw = self.raw
        scale = raw["hist_scale"]
        flows = raw["flows"]
        span = (raw["last_krx"] - raw["first_krx"]) if raw["first_krx"] else 0
        n = raw["interarrival_n"]
        ia: HistQuantiles = {}
        if n:
            mean = raw["interarrival_sum"] / n
            var = max(0.0, raw["interarrival_sumsq"] / n - mean * mean)
            ia = {
                **hist_quantiles(raw["interarrival"], scale, (0.5, 0.99)),
                "mean": round(mean, 1),
                "std": round(math.sqrt(var), 1),
                "cv": round(math.sqrt(var) / mean, 4) if mean else None,
            }
        return {
            "packets": raw["packets"],
            "bytes": raw["bytes"],
            "lost": sum(f["lost"] for f in flows),
            "duplicates": sum(f["duplicates"] for f in flows),
            "reordered": sum(f["reordered"] + f["beyond_window"] for f in flows),
            "malformed": raw["malformed"],
            "truncated": raw["truncated"],
            "socket_buffer_drops": raw["sockbuf_drops"],
            "kernel_timestamps": raw["packets"] - raw["no_kernel_ts"],
            "hardware_timestamps": raw["hw_ts"],
            "flows": flows,
            "throughput": {
                "bps": (raw["bytes"] * 8 / ((span + (ia.get("mean") or 0)) / 1e9)) if span else None,
                "per_second_bps": self.per_second_bps(),
                "cv_per_second": self.cv_per_second(),
            },
            "interarrival_ns": ia,
            "delay_ns": {
                "one_way": hist_quantiles(raw["owd"], scale),
                "sender_and_network": hist_quantiles(raw["stack_net"], scale),
                "end_host": hist_quantiles(raw["end_host"], scale),
            },
            "bound": raw["bound"],
            "receiving_ns": (raw["last_urx"] - raw["first_urx"]) if raw["first_urx"] else 0,
            "elapsed_ns": raw["elapsed_ns"],
            "interrupted": raw["interrupted"],
            "trace": self.trace,
            "trace_records": self.trace_records,
            "trace_lost_records": self.trace_lost,
            "version": envelope("recv"),
        }


def recv(
    bind: str,
    *,
    duration_ns: int | None = None,
    idle_ns: int | None = None,
    count: int | None = None,
    records: bool = True,
    rcvbuf: int = 32 << 20,
    trace_path: str | os.PathLike[str] | None = None,
) -> RecvResult:
    hostport(bind, "--bind")
    with traced(trace_path, ["net"]) as tr:
        raw = _native.net_recv(bind, duration_ns, idle_ns, count, records, rcvbuf)
    return RecvResult(raw, tr.path, tr.records, tr.lost)


# ---- request/response ---------------------------------------------------------------


def rr(
    params: RrParams, duration_ns: int, *, pattern_text: str = "cbr", seed: int = 1, records: bool = True, trace_path: str | os.PathLike[str] | None = None
) -> RrJson:
    """Exchange requests with the echo server at ``params.dest`` for ``duration_ns``; the result as the probe's JSON."""
    dest, size, tcp = params.dest, params.size, params.transport == "tcp"
    r = rate(params.rate, max(size, HEADER))
    p = pattern(pattern_text, seed)
    if p.name == "replay":
        raise InputError("--pattern: replay is for the sender; rr takes cbr, poisson or onoff")
    with traced(trace_path, ["net"]) as tr:
        raw = _native.net_rr(dest, r.pps_num, duration_ns, r.pps_den, p.name, max(size, HEADER), 1, 200_000_000, records, p.seed, p.on_ns, p.off_ns, tcp)
    same = is_local(dest.rpartition(":")[0])
    a = {k: np.asarray(raw[k]) for k in ("sent_ns", "srv_krx_ns", "srv_urx_ns", "srv_utx_ns", "krx_ns", "urx_ns")}

    def summ(x: np.ndarray) -> Spread:
        s = summarize(x)
        if not s.n:
            return {"n": 0}
        return {
            "n": s.n,
            "min": int(s.min),
            "p50": int(s.p50.value),
            "p99": int(s.p99.value),
            "max": int(s.max),
            "mean": round(s.mean.value, 1),
            "ci95": {"p50": [s.p50.lo, s.p50.hi], "p99": [s.p99.lo, s.p99.hi]},
        }

    out: RrJson = {
        "sent": raw["sent"],
        "answered": len(a["sent_ns"]),
        "lost": raw["sent"] - len(a["sent_ns"]),
        "duplicates": raw["duplicates"],
        "malformed": raw["malformed"],
        "send_errors": raw["send_errors"],
        "rtt_ns": summ(a["urx_ns"] - a["sent_ns"]),
        "client_end_host_ns": summ(a["urx_ns"] - a["krx_ns"]),
        "server_end_host_ns": summ(a["srv_urx_ns"] - a["srv_krx_ns"]),
        "server_turnaround_ns": summ(a["srv_utx_ns"] - a["srv_urx_ns"]),
        "same_clock": same,
        "forward_ns": summ(a["srv_krx_ns"] - a["sent_ns"]) if same else None,
        "return_ns": summ(a["krx_ns"] - a["srv_utx_ns"]) if same else None,
        "requested_pps": r.pps,
        "dest": dest,
        "transport": "tcp" if tcp else "udp",
        "elapsed_ns": raw["elapsed_ns"],
        "interrupted": raw["interrupted"],
        "trace": tr.path,
        "trace_records": tr.records,
        "trace_lost_records": tr.lost,
        "version": envelope("rr"),
    }
    if not same:
        out["note"] = "client and server do not share a clock: one-way legs need the clock-sync alignment"
    return out


def split_delays(send_trace: str | os.PathLike[str], recv_trace: str | os.PathLike[str]) -> Any:
    """Per packet, join the sender's kernel TX timestamps with the receiver's
    records: ``sender_stack_ns`` (send call → TX_SOFTWARE), ``network_ns``
    (TX_SOFTWARE → kernel RX), ``end_host_ns`` (kernel RX → application).
    Both traces' CLOCK_REALTIME must be one clock (same host, or aligned)."""
    import polars as pl

    from loopscope.trace import reader

    s = reader.read(send_trace, sort=False)
    tx = s.filter(pl.col("name") == "tx_sw").select(pl.col("tag").alias("seq32"), pl.col("value").alias("ktx_ns"))
    r = reader.read(recv_trace, sort=False).filter(pl.col("name") == "recv")
    buf = b"".join(r["payload"].to_list())
    a = np.frombuffer(
        buf, dtype=np.dtype([("flow", "<u4"), ("worker", "<u4"), ("seq", "<u8"), ("sched", "<i8"), ("sent", "<i8"), ("krx", "<i8"), ("urx", "<i8")])
    )
    rx = pl.DataFrame({"seq": a["seq"], "sched_ns": a["sched"], "sent_ns": a["sent"], "krx_ns": a["krx"], "urx_ns": a["urx"]}).with_columns(
        (pl.col("seq") & 0xFFFFFFFF).cast(pl.UInt32).alias("seq32")
    )
    j = rx.join(tx, on="seq32", how="left")
    return j.select(
        "seq",
        "sched_ns",
        "sent_ns",
        "ktx_ns",
        "krx_ns",
        "urx_ns",
        (pl.col("ktx_ns") - pl.col("sent_ns")).alias("sender_stack_ns"),
        (pl.col("krx_ns") - pl.col("ktx_ns")).alias("network_ns"),
        (pl.col("urx_ns") - pl.col("krx_ns")).alias("end_host_ns"),
    )


def rr_launched(p: RrParams, launch: Launch) -> RrJson:
    """The rr client as an agent starts it."""
    return rr(p, launch.duration_ns, trace_path=launch.trace)


def echo_launched(p: EchoParams, launch: Launch) -> EchoJson:
    """The echo server as the lab starts it: ``ready`` once listening, until stopped."""
    sys.stdout.flush()
    r = _native.net_echo(p.bind, launch.duration_ns or None, p.transport == "tcp", sys.stdout.fileno())
    return {
        "requests": r["requests"],
        "malformed": r["malformed"],
        "send_errors": r["send_errors"],
        "elapsed_ns": r["elapsed_ns"],
        "tids": r["tids"],
        "interrupted": r["interrupted"],
    }
