"""``loopscope bench pacing``: does the sender send what was asked, when?

On loopback with 1400-byte packets, for 10 Mb/s, 100 Mb/s, 1 Gb/s and
5 Gb/s, loopscope's sender and (when installed) iperf3 run back to back,
each against its own receiver, and the receiver counts what arrived:

- ``achieved_bps``: payload bits received over the run's length;
- ``cv_per_second``: coefficient of variation of the per-second throughput
  at the receiver (full seconds only);
- ``departure_err_p50_ns``/``p99``: how late loopscope's packets left
  against their schedule (iperf3 does not report its departures);
- ``lost``: packets sent but not received.

Then, per worker count 1..4, the highest rate whose achieved rate stays
within 1 % of the requested one (the question of Egg's Table 1),
found by bisection over 2-second runs; and the receiver's own capacity:
packets piled up in its socket buffer while it is stopped, then drained
with per-packet kernel timestamps and trace records, the drain rate being
what it can keep up with.

Both senders run without TX timestamps and per-packet records (iperf3 has
neither); the receiver keeps its kernel RX timestamps.
"""

from __future__ import annotations

import json
import os
import shutil
import signal
import socket
import subprocess
import sys
import time
from pathlib import Path
from typing import Callable

from typing_extensions import TypedDict

from loopscope.errors import RunError
from loopscope.units import format_bps, format_ns
from loopscope.host import scratch
import numpy as np

Progress = Callable[[str], None] | None
RATES = [10e6, 100e6, 1e9, 5e9]
SIZE = 1400


def _free_port() -> int:
    s = socket.socket(socket.AF_INET, socket.SOCK_DGRAM)
    s.bind(("127.0.0.1", 0))
    p = s.getsockname()[1]
    s.close()
    return int(p)


def _bound(port: int, proc: subprocess.Popen[str], timeout_s: float = 15.0) -> None:
    """Wait until a UDP socket is bound to ``port`` on this host (/proc/net/udp),
    or ``proc`` exits, or ``timeout_s`` passes: a receiver's start-up (its
    imports) takes longer than any fixed sleep on a busy machine."""
    want = f":{port:04X} "
    end = time.monotonic() + timeout_s
    while time.monotonic() < end and proc.poll() is None:
        try:
            if any(want in line.split()[1] + " " for line in Path("/proc/net/udp").read_text().splitlines()[1:]):
                return
        except (OSError, IndexError):
            return
        time.sleep(0.02)


def _cli(*args: str) -> list[str]:
    return [sys.executable, "-m", "loopscope.cli", *args]


class PaceRow(TypedDict, total=False):
    """One tool at one rate (``error``: the tool failed)."""

    tool: str
    requested_bps: float
    achieved_bps: float
    cv_per_second: float | None
    departure_err_p50_ns: float | None
    departure_err_p99_ns: float | None
    lost: int | None
    sent: int | None
    kept_up: bool
    workers: int
    error: str


class Trial(TypedDict):
    requested_bps: int
    achieved_bps: int
    ok: bool
    kept_up: bool


class Receiver(TypedDict):
    packets_sent: int
    packets_received: int
    lost_before_socket: int
    socket_buffer_drops: int
    kernel_timestamps: int
    trace_records: int
    trace_lost_records: int
    drain_seconds: float
    pps: int | None


class PacingBench(TypedDict):
    """What ``loopscope bench pacing --json`` prints."""

    rows: list[PaceRow]
    max_rate_within_1pct_bps: dict[str, int]
    receiver: Receiver
    context: dict[str, int | float | bool | dict[str, list[Trial]]]


def _rate_text(bps: float) -> str:
    return f"{bps / 1e6:g}Mbit"


def loopscope_run(bps: float, seconds: float, workers: int, work: Path, size: int = SIZE) -> PaceRow:
    port = _free_port()
    rx = subprocess.Popen(
        _cli(
            "probe",
            "recv",
            "--bind",
            f"127.0.0.1:{port}",
            "--idle",
            "1s",
            "--duration",
            f"{seconds + 10:g}s",
            "--no-packet-records",
            "--json",
            "--trace",
            str(work / "r.lstrace"),
        ),
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
    )
    try:
        time.sleep(0.4)
        tx = subprocess.run(
            _cli(
                "probe",
                "send",
                "--dest",
                f"127.0.0.1:{port}",
                "--rate",
                _rate_text(bps),
                "--size",
                str(size),
                "--duration",
                f"{seconds:g}s",
                "--workers",
                str(workers),
                "--no-tx-timestamps",
                "--no-packet-records",
                "--json",
                "--trace",
                str(work / "s.lstrace"),
            ),
            capture_output=True,
            text=True,
            timeout=seconds + 60,
        )
        if tx.returncode != 0:
            raise RunError(f"loopscope probe send failed: {tx.stderr.strip()[-400:]}")
        out, err = rx.communicate(timeout=seconds + 30)
    finally:
        if rx.poll() is None:
            rx.kill()
            rx.communicate()
    if rx.returncode != 0:
        raise RunError(f"loopscope probe recv failed: {err.strip()[-400:]}")
    s, r = json.loads(tx.stdout), json.loads(out)
    d = s["departure_err_ns"]
    return {
        "tool": "loopscope",
        "requested_bps": bps,
        "achieved_bps": r["bytes"] * 8 / seconds,
        "cv_per_second": r["throughput"]["cv_per_second"],
        "departure_err_p50_ns": d.get("p50"),
        "departure_err_p99_ns": d.get("p99"),
        "lost": s["sent"] - r["packets"],
        "sent": s["sent"],
        "kept_up": s["kept_up"],
        "workers": workers,
    }


