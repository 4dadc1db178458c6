"""``loopscope bench channels``: what a channel costs against raw sockets.

Two netns hosts, a and b, the kernel forwarding between them (no
emulator). A client on a sends an item of each size to b and b sends it
back: through channels (a remote put into b's channel ``ping``, b's
consumer gets it and puts it into a's ``pong``, a's consumer gets it: the
channel header, put, the hub's pump and get on both sides) and through raw
sockets (TCP: an 8-byte length per message; UDP: the item split into
datagrams of the same size as the channel's, each with the 16-byte header a
receiver needs). Both servers run side by side on b and the client
alternates raw and channel blocks of round trips (``blocks`` per size), so
both see the same moments of this shared machine: each pair of blocks gives
one overhead figure, and the reported overhead is the median over pairs
(throughput counts the bytes moved both ways in a block). The client is
pinned to CPU 0 and the server to CPU 1 (``placement`` split: each hop then
includes waking an idle CPU, ~80 µs on this VM, as between two machines) or
both to CPU 0 (``same``: no idle wake-ups, so the software's own per-item
cost shows).
"""

from __future__ import annotations

import json
import subprocess
import sys
import time
from typing import Any, Callable

from typing_extensions import TypedDict

import numpy as np

from loopscope.errors import InputError, RunError
from loopscope.lab import netns
from loopscope.units import format_ns

SIZES = [1024, 4096, 16384, 65536, 262144, 1048576]
PORT = 47400

Progress = Callable[[str], None] | None


def _in(ns: str, *args: str) -> list[str]:
    return [sys.executable, "-m", "loopscope.lab.nsexec", "--net", f"/run/netns/{ns}", "--", sys.executable, "-m", "loopscope.cli", *args]


class Block(TypedDict):
    """One block of the client's ping-pong, raw or through a channel (its JSON)."""

    mode: str
    block: int
    size: int
    n: int
    elapsed_ns: int
    timeouts: int
    rtt_ns: list[int]


class SizeRow(TypedDict):
    """One item size: both modes' throughput and round trips, the overhead over its pairs."""

    size: int
    channel_mbps: float | None
    raw_mbps: float | None
    overhead_pct: float | None
    overhead_iqr_pct: list[float] | None
    p50_ns: float | None
    p99_ns: float | None
    raw_p50_ns: float | None
    raw_p99_ns: float | None
    blocks: int
    rounds: int
    timeouts: int
    raw_timeouts: int


class ChannelsBench(TypedDict, total=False):
    """What ``loopscope bench channels --json`` prints (``rows``: tcp's, else the first transport's)."""

    context: dict[str, int | str | list[int]]
    transports: dict[str, list[SizeRow]]
    rows: list[SizeRow]
    max_overhead_pct: float | None


