"""`loopscope probe …` over a network: the probes that send, receive, echo
and ask (send, recv, echo, rr, bulk), and the lab's helpers that carry a
pipeline's items and the clocks' probes (pipe-source, pipe-node, pipe-sink,
sync-serve, sync). They register on the ``probe`` group of ``probe.py``."""

from __future__ import annotations

import json
import sys

from typing import TYPE_CHECKING

import click

from loopscope.errors import EXIT_INTERRUPTED, InputError, RunError
from loopscope.units import format_bps, format_ns
from loopscope.cli.base import Duration, _console, prints
from loopscope.cli.params import build, options
from loopscope.probes.params import EchoParams, PipeNodeParams, PipeSinkParams, PipeSourceParams, RrParams, SyncParams, SyncServeParams
from loopscope.cli.show import _trace_line, _trace_path
from loopscope.cli.probe import probe
from loopscope.probes import net
from loopscope import _native
from loopscope.probes import pipeline
from loopscope.probes import clocksync

if TYPE_CHECKING:
    from loopscope.probes.netjson import BulkJson
    from loopscope.probes.netjson import RecvTcpJson


@probe.command("send")
@click.option("--dest", required=True, help="Receiver HOST:PORT.")
@click.option("--rate", "rate_text", required=True, help="Payload bit rate (200Mbit, 1Gb/s) or packet rate (1000pps).")
@click.option("--size", type=int, default=1400, show_default=True, help="UDP payload bytes per packet (48..65507).")
@click.option("--duration", "-d", type=Duration(), default=None, help="How long to send (or --count).")
@click.option("--count", type=click.IntRange(min=1), default=None, help="How many packets to send.")
@click.option("--pattern", "pattern_text", default="cbr", show_default=True, help="cbr | poisson | onoff:ON/OFF | replay:FILE.")
@click.option("--seed", type=int, default=1, show_default=True, help="Seed of the poisson pattern.")
@click.option("--workers", type=int, default=1, show_default=True, help="Sending threads sharing one schedule.")
@click.option("--flow", type=int, default=1, show_default=True, help="Flow id carried by every packet.")
@click.option("--tx-timestamps/--no-tx-timestamps", default=True, show_default=True, help="Kernel TX timestamps (SO_TIMESTAMPING) into the trace.")
@click.option("--packet-records/--no-packet-records", default=True, show_default=True, help="One trace record per packet.")
@click.option("--trace", "trace_path", type=click.Path(dir_okay=False), default=None, help="Trace file [default: runs/<time>-send/send.lstrace].")
@click.option("--json", "as_json", is_flag=True, help="Print exactly one JSON object.")
@prints("loopscope.probes.netjson:SendJson")
def probe_send(
    dest: str,
    rate_text: str,
    size: int,
    duration: int | None,
    count: int | None,
    pattern_text: str,
    seed: int,
    workers: int,
    flow: int,
    tx_timestamps: bool,
    packet_records: bool,
    trace_path: str | None,
    as_json: bool,
) -> int:
    """Paced UDP sender: departures on absolute deadlines, says if it could not keep up.

    \b
    Examples:
      loopscope probe send --dest 127.0.0.1:9000 --rate 10000pps -d 5s
      loopscope probe send --dest 10.0.0.2:9000 --rate 100Mbit --size 1400 --pattern poisson
    """

    r0 = net.rate(rate_text, size)
    warn = net.obvious_shortfall(r0, workers)
    if warn:
        sys.stderr.write(f"loopscope: warning: {warn}\n")
    res = net.send(
        dest,
        rate_text=rate_text,
        size=size,
        duration_ns=duration,
        count=count,
        pattern_text=pattern_text,
        seed=seed,
        workers=workers,
        flow=flow,
        tx_timestamps=tx_timestamps,
        records=packet_records,
        trace_path=_trace_path(trace_path, "send"),
    )
    j = res.to_json()
    if as_json:
        click.echo(json.dumps(j))
    else:
        con = _console()
        d = j["departure_err_ns"]
        con.print(
            f"sent {j['sent']:,} packets of {size} bytes to {dest}: {format_bps(j['sent_bps'])} of {format_bps(j['requested_bps'])} requested ({pattern_text}, {workers} worker{'s' if workers > 1 else ''})"
        )
        if d:
            con.print(f"departure error: p50 {format_ns(d['p50'])}, p99 {format_ns(d['p99'])}, p99.9 {format_ns(d['p999'])}, max {format_ns(d['max'])}")
        tx = j["tx_timestamps"]
        missing = f" ({tx['missing']:,} never came: the error queue overflowed)" if tx["missing"] else ""
        con.print(
            f"kernel TX timestamps: {tx['sched']:,} at the queue, {tx['software']:,} at the driver{missing}; {j['batches']:,} send calls, largest batch {j['largest_batch']}"
        )
        _trace_line(con, res)
    if j["shortfall"]:
        sys.stderr.write(f"loopscope: warning: {j['shortfall']}\n")
    return EXIT_INTERRUPTED if res.interrupted else 0