def iperf3_run(bps: float, seconds: int) -> PaceRow | None:
    if not shutil.which("iperf3"):
        return None
    port = _free_port()
    # The server in JSON mode, so the client can fetch its receiver-side report.
    srv = subprocess.Popen(["iperf3", "-s", "-1", "-p", str(port), "--json"], stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
    try:
        time.sleep(0.4)
        c = subprocess.run(
            ["iperf3", "-c", "127.0.0.1", "-p", str(port), "-u", "-b", f"{int(bps)}", "-l", str(SIZE), "-t", str(seconds), "--json", "--get-server-output"],
            capture_output=True,
            text=True,
            timeout=seconds + 60,
        )
    finally:
        try:
            srv.wait(timeout=10)
        except subprocess.TimeoutExpired:
            srv.kill()
            srv.wait()
    if c.returncode != 0:
        return {"tool": "iperf3", "requested_bps": bps, "error": c.stdout.strip()[-300:] or c.stderr.strip()[-300:]}
    j = json.loads(c.stdout)
    so = j.get("server_output_json") or {}
    per = [iv["sum"]["bytes"] * 8 / iv["sum"]["seconds"] for iv in so.get("intervals", []) if iv["sum"]["seconds"] > 0.99]

    cv = float(np.std(per, ddof=1) / np.mean(per)) if len(per) > 1 and np.mean(per) > 0 else None
    # What arrived, from the receiver: packets counted minus those lost.
    rend = (so.get("end") or {}).get("sum") or {}
    received = max(0, int(rend.get("packets", 0)) - int(rend.get("lost_packets", 0)))
    return {
        "tool": "iperf3",
        "requested_bps": bps,
        "achieved_bps": received * SIZE * 8 / seconds,
        "cv_per_second": cv,
        "departure_err_p50_ns": None,
        "departure_err_p99_ns": None,
        "lost": rend.get("lost_packets"),
        "sent": j["end"]["sum"].get("packets"),
    }


def max_rate_within_1pct(workers: int, work: Path, seconds: float, lo: float = 100e6, hi: float = 40e9, steps: int = 7) -> tuple[float, list[Trial]]:
    """Highest rate whose achieved rate is within 1 % of the requested one (bisection on a log scale)."""
    trials: list[Trial] = []
    best = 0.0
    for _ in range(steps):
        mid = (lo * hi) ** 0.5
        r = loopscope_run(mid, seconds, workers, work)
        got = r.get("achieved_bps", 0.0)
        ok = got >= 0.99 * mid
        trials.append({"requested_bps": round(mid), "achieved_bps": round(got), "ok": ok, "kept_up": r.get("kept_up", False)})
        if ok:
            best, lo = mid, mid
        else:
            hi = mid
    return best, trials


def receiver_capacity(work: Path, packets: int = 200_000) -> Receiver:
    """Packets per second the receiver drains with kernel timestamps and a trace
    record per packet: the packets wait in its socket buffer while it is
    stopped, so the sender's speed does not limit the measurement."""
    port = _free_port()
    # --idle ends the receiver when the burst is drained even if the kernel
    # dropped some of it before the socket (loopback's backlog under a
    # burst): waiting for --count alone once outlived the bench's patience.
    rx = subprocess.Popen(
        _cli(
            "probe",
            "recv",
            "--bind",
            f"127.0.0.1:{port}",
            "--count",
            str(packets),
            "--idle",
            "0.5s",
            "--duration",
            "120s",
            "--rcvbuf-mib",
            "1024",
            "--json",
            "--trace",
            str(work / "cap.lstrace"),
        ),
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
    )
    try:
        _bound(port, rx)
        time.sleep(0.1)
        os.kill(rx.pid, signal.SIGSTOP)
        tx = subprocess.run(
            _cli(
                "probe",
                "send",
                "--dest",
                f"127.0.0.1:{port}",
                "--rate",
                "300kpps",
                "--size",
                "64",
                "--count",
                str(packets),
                "--workers",
                "1",
                "--no-tx-timestamps",
                "--no-packet-records",
                "--json",
                "--trace",
                str(work / "caps.lstrace"),
            ),
            capture_output=True,
            text=True,
            timeout=120,
        )
        os.kill(rx.pid, signal.SIGCONT)
        try:
            out, err = rx.communicate(timeout=150)
        except subprocess.TimeoutExpired:
            raise RunError(
                "the receiver-capacity receiver (loopscope probe recv) neither drained the burst nor went idle within 150 s", component="bench"
            ) from None
    finally:
        if rx.poll() is None:
            os.kill(rx.pid, signal.SIGCONT)
            rx.kill()
            rx.communicate()
    r = json.loads(out)
    s = json.loads(tx.stdout)
    secs = r["receiving_ns"] / 1e9
    return {
        "packets_sent": s["sent"],
        "packets_received": r["packets"],
        "lost_before_socket": max(0, s["sent"] - r["packets"] - r["socket_buffer_drops"]),
        "socket_buffer_drops": r["socket_buffer_drops"],
        "kernel_timestamps": r["kernel_timestamps"],
        "trace_records": r["trace_records"],
        "trace_lost_records": r["trace_lost_records"],
        "drain_seconds": round(secs, 4),
        "pps": round(r["packets"] / secs) if secs > 0 else None,
    }


def run(*, quick: bool = False, seconds: float | None = None, progress: Progress = None) -> PacingBench:
    say = progress or (lambda s: None)
    secs = seconds or (2.0 if quick else 5.0)
    rows: list[PaceRow] = []
    with scratch.directory("bench-pacing") as d:
        work = Path(d)
        for bps in RATES:
            say(f"  {bps / 1e6:g} Mbit/s: loopscope …")
            rows.append(loopscope_run(bps, secs, 1, work))
            say(f"  {bps / 1e6:g} Mbit/s: iperf3 …")
            ip = iperf3_run(bps, int(max(1, round(secs))))
            if ip is not None:
                rows.append(ip)
        maxrate: dict[str, int] = {}
        trials: dict[str, list[Trial]] = {}
        for w in (1, 2) if quick else (1, 2, 3, 4):
            say(f"  highest rate within 1% with {w} worker(s) …")
            best, t = max_rate_within_1pct(w, work, 1.0 if quick else 2.0, steps=3 if quick else 7)
            maxrate[str(w)] = round(best)
            trials[str(w)] = t
        say("  receiver capacity …")
        cap = receiver_capacity(work, 50_000 if quick else 200_000)
    return {
        "rows": rows,
        "max_rate_within_1pct_bps": maxrate,
        "receiver": cap,
        "context": {"size": SIZE, "seconds": secs, "iperf3": shutil.which("iperf3") is not None, "bisection": trials, "quick": quick},
    }


def print_human(r: PacingBench) -> None:

    print(f"pacing on loopback, {r['context']['size']}-byte packets, {r['context']['seconds']:g} s per run")
    print(f"  {'tool':10} {'requested':>15} {'achieved':>15} {'error':>8} {'CV/s':>8} {'dep p50':>9} {'dep p99':>9} {'lost':>7}")
    for x in r["rows"]:
        if "error" in x:
            print(f"  {x['tool']:10} {format_bps(x['requested_bps']):>15} failed: {x['error'][:60]}")
            continue
        err = (x["achieved_bps"] / x["requested_bps"] - 1) * 100
        cv = f"{x['cv_per_second'] * 100:.3f}%" if x["cv_per_second"] is not None else "n/a"
        d50 = format_ns(x["departure_err_p50_ns"]) if x["departure_err_p50_ns"] is not None else "n/a"
        d99 = format_ns(x["departure_err_p99_ns"]) if x["departure_err_p99_ns"] is not None else "n/a"
        print(
            f"  {x['tool']:10} {format_bps(x['requested_bps']):>15} {format_bps(x['achieved_bps']):>15} {err:+7.3f}% {cv:>8} {d50:>9} {d99:>9} {x['lost']!s:>7}"
        )
    print("  highest rate achieved within 1%: " + ", ".join(f"{w} worker(s) {format_bps(v)}" for w, v in r["max_rate_within_1pct_bps"].items()))
    c = r["receiver"]
    print(
        f"  receiver: drained {c['packets_received']:,} packets at {c['pps']:,} packets/s with kernel timestamps and a trace record each ({c['trace_lost_records']} records lost, {c['socket_buffer_drops']} socket drops, {c['lost_before_socket']} lost before the socket)"
    )