def _rounds(size: int, quick: bool) -> int:
    n = 200 if size <= 16384 else 60 if size <= 262144 else 16
    return max(10, n // 4) if quick else n


def one(topo: Any, transport: str, sizes: list[int], blocks: int, quick: bool, port: int, placement: str) -> list[Block]:
    a, b = topo.host("a"), topo.host("b")
    raw, chan, back = f"{b.address}:{port}", f"{b.address}:{port + 1}", f"{a.address}:{port + 2}"
    srv = subprocess.Popen(
        _in(
            b.ns,
            "channel",
            "bench-serve",
            "--transport",
            transport,
            "--raw-bind",
            raw,
            "--chan-bind",
            chan,
            "--reply-to",
            back,
            "--cpu",
            "1" if placement == "split" else "0",
        ),
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
    )
    try:
        time.sleep(0.5)
        if srv.poll() is not None:
            raise RunError(f"bench channels: the {transport} servers on b failed: {srv.stderr.read().strip()[-400:] if srv.stderr else ''}")
        r = subprocess.run(
            _in(
                a.ns,
                "channel",
                "bench-client",
                "--transport",
                transport,
                "--raw-dest",
                raw,
                "--chan-dest",
                chan,
                "--bind",
                back,
                "--sizes",
                ",".join(map(str, sizes)),
                "--rounds",
                ",".join(str(_rounds(s, quick)) for s in sizes),
                "--blocks",
                str(blocks),
                "--cpu",
                "0",
            ),
            capture_output=True,
            text=True,
            timeout=900,
        )
        if r.returncode != 0:
            raise RunError(f"bench channels: the {transport} client on a failed: {r.stderr.strip()[-400:]}")
        blocks_out: list[Block] = json.loads(r.stdout)
        return blocks_out
    finally:
        srv.send_signal(2)
        try:
            srv.communicate(timeout=10)
        except subprocess.TimeoutExpired:
            srv.kill()
            srv.communicate()


def _mbps(r: Block) -> float:
    return 2 * r["size"] * 8 * r["n"] / r["elapsed_ns"] * 1e3 if r["elapsed_ns"] and r["n"] else 0.0


def summarize(blocks: list[Block], sizes: list[int]) -> list[SizeRow]:
    rows: list[SizeRow] = []
    for size in sizes:
        bs = [x for x in blocks if x["size"] == size]
        by = {(x["mode"], x["block"]): x for x in bs}
        pairs = [(by[("raw", k)], by[("channel", k)]) for k in sorted({x["block"] for x in bs}) if ("raw", k) in by and ("channel", k) in by]
        over = [(_mbps(r) - _mbps(c)) / _mbps(r) * 100 for r, c in pairs if _mbps(r)]
        rtt = {m: np.concatenate([np.asarray(x["rtt_ns"], dtype=np.float64) for x in bs if x["mode"] == m] or [np.zeros(0)]) for m in ("raw", "channel")}

        def q(m: str, p: float) -> float | None:
            return float(np.percentile(rtt[m], p)) if len(rtt[m]) else None

        lo, hi = (float(np.percentile(over, 25)), float(np.percentile(over, 75))) if over else (0.0, 0.0)
        rows.append(
            {
                "size": size,
                "channel_mbps": round(float(np.median([_mbps(c) for _, c in pairs])), 1) if pairs else None,
                "raw_mbps": round(float(np.median([_mbps(r) for r, _ in pairs])), 1) if pairs else None,
                "overhead_pct": round(float(np.median(over)), 1) if over else None,
                "overhead_iqr_pct": [round(lo, 1), round(hi, 1)] if over else None,
                "p50_ns": q("channel", 50),
                "p99_ns": q("channel", 99),
                "raw_p50_ns": q("raw", 50),
                "raw_p99_ns": q("raw", 99),
                "blocks": len(pairs),
                "rounds": int(sum(x["n"] for x in bs if x["mode"] == "channel")),
                "timeouts": int(sum(x["timeouts"] for x in bs if x["mode"] == "channel")),
                "raw_timeouts": int(sum(x["timeouts"] for x in bs if x["mode"] == "raw")),
            }
        )
    return rows


def run(
    *, quick: bool = False, blocks: int | None = None, transports: list[str] | None = None, placement: str = "split", progress: Progress = None
) -> ChannelsBench:

    why = netns.privileges()
    if why:
        raise InputError(f"bench channels needs network namespaces: {why}")
    say = progress or (lambda s: None)
    nb = blocks or (4 if quick else 20)
    sizes = SIZES[:3] if quick else SIZES
    by_transport: dict[str, list[SizeRow]] = {}
    out: ChannelsBench = {
        "transports": by_transport,
        "context": {"blocks": nb, "sizes": sizes, "hosts": "two netns hosts, kernel forwarding", "frag": 1400, "placement": placement},
    }
    topo = netns.Topology.plan(f"bench-chan-{time.monotonic_ns()}", ["a", "b"])
    topo.up()
    try:
        subprocess.run(["ip", "netns", "exec", topo.router_ns, "sysctl", "-q", "-w", "net.ipv4.ip_forward=1"], check=True)
        for i, transport in enumerate(transports or ["tcp", "udp"]):
            say(f"{transport}: {nb} alternating blocks per size, {len(sizes)} sizes")
            by_transport[transport] = summarize(one(topo, transport, sizes, nb, quick, PORT + 10 * i, placement), sizes)
    finally:
        topo.down()
    out["rows"] = by_transport.get("tcp") or next(iter(by_transport.values()))
    vals = [v for rows in by_transport.values() for r in rows if (v := r["overhead_pct"]) is not None]
    out["max_overhead_pct"] = max(vals) if vals else None
    return out


def _fmt(x: float | None, spec: str, width: int) -> str:
    return format(x, spec) if x is not None else "n/a".rjust(width)


def _ns(x: float | None) -> str:

    return format_ns(x) if x is not None else "n/a"


def print_human(r: ChannelsBench) -> None:
    c = r["context"]
    print(
        f"channels vs raw sockets: ping-pong a ↔ b ({c['hosts']}; ends on {'CPUs 0 and 1' if c['placement'] == 'split' else 'CPU 0 both'}), {c['blocks']} alternating block pairs per size"
    )
    for t, rows in r["transports"].items():
        print(f"  {t}:")
        print(f"    {'size':>9} {'channel':>12} {'raw':>12} {'overhead [IQR]':>22} {'chan p50':>10} {'raw p50':>10} {'chan p99':>10} {'raw p99':>10}")
        for x in rows:
            iqr = x["overhead_iqr_pct"] or [0, 0]
            print(
                f"    {x['size']:>9,} {_fmt(x['channel_mbps'], '>7.1f', 7)} Mb/s {_fmt(x['raw_mbps'], '>7.1f', 7)} Mb/s {_fmt(x['overhead_pct'], '>6.1f', 6)}% [{iqr[0]:>5.1f}, {iqr[1]:>5.1f}] "
                f"{_ns(x['p50_ns']):>10} {_ns(x['raw_p50_ns']):>10} {_ns(x['p99_ns']):>10} {_ns(x['raw_p99_ns']):>10}"
                + (f"  ({x['timeouts']} channel / {x['raw_timeouts']} raw rounds timed out)" if x["timeouts"] or x["raw_timeouts"] else "")
            )
    print(f"  largest overhead (median of pairs): {_fmt(r.get('max_overhead_pct'), '.1f', 0)} %")