@probe.command("recv")
@click.option("--bind", required=True, help="HOST:PORT to receive on (port 0: any).")
@click.option("--duration", "-d", type=Duration(), default=None, help="Stop after this long.")
@click.option("--idle", type=Duration(), default=None, help="Stop when nothing arrived for this long (after the first packet).")
@click.option("--count", type=click.IntRange(min=1), default=None, help="Stop after this many packets.")
@click.option("--tcp", is_flag=True, help="Be a TCP sink for bulk streams instead (counts bytes).")
@click.option("--rcvbuf-mib", type=click.IntRange(min=1, max=4096), default=32, show_default=True, help="Socket receive buffer.")
@click.option("--packet-records/--no-packet-records", default=True, show_default=True, help="One trace record per packet (off: histograms only, fixed memory).")
@click.option("--trace", "trace_path", type=click.Path(dir_okay=False), default=None, help="Trace file [default: runs/<time>-recv/recv.lstrace].")
@click.option("--json", "as_json", is_flag=True, help="Print exactly one JSON object.")
@prints("loopscope.probes.netjson:RecvJson")
def probe_recv(
    bind: str,
    duration: int | None,
    idle: int | None,
    count: int | None,
    tcp: bool,
    rcvbuf_mib: int,
    packet_records: bool,
    trace_path: str | None,
    as_json: bool,
) -> int:
    """Receiver with kernel RX timestamps: loss, duplicates, reordering, throughput, delays split.

    \b
    Examples:
      loopscope probe recv --bind 0.0.0.0:9000 -d 10s
      loopscope probe recv --bind 127.0.0.1:9000 --tcp --trace recv.lstrace --json
    """

    net.hostport(bind, "--bind")
    if tcp:
        b, conns = _native.net_sink_tcp(bind, duration)
        tcp_out: RecvTcpJson = {"bytes": b, "connections": conns, "bind": bind}
        click.echo(json.dumps(tcp_out) if as_json else f"received {b:,} bytes over {conns} TCP connection(s)")
        return 0
    if duration is None and idle is None and count is None:
        sys.stderr.write("loopscope: receiving until Ctrl-C (give --duration, --idle or --count to stop by itself)\n")
    res = net.recv(
        bind, duration_ns=duration, idle_ns=idle, count=count, records=packet_records, rcvbuf=rcvbuf_mib << 20, trace_path=_trace_path(trace_path, "recv")
    )
    j = res.to_json()
    if as_json:
        click.echo(json.dumps(j))
    else:
        con = _console()
        t = j["throughput"]
        con.print(
            f"received {j['packets']:,} packets on {j['bound']}: lost {j['lost']:,}, duplicates {j['duplicates']:,}, reordered {j['reordered']:,}, malformed {j['malformed']:,}"
        )
        if t["bps"]:
            cv = t["cv_per_second"]
            con.print(f"throughput {format_bps(t['bps'])}" + (f", per-second CV {cv * 100:.3f}%" if cv is not None else ""))
        for name, d in j["delay_ns"].items():
            if d.get("n") and (p50 := d.get("p50")) is not None:
                p99 = d.get("p99")
                con.print(
                    f"{name.replace('_', ' ')} delay: p50 {format_ns(p50)}, p99 {format_ns(p99) if p99 is not None else 'over range'}, max {format_ns(d.get('max', 0))}"
                )
        con.print(
            f"kernel RX timestamps on {j['kernel_timestamps']:,} packets ({j['hardware_timestamps']:,} from hardware); socket buffer drops: {j['socket_buffer_drops']:,}"
        )
        _trace_line(con, res)
    return EXIT_INTERRUPTED if j["interrupted"] else 0


@probe.command("echo")
@options(EchoParams)
@click.option("--tcp", is_flag=True, help="Same as --transport tcp: answer over TCP connections.")
@click.option("--duration", "-d", type=Duration(), default=None, help="Stop after this long [until Ctrl-C].")
@click.option("--json", "as_json", is_flag=True, help="Print `ready` once listening, then exactly one JSON object when stopped.")
@prints("loopscope.probes.netjson:EchoJson")
def probe_echo(tcp: bool, duration: int | None, as_json: bool, **params: object) -> int:
    """Echo server for `probe rr`: answers each request at once with its kernel RX and its own times.

    \b
    Examples:
      loopscope probe echo --bind 0.0.0.0:7000
      loopscope probe echo --bind 127.0.0.1:7000 --tcp -d 60s
    """

    p = build(EchoParams, {**params, **({"transport": "tcp"} if tcp else {})})
    r = _native.net_echo(p.bind, duration, p.transport == "tcp", sys.stdout.fileno() if as_json else None)
    click.echo(json.dumps(r) if as_json else f"answered {r['requests']:,} requests ({r['malformed']:,} malformed messages ignored)")
    return EXIT_INTERRUPTED if r["interrupted"] else 0


@probe.command("pipe-source", hidden=True)
@options(PipeSourceParams, skip=("linger_ns",))
@click.option("--duration", "-d", type=Duration(), default=None, help="How long to send (or --count).")
@click.option(
    "--linger",
    type=Duration(),
    default=0,
    help="After the last message, sleep this long before exiting, so that the messages in flight arrive undisturbed by the exit.",
)
@click.option("--trace", "trace_path", type=click.Path(dir_okay=False), default=None, help="Trace file [default: runs/<time>-pipe-source/pipe-source.lstrace].")
@click.option("--json", "as_json", is_flag=True, help="Print exactly one JSON object.")
@prints("loopscope.probes.pipeline:SourceJson")
def probe_pipe_source(duration: int | None, linger: int, trace_path: str | None, as_json: bool, **params: object) -> int:
    """Source of a distributed pipeline: paced messages through the nodes to the sink."""

    p = build(PipeSourceParams, {**params, "linger_ns": linger})
    if duration is None and p.count is None:
        raise InputError("give --duration or --count")
    res = pipeline.source(p.dest, net.rate(p.rate, p.size), p.size, p.flow, p.count, duration, _trace_path(trace_path, "pipe-source"), p.linger_ns)
    click.echo(
        json.dumps(res)
        if as_json
        else f"sent {res['sent']:,} messages to {p.dest} ({res['send_errors']} send errors); departure late p99 {format_ns(res['late_ns'].get('p99') or 0)}"
    )
    return EXIT_INTERRUPTED if res["interrupted"] else 0


@probe.command("pipe-node", hidden=True)
@options(PipeNodeParams)
@click.option("--trace", "trace_path", type=click.Path(dir_okay=False), default=None, help="Trace file [default: runs/<time>-pipe-node/pipe-node.lstrace].")
@click.option("--json", "as_json", is_flag=True, help="Print `ready`, then exactly one JSON object when stopped.")
@prints("loopscope.probes.pipeline:NodeJson")
def probe_pipe_node(trace_path: str | None, as_json: bool, **params: object) -> int:
    """Processing node of a pipeline: receive, work, append stamps, forward; until Ctrl-C."""

    p = build(PipeNodeParams, params)
    res = pipeline.node(p.bind, p.next, p.work_us, _trace_path(trace_path, "pipe-node"))
    click.echo(
        json.dumps(res)
        if as_json
        else f"forwarded {res['forwarded']:,} of {res['received']:,} messages ({res['malformed']} malformed, {res['full']} full, {res['send_errors']} send errors)"
    )
    return 0


@probe.command("pipe-sink", hidden=True)
@options(PipeSinkParams)
@click.option("--trace", "trace_path", type=click.Path(dir_okay=False), default=None, help="Trace file [default: runs/<time>-pipe-sink/pipe-sink.lstrace].")
@click.option("--json", "as_json", is_flag=True, help="Print `ready`, then exactly one JSON object when stopped.")
@prints("loopscope.probes.pipeline:SinkJson")
def probe_pipe_sink(trace_path: str | None, as_json: bool, **params: object) -> int:
    """Sink of a pipeline: one trace record per message with every hop's stamps; until Ctrl-C."""

    p = build(PipeSinkParams, params)
    res = pipeline.sink(p.bind, p.flow, _trace_path(trace_path, "pipe-sink"))
    e = res["end_to_end_ns"]
    click.echo(
        json.dumps(res)
        if as_json
        else f"received {res['unique']:,} messages (lost {res['lost']}, duplicates {res['duplicates']}, reordered {res['reordered']}); end to end p50 {format_ns(e.get('p50') or 0)}"
    )
    return 0


@probe.command("sync-serve", hidden=True)
@click.option("--bind", default="0.0.0.0:9319", show_default=True, help="HOST:PORT the responder listens on.")
@click.option("--trace", "trace_path", type=click.Path(dir_okay=False), default=None, help="Trace file [default: runs/<time>-sync-serve/sync-serve.lstrace].")
@click.option("--json", "as_json", is_flag=True, help="Print `ready`, then exactly one JSON object when stopped.")
@prints("loopscope.probes.clocksync:ServeJson")
def probe_sync_serve(bind: str, trace_path: str | None, as_json: bool) -> int:
    """Clock-sync responder (the reference host): answer probes, keep kernel stamps; until Ctrl-C."""

    bind = build(SyncServeParams, {"bind": bind}).bind
    res = clocksync.serve(bind, _trace_path(trace_path, "sync-serve"))
    click.echo(
        json.dumps(res)
        if as_json
        else f"answered {res['answered']:,} of {res['received']:,} probes ({res['no_tx_stamp']} without a TX stamp, {res['malformed']} malformed)"
    )
    return 0


@probe.command("sync", hidden=True)
@options(SyncParams, skip=("gap_ns",))
@click.option("--gap", type=Duration(), default="20us", show_default=True, help="Gap between the two probes of a pair.")
@click.option("--duration", "-d", type=Duration(), default=None, help="Stop after this long [default: until Ctrl-C].")
@click.option("--trace", "trace_path", type=click.Path(dir_okay=False), default=None, help="Trace file [default: runs/<time>-sync/sync.lstrace].")
@click.option("--json", "as_json", is_flag=True, help="Print `ready` once started, then exactly one JSON object.")
@prints("loopscope.probes.clocksync:ProbeJson")
def probe_sync(gap: int, duration: int | None, trace_path: str | None, as_json: bool, **params: object) -> int:
    """Clock-sync initiator: coded probe pairs to the reference, kernel stamps both ways."""

    p = build(SyncParams, {**params, "gap_ns": gap})
    if as_json:
        # the lab pauses the initiators between probe steps only once they are past
        # their imports: a signal in the middle of those would end them
        click.echo("ready")
    res = clocksync.probe(p.dest, p.flow, p.rate, p.gap_ns, duration, _trace_path(trace_path, "sync"))
    click.echo(
        json.dumps(res)
        if as_json
        else f"{res['pairs']:,} pairs to {p.dest}: {res['answered']:,} answered, {res['lost']} lost; best round trip {format_ns(rtt) if (rtt := res['min_rtt_ns']) is not None else 'none (no pair came back)'}"
    )
    return EXIT_INTERRUPTED if res["interrupted"] else 0


@probe.command("rr")
@options(RrParams)
@click.option("--tcp", is_flag=True, help="Same as --transport tcp; the server is `probe echo --tcp`.")
@click.option("--duration", "-d", type=Duration(), default="5s", show_default=True, help="How long to send requests.")
@click.option("--pattern", "pattern_text", default="cbr", show_default=True, help="cbr | poisson | onoff:ON/OFF.")
@click.option("--trace", "trace_path", type=click.Path(dir_okay=False), default=None, help="Trace file [default: runs/<time>-rr/rr.lstrace].")
@click.option("--json", "as_json", is_flag=True, help="Print exactly one JSON object.")
@prints("loopscope.probes.netjson:RrJson")
def probe_rr(tcp: bool, duration: int, pattern_text: str, trace_path: str | None, as_json: bool, **params: object) -> int:
    """Stimulus-response client: RTT per exchange and, on one clock, both one-way legs.

    The options are the experiment file's fields of an rr probe (``dest``
    here is always the echo server's HOST:PORT).

    \b
    Examples:
      loopscope probe rr --dest 127.0.0.1:7000 --rate 1000pps -d 10s
      loopscope probe rr --dest 10.0.0.2:7000 --tcp --size 256 --json
    """

    p = build(RrParams, {**params, **({"transport": "tcp"} if tcp else {})})
    dest = p.dest
    j = net.rr(p, duration, pattern_text=pattern_text, trace_path=_trace_path(trace_path, "rr"))
    if as_json:
        click.echo(json.dumps(j))
    else:
        con = _console()
        con.print(f"{j['answered']:,} of {j['sent']:,} requests answered ({j['lost']:,} lost) by {dest}")
        legs = {
            "rtt_ns": j["rtt_ns"],
            "forward_ns": j["forward_ns"],
            "return_ns": j["return_ns"],
            "server_turnaround_ns": j["server_turnaround_ns"],
            "client_end_host_ns": j["client_end_host_ns"],
        }
        for k, d in legs.items():
            if d and d.get("n"):
                con.print(f"{k[:-3].replace('_', ' ')}: p50 {format_ns(d['p50'])}, p99 {format_ns(d['p99'])}, max {format_ns(d['max'])}")
        if j.get("note"):
            con.print(f"note: {j['note']}")
        if j["trace"]:
            click.echo(j["trace"])
    return EXIT_INTERRUPTED if j["interrupted"] else 0


@probe.command("bulk")
@click.option("--dest", required=True, help="Sink HOST:PORT (loopscope probe recv [--tcp]).")
@click.option("--rate", "rate_text", default=None, help="Bit rate [unlimited].")
@click.option("--duration", "-d", type=Duration(), default="10s", show_default=True, help="How long to stream.")
@click.option("--tcp", is_flag=True, help="A TCP stream (default: UDP datagrams).")
@click.option("--size", type=int, default=None, help="Write size (TCP, default 64 KiB) or datagram size (UDP, default 1400).")
@click.option("--json", "as_json", is_flag=True, help="Print exactly one JSON object.")
@prints("loopscope.probes.netjson:BulkJson")
def probe_bulk(dest: str, rate_text: str | None, duration: int, tcp: bool, size: int | None, as_json: bool) -> int:
    """Bulk stream as competing network load (the role ettcp played in Boie & Niehaus 2007).

    \b
    Examples:
      loopscope probe bulk --dest 127.0.0.1:9000 --rate 200Mbit -d 10s
      loopscope probe bulk --dest 10.0.0.2:9000 --tcp --json
    """

    net.hostport(dest, "--dest")
    if tcp:
        bps = None
        if rate_text:
            bps = net.rate(rate_text, 1).bps
            if bps is None:
                raise InputError("--rate: a TCP stream takes a bit rate, e.g. 500Mbit")
        b, el, err = _native.net_bulk_tcp(dest, duration, bps, size or 65536)
        if err:
            raise RunError(f"bulk TCP stream to {dest}: {err}")
        rate_bps = b * 8 / (el / 1e9) if el else 0.0
        out: BulkJson = {"bytes": b, "elapsed_ns": el, "bps": rate_bps, "protocol": "tcp"}
    else:
        sz = size or 1400
        res = net.send(dest, rate_text=rate_text or "100Gbit", size=sz, duration_ns=duration, tx_timestamps=False, records=False, trace_path=None)
        rate_bps = res.sent_bps
        out = {"bytes": res.sent * sz, "elapsed_ns": res.elapsed_ns, "bps": rate_bps, "protocol": "udp", "kept_up": res.kept_up if rate_text else None}
    click.echo(json.dumps(out) if as_json else f"{out['protocol']} bulk to {dest}: {out['bytes']:,} bytes, {format_bps(rate_bps)}")
    return 0
