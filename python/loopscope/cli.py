"""The ``loopscope`` command.

Subcommands map onto the package: ``probe`` (measure), ``trace`` (inspect
trace files), ``bench`` (loopscope against its floor and its peers). Every
error ends the same way: ``loopscope: error: <what>; <what to do>`` on
stderr and exit code 2 for bad input, 1 for a failed run, 130 for Ctrl-C;
never a traceback for a user's mistake.
"""

from __future__ import annotations

import datetime as _dt
import json
import shlex
import os
import signal
import sys
from pathlib import Path
from typing import Any

import click

from loopscope.errors import EXIT_FAILED, EXIT_INPUT, EXIT_INTERRUPTED, InputError, LoopscopeError, RunError
from loopscope.units import format_bps, format_ns, parse_duration_ns


class Duration(click.ParamType):
    """A duration with a unit: 10s, 500ms, 2m."""

    name = "duration"

    def convert(self, value: Any, param: click.Parameter | None, ctx: click.Context | None) -> int:
        if isinstance(value, int):
            return value
        try:
            return parse_duration_ns(value)
        except ValueError as e:
            self.fail(str(e), param, ctx)


class CpuList(click.ParamType):
    """CPU numbers: 1, or 0,2, or 0-3."""

    name = "cpus"

    def convert(self, value: Any, param: click.Parameter | None, ctx: click.Context | None) -> list[int]:
        if isinstance(value, list):
            return value
        out: list[int] = []
        try:
            for part in str(value).split(","):
                if "-" in part:
                    a, b = part.split("-", 1)
                    out.extend(range(int(a), int(b) + 1))
                elif part.strip():
                    out.append(int(part))
        except ValueError:
            self.fail(f"{value!r} is not a CPU list; write e.g. 1, 0,2 or 0-3", param, ctx)
        return out


def _console() -> Any:
    """A rich console; 120 columns when the output is not a terminal (pipes, CI logs)."""
    from rich.console import Console

    return Console(highlight=False, width=None if sys.stdout.isatty() else 120)


def _default_run_dir(name: str) -> Path:
    stamp = _dt.datetime.now().strftime("%Y%m%d-%H%M%S")
    d = Path("runs") / f"{stamp}-{name}"
    n = 1
    while d.exists():
        n += 1
        d = Path("runs") / f"{stamp}-{name}-{n}"
    return d


@click.group(context_settings={"help_option_names": ["-h", "--help"], "max_content_width": 100})
@click.version_option(None, "--version", package_name="loopscope", prog_name="loopscope")
def cli() -> None:
    """Measure how late soft-real-time work gets on this machine, how often, and why."""


# ---- probe ---------------------------------------------------------------------


@cli.group()
def probe() -> None:
    """Measure the machine with one probe, standalone."""


@probe.command("timer")
@click.option("--interval-us", type=click.IntRange(min=1), default=1000, show_default=True, help="Wake-up period in µs.")
@click.option("--duration", type=Duration(), default="10s", show_default=True, help="How long to measure (10s, 500ms, 2m).")
@click.option("--threads", type=int, default=1, show_default=True, help="Measuring threads.")
@click.option("--cpu", "cpus", type=CpuList(), default=None, help="Pin threads to these CPUs, round-robin (1, 0,2, 0-3).")
@click.option("--priority", type=int, default=None, help="SCHED_FIFO priority 1..99 (needs CAP_SYS_NICE; default: SCHED_OTHER).")
@click.option("--mlock/--no-mlock", default=True, show_default=True, help="Lock memory (mlockall) so page faults do not add latency.")
@click.option("--dma-latency", "dma_latency", type=int, default=None, help="Hold /dev/cpu_dma_latency at this many µs during the run, as cyclictest does with 0 (default: leave idle states alone).")
@click.option("--trace", "trace_path", type=click.Path(dir_okay=False), default=None, help="Trace file [default: runs/<time>-timer/timer.lstrace].")
@click.option("--json", "as_json", is_flag=True, help="Print exactly one JSON object.")
def probe_timer(interval_us: int, duration: int, threads: int, cpus: list[int] | None, priority: int | None, mlock: bool, dma_latency: int | None, trace_path: str | None, as_json: bool) -> int:
    """Timer wake-up latency on absolute deadlines (what cyclictest measures).

    Every wake-up goes into the trace as an interval from its deadline to when
    the thread ran; deadlines that passed while a wake-up was late are counted
    as missed.
    """
    from loopscope.probes import timer

    interval_ns = interval_us * 1000
    timer.validate(interval_ns, duration, threads, cpus or [], priority, dma_latency)
    res = timer.run(interval_ns, duration, threads=threads, cpus=cpus, priority=priority, mlock=mlock, dma_latency_us=dma_latency, trace_path=_trace_path(trace_path, "timer"))
    if as_json:
        click.echo(json.dumps(res.to_json()))
    else:
        _print_timer(res)
    return EXIT_INTERRUPTED if res.interrupted else 0


def _ci(e: Any) -> str:
    lo = "open" if e.lo is None else format_ns(e.lo)
    hi = "open" if e.hi is None else format_ns(e.hi)
    return f"[{lo}, {hi}]"


def _print_timer(res: Any) -> None:
    from rich.table import Table

    con = _console()
    s = res.summary
    sched = res.threads[0].sched if res.threads else "?"
    title = (
        f"timer latency · interval {format_ns(res.interval_ns)} · {format_ns(res.elapsed_ns)} · "
        f"{len(res.threads)} thread{'s' if len(res.threads) != 1 else ''} · {sched} · "
        f"{'mlockall' if res.mlock_ok else 'memory not locked'}"
    )
    con.print(title)
    t = Table(show_edge=False)
    t.add_column("", style="bold")
    t.add_column("latency", justify="right")
    t.add_column("95% CI", justify="right")
    t.add_row("samples", f"{res.samples:,}", "")
    t.add_row("missed", f"{res.missed:,}", "deadlines skipped" if res.missed else "")
    if s.n:
        t.add_row("min", format_ns(s.min), "")
        t.add_row("avg", format_ns(s.mean.value), _ci(s.mean))
        t.add_row("p50", format_ns(s.p50.value), _ci(s.p50))
        t.add_row("p99", format_ns(s.p99.value), _ci(s.p99))
        t.add_row("p99.9", format_ns(s.p999.value), _ci(s.p999))
        t.add_row("max", format_ns(s.max), "")
    con.print(t)
    if len(res.threads) > 1:
        for th in res.threads:
            ts = th.summary
            cpu = f"cpu {th.cpu}" if th.cpu is not None else "any cpu"
            if ts.n:
                con.print(f"  thread {th.index} (tid {th.tid}, {cpu}): p50 {format_ns(ts.p50.value)}, p99 {format_ns(ts.p99.value)}, max {format_ns(ts.max)}, missed {th.missed}")
    for th in res.threads:
        if not th.sched_ok:
            con.print(f"[yellow]note:[/] thread {th.index}: {th.sched}")
        if th.cpu is not None and not th.affinity_ok:
            con.print(f"[yellow]note:[/] thread {th.index}: pinning to CPU {th.cpu} was refused")
    if not res.mlock_ok:
        con.print(f"[yellow]note:[/] {res.mlock}")
    if not res.dma_latency_ok:
        con.print(f"[yellow]note:[/] {res.dma_latency}")
    elif "held" in res.dma_latency:
        con.print(f"power management: {res.dma_latency}")
    if res.kept_samples < res.samples:
        con.print(f"[yellow]note:[/] statistics from the first {res.kept_samples:,} of {res.samples:,} samples (memory cap)")
    con.print(f"probe overhead: one clock read, {res.overhead_ns:.0f} ns, is part of every latency")
    _trace_line(con, res)


def _trace_path(trace_path: str | None, name: str) -> str:
    if trace_path is not None:
        return trace_path
    d = _default_run_dir(name)
    d.mkdir(parents=True, exist_ok=True)
    return str(d / f"{name}.lstrace")


@probe.command("sched")
@click.option("--duration", type=Duration(), default="10s", show_default=True, help="How long to measure.")
@click.option("--busy-threads", type=int, default=2, show_default=True, help="Threads spinning next to the measured one.")
@click.option("--sleep-us", type=click.IntRange(min=1), default=1000, show_default=True, help="How long the measured thread sleeps each cycle.")
@click.option("--work-us", type=click.IntRange(min=1), default=1000, show_default=True, help="How long its burst of work takes alone.")
@click.option("--cpu", "cpus", type=CpuList(), default=None, help="Pin the threads to these CPUs (measured thread first).")
@click.option("--work-iters", type=click.IntRange(min=1), default=None, help="Burst size from an earlier --calibrate-only run (with --alone-ns).")
@click.option("--alone-ns", type=click.IntRange(min=1), default=None, help="The burst's time alone from that run.")
@click.option("--calibrate-only", is_flag=True, help="Only size the burst and time it alone; print that and stop.")
@click.option("--trace", "trace_path", type=click.Path(dir_okay=False), default=None, help="Trace file [default: runs/<time>-sched/sched.lstrace].")
@click.option("--json", "as_json", is_flag=True, help="Print exactly one JSON object.")
def probe_sched(duration: int, busy_threads: int, sleep_us: int, work_us: int, cpus: list[int] | None, work_iters: int | None, alone_ns: int | None, calibrate_only: bool, trace_path: str | None, as_json: bool) -> int:
    """Scheduler responsiveness: a thread alternating sleep and work next to busy threads (Paul et al. 2003)."""
    from loopscope.probes import sched

    sched.validate(duration, busy_threads, sleep_us * 1000, work_us * 1000, cpus or [])
    res = sched.run(
        duration, busy_threads=busy_threads, sleep_ns=sleep_us * 1000, work_ns=work_us * 1000, cpus=cpus,
        work_iters=work_iters, alone_ns=alone_ns, calibrate_only=calibrate_only,
        trace_path=None if calibrate_only else _trace_path(trace_path, "sched"),
    )
    if as_json:
        click.echo(json.dumps(res.to_json()))
    else:
        from rich.table import Table

        con = _console()
        con.print(f"scheduler responsiveness · {busy_threads} busy threads · sleep {format_ns(res.sleep_ns)} / work {format_ns(res.work_ns)} · {res.cycles:,} cycles")
        t = Table(show_edge=False)
        t.add_column("")
        for c in ("p50", "p99", "max", "avg (95% CI)"):
            t.add_column(c, justify="right")
        for name, s in (("wake-up delay", res.wake), ("extra completion", res.extra)):
            if s.n:
                t.add_row(name, format_ns(s.p50.value), format_ns(s.p99.value), format_ns(s.max), f"{format_ns(s.mean.value)} {_ci(s.mean)}")
        con.print(t)
        con.print(f"burst alone: {format_ns(res.alone_ns)} (fastest of 21, before the busy threads started); total extra time over the run: {format_ns(res.total_extra_ns)}")
        _trace_line(con, res)
    return EXIT_INTERRUPTED if res.interrupted else 0


@probe.command("syscall")
@click.option("--calls", default=None, help="Comma-separated calls [default: all: getpid, clock_gettime, open, close, read, write, stat, link, unlink, socket, sendto, recvfrom, mmap, munmap]; "
              "read, write, sendto and recvfrom also take a size in bytes (read:4096).")
@click.option("--batch", type=int, default=200, show_default=True, help="Calls per timed batch.")
@click.option("--target", type=float, default=5.0, show_default=True, help="Stop a call when its 95% CI half-width is within this % of the mean.")
@click.option("--max-batches", type=int, default=2000, show_default=True, help="Cap on batches per call.")
@click.option("--max-seconds", type=float, default=5.0, show_default=True, help="Cap on time per call.")
@click.option("--dir", "workdir", type=click.Path(file_okay=False), default=None, help="Where the probe's scratch files go [system temp dir].")
@click.option("--trace", "trace_path", type=click.Path(dir_okay=False), default=None, help="Trace file [default: runs/<time>-syscall/syscall.lstrace].")
@click.option("--json", "as_json", is_flag=True, help="Print exactly one JSON object.")
def probe_syscall(calls: str | None, batch: int, target: float, max_batches: int, max_seconds: float, workdir: str | None, trace_path: str | None, as_json: bool) -> int:
    """Cost of each system call, in batches until its 95% CI is within --target % (Carlinet et al. 2000)."""
    from loopscope.probes import syscall

    names = [c.strip() for c in calls.split(",") if c.strip()] if calls else None
    syscall.validate(names or syscall.CALLS, batch, target / 100, max_batches)
    res = syscall.run(calls=names, batch=batch, target_rel=target / 100, max_batches=max_batches, max_seconds=max_seconds, workdir=workdir, trace_path=_trace_path(trace_path, "syscall"))
    if as_json:
        click.echo(json.dumps(res.to_json()))
    else:
        from rich.table import Table

        con = _console()
        con.print(f"system-call cost · batches of {batch} · until the 95% CI is within {target:g}% of the mean")
        t = Table(show_edge=False)
        for c, j in (("call", "left"), ("mean", "right"), ("95% CI", "right"), ("batches", "right"), ("", "left")):
            t.add_column(c, justify=j)  # type: ignore[arg-type]
        for c in res.calls:
            t.add_row(c.name, format_ns(c.mean_ns), f"±{format_ns(c.ci_half_ns)}", f"{c.batches:,}", "" if c.converged else "[yellow]not converged (cap)[/]")
        con.print(t)
        con.print(f"probe overhead: two clock reads per batch, {res.clock_read_ns * 2 / batch:.2f} ns per call, included")
        _trace_line(con, res)
    return EXIT_INTERRUPTED if res.interrupted else 0


@probe.command("send")
@click.option("--dest", required=True, help="Receiver HOST:PORT.")
@click.option("--rate", "rate_text", required=True, help="Payload bit rate (200Mbit, 1Gb/s) or packet rate (1000pps).")
@click.option("--size", type=int, default=1400, show_default=True, help="UDP payload bytes per packet (48..65507).")
@click.option("--duration", type=Duration(), default=None, help="How long to send (or --count).")
@click.option("--count", type=click.IntRange(min=1), default=None, help="How many packets to send.")
@click.option("--pattern", "pattern_text", default="cbr", show_default=True, help="cbr | poisson | onoff:ON/OFF | replay:FILE.")
@click.option("--seed", type=int, default=1, show_default=True, help="Seed of the poisson pattern.")
@click.option("--workers", type=int, default=1, show_default=True, help="Sending threads sharing one schedule.")
@click.option("--flow", type=int, default=1, show_default=True, help="Flow id carried by every packet.")
@click.option("--tx-timestamps/--no-tx-timestamps", default=True, show_default=True, help="Kernel TX timestamps (SO_TIMESTAMPING) into the trace.")
@click.option("--packet-records/--no-packet-records", default=True, show_default=True, help="One trace record per packet.")
@click.option("--trace", "trace_path", type=click.Path(dir_okay=False), default=None, help="Trace file [default: runs/<time>-send/send.lstrace].")
@click.option("--json", "as_json", is_flag=True, help="Print exactly one JSON object.")
def probe_send(dest: str, rate_text: str, size: int, duration: int | None, count: int | None, pattern_text: str, seed: int, workers: int, flow: int,
               tx_timestamps: bool, packet_records: bool, trace_path: str | None, as_json: bool) -> int:
    """Paced UDP sender: departures on absolute deadlines, says if it could not keep up."""
    from loopscope.probes import net

    r0 = net.rate(rate_text, size)
    warn = net.obvious_shortfall(r0, workers)
    if warn:
        sys.stderr.write(f"loopscope: warning: {warn}\n")
    res = net.send(dest, rate_text=rate_text, size=size, duration_ns=duration, count=count, pattern_text=pattern_text, seed=seed, workers=workers,
                   flow=flow, tx_timestamps=tx_timestamps, records=packet_records, trace_path=_trace_path(trace_path, "send"))
    j = res.to_json()
    if as_json:
        click.echo(json.dumps(j))
    else:
        con = _console()
        d = j["departure_err_ns"]
        con.print(f"sent {j['sent']:,} packets of {size} bytes to {dest}: {format_bps(j['sent_bps'])} of {format_bps(j['requested_bps'])} requested ({pattern_text}, {workers} worker{'s' if workers > 1 else ''})")
        if d:
            con.print(f"departure error: p50 {format_ns(d['p50'])}, p99 {format_ns(d['p99'])}, p99.9 {format_ns(d['p999'])}, max {format_ns(d['max'])}")
        con.print(f"kernel TX timestamps: {j['tx_timestamps']['sched']:,} at the queue, {j['tx_timestamps']['software']:,} at the driver; {j['batches']:,} send calls, largest batch {j['largest_batch']}")
        _trace_line(con, res)
    if j["shortfall"]:
        sys.stderr.write(f"loopscope: warning: {j['shortfall']}\n")
    return EXIT_INTERRUPTED if res.interrupted else 0


@probe.command("recv")
@click.option("--bind", required=True, help="HOST:PORT to receive on (port 0: any).")
@click.option("--duration", type=Duration(), default=None, help="Stop after this long.")
@click.option("--idle", type=Duration(), default=None, help="Stop when nothing arrived for this long (after the first packet).")
@click.option("--count", type=click.IntRange(min=1), default=None, help="Stop after this many packets.")
@click.option("--tcp", is_flag=True, help="Be a TCP sink for bulk streams instead (counts bytes).")
@click.option("--rcvbuf-mib", type=click.IntRange(min=1, max=4096), default=32, show_default=True, help="Socket receive buffer.")
@click.option("--packet-records/--no-packet-records", default=True, show_default=True, help="One trace record per packet (off: histograms only, fixed memory).")
@click.option("--trace", "trace_path", type=click.Path(dir_okay=False), default=None, help="Trace file [default: runs/<time>-recv/recv.lstrace].")
@click.option("--json", "as_json", is_flag=True, help="Print exactly one JSON object.")
def probe_recv(bind: str, duration: int | None, idle: int | None, count: int | None, tcp: bool, rcvbuf_mib: int, packet_records: bool, trace_path: str | None, as_json: bool) -> int:
    """Receiver with kernel RX timestamps: loss, duplicates, reordering, throughput, delays split."""
    from loopscope import _native
    from loopscope.probes import net

    net.hostport(bind, "--bind")
    if tcp:
        b, conns = _native.net_sink_tcp(bind, duration)
        out = {"bytes": b, "connections": conns, "bind": bind}
        click.echo(json.dumps(out) if as_json else f"received {b:,} bytes over {conns} TCP connection(s)")
        return 0
    if duration is None and idle is None and count is None:
        sys.stderr.write("loopscope: receiving until Ctrl-C (give --duration, --idle or --count to stop by itself)\n")
    res = net.recv(bind, duration_ns=duration, idle_ns=idle, count=count, records=packet_records, rcvbuf=rcvbuf_mib << 20, trace_path=_trace_path(trace_path, "recv"))
    j = res.to_json()
    if as_json:
        click.echo(json.dumps(j))
    else:
        con = _console()
        t = j["throughput"]
        con.print(f"received {j['packets']:,} packets on {j['bound']}: lost {j['lost']:,}, duplicates {j['duplicates']:,}, reordered {j['reordered']:,}, malformed {j['malformed']:,}")
        if t["bps"]:
            cv = t["cv_per_second"]
            con.print(f"throughput {format_bps(t['bps'])}" + (f", per-second CV {cv * 100:.3f}%" if cv is not None else ""))
        for name, d in j["delay_ns"].items():
            if d.get("n") and d.get("p50") is not None:
                con.print(f"{name.replace('_', ' ')} delay: p50 {format_ns(d['p50'])}, p99 {format_ns(d['p99']) if d.get('p99') is not None else 'over range'}, max {format_ns(d['max'])}")
        con.print(f"kernel RX timestamps on {j['kernel_timestamps']:,} packets ({j['hardware_timestamps']:,} from hardware); socket buffer drops: {j['socket_buffer_drops']:,}")
        _trace_line(con, res)
    return EXIT_INTERRUPTED if j["interrupted"] else 0


@probe.command("echo")
@click.option("--bind", required=True, help="HOST:PORT to answer on.")
@click.option("--tcp", is_flag=True, help="Answer over TCP connections (default: UDP datagrams).")
@click.option("--duration", type=Duration(), default=None, help="Stop after this long [until Ctrl-C].")
@click.option("--json", "as_json", is_flag=True, help="Print `ready` once listening, then exactly one JSON object when stopped.")
def probe_echo(bind: str, tcp: bool, duration: int | None, as_json: bool) -> int:
    """Echo server for `probe rr`: answers each request at once with its kernel RX and its own times."""
    from loopscope import _native
    from loopscope.probes import net

    net.hostport(bind, "--bind")
    r = _native.net_echo(bind, duration, tcp, sys.stdout.fileno() if as_json else None)
    click.echo(json.dumps(r) if as_json else f"answered {r['requests']:,} requests ({r['malformed']:,} malformed messages ignored)")
    return EXIT_INTERRUPTED if r["interrupted"] else 0


@probe.command("pipe-source")
@click.option("--dest", required=True, help="First stage HOST:PORT (a node, or the sink).")
@click.option("--rate", "rate_text", default="1000pps", show_default=True, help="Messages per second (1000pps).")
@click.option("--size", type=int, default=256, show_default=True, help="Message bytes; 56 + 24 per node at least.")
@click.option("--duration", type=Duration(), default=None, help="How long to send (or --count).")
@click.option("--count", type=click.IntRange(min=1), default=None, help="How many messages.")
@click.option("--flow", type=int, default=1, show_default=True, help="Pipeline id carried by every message (the sink keeps only its own).")
@click.option("--trace", "trace_path", type=click.Path(dir_okay=False), default=None, help="Trace file [default: runs/<time>-pipe-source/pipe-source.lstrace].")
@click.option("--json", "as_json", is_flag=True, help="Print exactly one JSON object.")
def probe_pipe_source(dest: str, rate_text: str, size: int, duration: int | None, count: int | None, flow: int, trace_path: str | None, as_json: bool) -> int:
    """Source of a distributed pipeline: paced messages through the nodes to the sink."""
    from loopscope.probes import net, pipeline

    net.hostport(dest, "--dest")
    r = net.rate(rate_text, size)
    if r.bps is not None:
        raise InputError(f"--rate: a pipeline's rate is messages per second, like 1000pps [got {rate_text}]")
    if size < 56 or size > 65000:
        raise InputError(f"--size: must be 56..65000 bytes [got {size}]")
    if duration is None and count is None:
        raise InputError("give --duration or --count")
    res = pipeline.source(dest, r, size, flow, count, duration, _trace_path(trace_path, "pipe-source"))
    click.echo(json.dumps(res) if as_json else f"sent {res['sent']:,} messages to {dest} ({res['send_errors']} send errors); departure late p99 {format_ns(res['late_ns'].get('p99') or 0)}")
    return EXIT_INTERRUPTED if res["interrupted"] else 0


@probe.command("pipe-node")
@click.option("--bind", required=True, help="HOST:PORT this node listens on.")
@click.option("--next", "next_hop", required=True, help="HOST:PORT of the next stage.")
@click.option("--work-us", type=click.IntRange(min=0, max=1_000_000), default=0, show_default=True, help="Busy work per message, µs.")
@click.option("--trace", "trace_path", type=click.Path(dir_okay=False), default=None, help="Trace file [default: runs/<time>-pipe-node/pipe-node.lstrace].")
@click.option("--json", "as_json", is_flag=True, help="Print `ready`, then exactly one JSON object when stopped.")
def probe_pipe_node(bind: str, next_hop: str, work_us: int, trace_path: str | None, as_json: bool) -> int:
    """Processing node of a pipeline: receive, work, append stamps, forward; until Ctrl-C."""
    from loopscope.probes import net, pipeline

    net.hostport(bind, "--bind")
    net.hostport(next_hop, "--next")
    res = pipeline.node(bind, next_hop, work_us, _trace_path(trace_path, "pipe-node"))
    click.echo(json.dumps(res) if as_json else f"forwarded {res['forwarded']:,} of {res['received']:,} messages ({res['malformed']} malformed, {res['full']} full, {res['send_errors']} send errors)")
    return 0


@probe.command("pipe-sink")
@click.option("--bind", required=True, help="HOST:PORT the sink listens on.")
@click.option("--flow", type=int, default=1, show_default=True, help="Pipeline id to record.")
@click.option("--trace", "trace_path", type=click.Path(dir_okay=False), default=None, help="Trace file [default: runs/<time>-pipe-sink/pipe-sink.lstrace].")
@click.option("--json", "as_json", is_flag=True, help="Print `ready`, then exactly one JSON object when stopped.")
def probe_pipe_sink(bind: str, flow: int, trace_path: str | None, as_json: bool) -> int:
    """Sink of a pipeline: one trace record per message with every hop's stamps; until Ctrl-C."""
    from loopscope.probes import net, pipeline

    net.hostport(bind, "--bind")
    res = pipeline.sink(bind, flow, _trace_path(trace_path, "pipe-sink"))
    e = res["end_to_end_ns"]
    click.echo(json.dumps(res) if as_json else f"received {res['unique']:,} messages (lost {res['lost']}, duplicates {res['duplicates']}, reordered {res['reordered']}); end to end p50 {format_ns(e.get('p50') or 0)}")
    return 0


@probe.command("program", context_settings={"ignore_unknown_options": True, "allow_interspersed_args": False})
@click.option("--duration", type=Duration(), default=None, help="Stop the program (SIGINT) after this long; with --until exit, the time it may take before it is stopped and the probe fails.")
@click.option("--until", type=click.Choice(["duration", "exit"]), default=None, help="End the probe when the duration is up [default when --duration is given] or when the program exits [otherwise].")
@click.option("--cpu", "cpus", type=CpuList(), default=None, help="Pin the program to these CPUs.")
@click.option("--env", "env", multiple=True, help="NAME=VALUE for the program's environment (repeatable).")
@click.option("--cwd", type=click.Path(file_okay=False), default=None, help="The program's working directory [this one].")
@click.option("--trace", "trace_path", type=click.Path(dir_okay=False), default=None, help="Trace file the program writes (its LOOPSCOPE_TRACE) [default: runs/<time>-program/program.lstrace].")
@click.option("--json", "as_json", is_flag=True, help="Print exactly one JSON object.")
@click.argument("command", nargs=-1, required=True, type=click.UNPROCESSED)
def probe_program(duration: int | None, until: str | None, cpus: list[int] | None, env: tuple[str, ...], cwd: str | None, trace_path: str | None, as_json: bool, command: tuple[str, ...]) -> int:
    """Run an instrumented program (after --) as a probe: it writes its own
    trace (LOOPSCOPE_TRACE); every interval it logs is summarised here and,
    in a run, compared across phases and attributed like a built-in probe's."""
    from loopscope.errors import InputError
    from loopscope.probes import program

    extra = {}
    for e in env:
        k, eq, v = e.partition("=")
        if not eq or not k:
            raise InputError(f"--env {e!r}: expected NAME=VALUE")
        extra[k] = v
    mode = until or ("duration" if duration else "exit")
    res = program.run(list(command), _trace_path(trace_path, "program"), duration if mode == "duration" else None, mode, duration if mode == "exit" else None, extra, cpus, cwd)
    if as_json:
        click.echo(json.dumps(res))
        return 0
    con = _console()
    con.print(f"{shlex.join(command)}: {res['exit']}, stopped at {res['stopped']}; {res['wall_ns'] / 1e9:.3f} s wall, {res['user_cpu_ns'] / 1e9:.3f} s user, {res['sys_cpu_ns'] / 1e9:.3f} s system")
    for iv in res["intervals"]:
        con.print(f"  {iv['entity']}: {iv['n']:,} intervals, p50 {format_ns(iv['p50_ns'])}, p99 {format_ns(iv['p99_ns'])}, max {format_ns(iv['max_ns'])}")
    for ent, n in res["events"].items():
        con.print(f"  {ent}: {n:,} events")
    con.print(f"trace: {res['trace']} ({res['records']:,} records, {res['lost_records']} lost)")
    if res.get("note"):
        con.print(f"note: {res['note']}")
    return 0


@probe.command("sync-serve")
@click.option("--bind", default="0.0.0.0:9319", show_default=True, help="HOST:PORT the responder listens on.")
@click.option("--trace", "trace_path", type=click.Path(dir_okay=False), default=None, help="Trace file [default: runs/<time>-sync-serve/sync-serve.lstrace].")
@click.option("--json", "as_json", is_flag=True, help="Print `ready`, then exactly one JSON object when stopped.")
def probe_sync_serve(bind: str, trace_path: str | None, as_json: bool) -> int:
    """Clock-sync responder (the reference host): answer probes, keep kernel stamps; until Ctrl-C."""
    from loopscope.probes import clocksync, net

    net.hostport(bind, "--bind")
    res = clocksync.serve(bind, _trace_path(trace_path, "sync-serve"))
    click.echo(json.dumps(res) if as_json else f"answered {res['answered']:,} of {res['received']:,} probes ({res['no_tx_stamp']} without a TX stamp, {res['malformed']} malformed)")
    return 0


@probe.command("sync")
@click.option("--dest", required=True, help="HOST:PORT of the reference host's responder.")
@click.option("--flow", type=click.IntRange(min=0, max=2**31), default=1, show_default=True, help="This host's id in the responder's records.")
@click.option("--rate", type=click.FloatRange(min=0.01, max=10000), default=20.0, show_default=True, help="Probe pairs per second.")
@click.option("--gap", type=Duration(), default="20us", show_default=True, help="Gap between the two probes of a pair.")
@click.option("--duration", type=Duration(), default=None, help="Stop after this long [default: until Ctrl-C].")
@click.option("--trace", "trace_path", type=click.Path(dir_okay=False), default=None, help="Trace file [default: runs/<time>-sync/sync.lstrace].")
@click.option("--json", "as_json", is_flag=True, help="Print exactly one JSON object.")
def probe_sync(dest: str, flow: int, rate: float, gap: int, duration: int | None, trace_path: str | None, as_json: bool) -> int:
    """Clock-sync initiator: coded probe pairs to the reference, kernel stamps both ways."""
    from loopscope.probes import clocksync, net

    net.hostport(dest, "--dest")
    res = clocksync.probe(dest, flow, rate, gap, duration, _trace_path(trace_path, "sync"))
    click.echo(json.dumps(res) if as_json else f"{res['pairs']:,} pairs to {dest}: {res['answered']:,} answered, {res['lost']} lost; best round trip {format_ns(res['min_rtt_ns'])}")
    return EXIT_INTERRUPTED if res["interrupted"] else 0


@probe.command("rr")
@click.option("--dest", required=True, help="Echo server HOST:PORT.")
@click.option("--rate", "rate_text", default="1000pps", show_default=True, help="Request rate (1000pps).")
@click.option("--duration", type=Duration(), default="5s", show_default=True)
@click.option("--size", type=int, default=64, show_default=True, help="Request size in bytes (at least 48).")
@click.option("--pattern", "pattern_text", default="cbr", show_default=True, help="cbr | poisson | onoff:ON/OFF.")
@click.option("--tcp", is_flag=True, help="Over one TCP connection (default: UDP datagrams); the server is `probe echo --tcp`.")
@click.option("--trace", "trace_path", type=click.Path(dir_okay=False), default=None, help="Trace file [default: runs/<time>-rr/rr.lstrace].")
@click.option("--json", "as_json", is_flag=True, help="Print exactly one JSON object.")
def probe_rr(dest: str, rate_text: str, duration: int, size: int, pattern_text: str, tcp: bool, trace_path: str | None, as_json: bool) -> int:
    """Stimulus-response client: RTT per exchange and, on one clock, both one-way legs."""
    from loopscope.probes import net

    j = net.rr(dest, rate_text=rate_text, duration_ns=duration, size=size, pattern_text=pattern_text, tcp=tcp, trace_path=_trace_path(trace_path, "rr"))
    if as_json:
        click.echo(json.dumps(j))
    else:
        con = _console()
        con.print(f"{j['answered']:,} of {j['sent']:,} requests answered ({j['lost']:,} lost) by {dest}")
        for k in ("rtt_ns", "forward_ns", "return_ns", "server_turnaround_ns", "client_end_host_ns"):
            d = j.get(k)
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
@click.option("--duration", type=Duration(), default="10s", show_default=True)
@click.option("--tcp", is_flag=True, help="A TCP stream (default: UDP datagrams).")
@click.option("--size", type=int, default=None, help="Write size (TCP, default 64 KiB) or datagram size (UDP, default 1400).")
@click.option("--json", "as_json", is_flag=True, help="Print exactly one JSON object.")
def probe_bulk(dest: str, rate_text: str | None, duration: int, tcp: bool, size: int | None, as_json: bool) -> int:
    """Bulk stream as competing network load (the role ettcp played in Boie & Niehaus 2007)."""
    from loopscope import _native
    from loopscope.probes import net

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
        out = {"bytes": b, "elapsed_ns": el, "bps": b * 8 / (el / 1e9) if el else 0.0, "protocol": "tcp"}
    else:
        sz = size or 1400
        res = net.send(dest, rate_text=rate_text or "100Gbit", size=sz, duration_ns=duration, tx_timestamps=False, records=False, trace_path=None)
        out = {"bytes": res.sent * sz, "elapsed_ns": res.elapsed_ns, "bps": res.sent_bps, "protocol": "udp", "kept_up": res.kept_up if rate_text else None}
    click.echo(json.dumps(out) if as_json else f"{out['protocol']} bulk to {dest}: {out['bytes']:,} bytes, {format_bps(out['bps'])}")
    return 0


def _trace_line(con: Any, res: Any) -> None:
    if res.interrupted:
        con.print("[yellow]interrupted:[/] the figures cover the time measured before Ctrl-C")
    if res.trace:
        lost = f", {res.trace_lost:,} lost" if res.trace_lost is not None else ""
        con.print(f"trace: {res.trace_records or 0:,} records{lost}")
        click.echo(res.trace)


# ---- experiments ---------------------------------------------------------------


@cli.command("run")
@click.argument("spec", type=click.Path())
@click.option("--results", default=None, help="Directory receiving the run directory [the spec's `results`, default runs/].")
@click.option("--run-dir", default=None, help="Exact run directory to create (must not exist).")
@click.option("--no-report", is_flag=True, help="Do not build the report at the end.")
@click.option("--duration", "duration_over", type=Duration(), default=None, help="Override the file's duration (per probe and phase), e.g. for a short trial.")
@click.option("--repetitions", "reps_over", type=click.IntRange(min=1, max=1000), default=None, help="Override the file's number of repetitions.")
def run_cmd(spec: str, results: str | None, run_dir: str | None, no_report: bool, duration_over: int | None, reps_over: int | None) -> int:
    """Run an experiment file: probes under each phase's loads, repeated; prints the run directory last."""
    from loopscope.lab import controller
    from loopscope.selfname import set_comm

    set_comm("ls-ctl")  # before the progress bar's thread starts: it takes this name

    if sys.stderr.isatty():
        from rich.console import Console
        from rich.progress import BarColumn, MofNCompleteColumn, Progress, TextColumn, TimeElapsedColumn

        bar = Progress(TextColumn("{task.description}"), BarColumn(), MofNCompleteColumn(), TimeElapsedColumn(), console=Console(stderr=True), transient=True)
        task = bar.add_task("starting", total=None)

        def say(msg: str) -> None:
            bar.console.print(msg, highlight=False)

        def tick(done: int, total: int, label: str) -> None:
            bar.update(task, completed=done, total=total, description=label)

        with bar:
            out = controller.run(spec, results=results, run_dir=run_dir, say=say, tick=tick, duration=duration_over, repetitions=reps_over)
    else:

        def say(msg: str) -> None:
            sys.stderr.write(msg + "\n")
            sys.stderr.flush()

        out = controller.run(spec, results=results, run_dir=run_dir, say=say, duration=duration_over, repetitions=reps_over)
    if out.status == "completed" and not no_report:
        from loopscope.report import build

        from loopscope.kinds import KINDS

        rep = build(out.run_dir, KINDS)
        for line in rep.summary_lines():
            click.echo(line)
        click.echo(f"report: {rep.html}")
    if out.status != "completed":
        sys.stderr.write(f"loopscope: error: run {out.status}: {out.error}\n  what was collected is kept in {out.run_dir}\n")
    click.echo(str(out.run_dir))
    return {"completed": 0, "interrupted": EXIT_INTERRUPTED}.get(out.status, EXIT_FAILED)


@cli.command("report")
@click.argument("run_dir", type=click.Path())
@click.option("--json", "as_json", is_flag=True, help="Print the comparisons as one JSON object.")
def report_cmd(run_dir: str, as_json: bool) -> int:
    """Build RUN/report.html (and RUN/tables/*.parquet) from a run directory."""
    from loopscope import progress
    from loopscope.kinds import KINDS
    from loopscope.report import build

    with progress.shown(not as_json):
        rep = build(Path(run_dir), KINDS)
    if as_json:
        click.echo(json.dumps(rep.to_json()))
    else:
        for line in rep.summary_lines():
            click.echo(line)
        click.echo(str(rep.html))
    return 0


@cli.command("timeline")
@click.argument("run_dir", type=click.Path())
@click.option("--probes", "use", type=click.Choice(["all", "pairs"]), default="all", show_default=True, help="Clock-sync probes the estimate uses: all, or only coded pairs whose gap survived.")
@click.option("--json", "as_json", is_flag=True, help="Print the clocks and checks as one JSON object.")
def timeline_cmd(run_dir: str, use: str, as_json: bool) -> int:
    """Put every record of every host on the reference host's clock: RUN/timeline.parquet."""
    from loopscope import timeline

    from loopscope.rundir import RunDir

    rd = RunDir.open(run_dir).path
    from loopscope import progress

    with progress.shown(not as_json):
        progress.step("timeline: estimating the clocks and placing every record")
        out = timeline.build(rd, use=use)
    if as_json:
        click.echo(json.dumps(out, default=float))
        return 0
    for line in timeline.summary_lines(out):
        click.echo(line)
    click.echo(str(rd / "timeline.parquet"))
    return 0


@cli.group("export")
def export_group() -> None:
    """Write a run in another tool's format."""


@export_group.command("perfetto")
@click.argument("run_dir", type=click.Path())
@click.option("-o", "--output", type=click.Path(dir_okay=False), default=None, help="Output file [RUN/trace.perfetto-trace].")
def export_perfetto(run_dir: str, output: str | None) -> int:
    """The global timeline as a Perfetto trace: a track per host and thread, slices, instants, counters."""
    from loopscope import timeline
    from loopscope.report import perfetto

    from loopscope.rundir import RunDir

    rd = RunDir.open(run_dir).path
    from loopscope import progress

    out = Path(output) if output else rd / "trace.perfetto-trace"
    with progress.shown():
        if not (rd / "timeline.parquet").exists() or (rd / "timeline.parquet").stat().st_mtime < (rd / "run.json").stat().st_mtime:
            progress.step("export: building the global timeline")
            timeline.build(rd)
        progress.step("export: writing the Perfetto trace")
        c = perfetto.export(rd, out)
    click.echo(f"{c['slices']:,} slices, {c['instants']:,} instants, {c['counters']:,} counter values on {c['tracks']} tracks ({c['bytes'] / 1e6:.1f} MB)"
               + (f"; {c['kernel_slices']:,} kernel slices around the outliers" if c.get("kernel_slices") else "")
               + (f"; not drawn: {c['not_placed']:,} records without a global time" if c["not_placed"] else "")
               + (f", {c['histograms']:,} histogram snapshots" if c["histograms"] else ""))
    click.echo(f"open it at https://ui.perfetto.dev: {out}")
    return 0


@cli.command("explain")
@click.argument("run_dir", type=click.Path())
@click.option("--quantile", type=click.FloatRange(0.5, 0.99999), default=0.99, show_default=True, help="Records above this quantile of their probe and phase are attributed.")
@click.option("--json", "as_json", is_flag=True, help="Print the result as one JSON object.")
def explain_cmd(run_dir: str, quantile: float, as_json: bool) -> int:
    """Why the outliers were late: each one's window split into causes from the run's kernel capture."""
    from loopscope.analysis import explain
    from loopscope.units import format_ns

    from loopscope.rundir import RunDir

    rd = RunDir.open(run_dir).path
    from loopscope import progress

    with progress.shown(not as_json):
        out = explain.explain(rd, quantile=quantile)
    if out is None:
        raise InputError(f"{run_dir}: the run has no kernel capture (kernel.capture was off, or tracefs or the privileges were missing: see its notes)")
    if as_json:
        click.echo(json.dumps(out, default=float))
        return 0
    for c in out["captures"]:
        if c.get("error"):
            click.echo(f"{c['host']}: {c['error']}")
            continue
        cost = (f"; perf used {c['perf_cpu_share'] * 100:.1f} % of a CPU" if c.get("perf_cpu_share") is not None
                else f"; the reader used {c['reader_cpu_share'] * 100:.1f} % of a CPU, {c.get('reads_during_windows') or 0} of its reads inside windows" if c.get("reader_cpu_share") is not None else "")
        size = f", {c['bytes_on_disk'] / 1e6:.1f} MB on disk ({c['bytes_per_s'] / 1e6:.2f} MB/s)" if c.get("bytes_per_s") else ""
        click.echo(f"kernel of {', '.join(c['covers'])}: {c['events']:,} events, {c['lost_events']:,} lost{size}{cost}")
        for p in c.get("problems") or []:
            click.echo(f"  capture: {p}")
    for g in out["groups"]:
        top = ", ".join(f"{x['cause']} {x['share'] * 100:.0f} %" for x in g["causes"][:4] if (x["share"] or 0) >= 0.005)
        top += f" · lab {g['lab_share'] * 100:.1f} %, loads {g['load_share'] * 100:.0f} %, system {g['system_share'] * 100:.0f} %" if "lab_share" in g else ""
        flag = "" if g["complete"] else f" (incomplete: {'; '.join(g['incomplete_why'])})"
        click.echo(f"  {g['probe']} · {g['phase']}: {g['outliers']} outliers above {format_ns(g['threshold_ns'])}: {top}{flag}")
    click.echo(f"attributed in {out['seconds']:.1f} s; {rd / 'tables' / 'attribution.parquet'}")
    return 0


@cli.command("schema")
def schema_cmd() -> int:
    """Print the JSON Schema of experiment files (for editors)."""
    import loopscope.kinds  # noqa: F401 - registers the probe kinds the schema lists
    from loopscope.spec import json_schema

    click.echo(json.dumps(json_schema(), indent=2))
    return 0


@cli.command("check")
@click.argument("spec", type=click.Path())
def check_cmd(spec: str) -> int:
    """Validate an experiment file and print its plan, without running it."""
    import loopscope.kinds  # noqa: F401 - registers the probe kinds
    from loopscope.spec import load
    from loopscope.spec.plan import estimate_seconds, phase_runs

    exp = load(spec)
    runs = phase_runs(exp)
    est = estimate_seconds(exp)
    about = f"{est / 60:.0f} min" if est >= 120 else f"{est:.0f} s"
    click.echo(f"{spec}: valid · {len(exp.probes)} probes × {len(exp.phases or [])} phases × {exp.repetitions} repetitions · at most about {about}")
    for pr in runs:
        loads = ", ".join(pr.phase.loads) or "no load"
        click.echo(f"  rep {pr.rep} · {pr.phase.name} ({loads}): {', '.join(p.name or p.kind for p in exp.probes)}")
    return 0


@cli.command("netem", hidden=False)
@click.option("--config", "config_path", required=True, type=click.Path(exists=True, dir_okay=False), help="Emulator configuration (JSON, written by the lab).")
@click.option("--trace", "trace_path", type=click.Path(dir_okay=False), default=None, help="Trace file of every forwarded packet.")
@click.option("--json", "as_json", is_flag=True, help="Print exactly one JSON object when stopped.")
def netem_cmd(config_path: str, trace_path: str | None, as_json: bool) -> int:
    """The user-space link emulator: forward between a router namespace's interfaces until Ctrl-C.

    The lab runs it inside the router namespace it creates; it prints `ready` once its
    interfaces are open and its counts when stopped."""
    from loopscope.lab.emulator import run_emulator

    res = run_emulator(config_path, trace_path)
    if as_json:
        click.echo(json.dumps(res))
    else:
        click.echo(f"{res['policy']}; {res['wait']}{'; ' + res['cpu_note'] if res['cpu_note'] else ''}")
        for l in res["links"]:
            if l.get("kernel"):
                click.echo(f"{l['name']}: the kernel's path (not forwarded here)")
                continue
            a = l["applied_ns"]
            click.echo(f"{l['name']}: in {l['packets_in']:,}, forwarded {l['forwarded']:,}, lost {l['lost']:,}, duplicated {l['duplicated']:,}, "
                       f"reordered {l['reordered']:,}, queue drops {l['queue_drops']:,}; applied p50 {a.get('p50')} ns")
        for p in res["ports"]:
            if p.get("socket_drops") or p.get("truncated"):
                click.echo(f"{p['ifname']} ({p['host']}): the kernel dropped {p['socket_drops']:,} frames before they were read; {p['truncated']:,} too long for a ring slot")
    return 0


@cli.command("cleanup")
@click.option("--dry-run", is_flag=True, help="Only say what would be removed.")
def cleanup_cmd(dry_run: bool) -> int:
    """Remove what killed runs left behind: processes, cgroups, state files."""
    from loopscope.lab import cleanup

    actions = cleanup.run(dry_run=dry_run)
    for a in actions:
        click.echo(a)
    if not actions:
        click.echo("nothing to clean up")
    return 0


# ---- trace ---------------------------------------------------------------------


@cli.group()
def trace() -> None:
    """Inspect trace files."""


def _existing(path: str) -> str:
    if not os.path.exists(path):
        raise InputError(f"{path}: no such file")
    return path


@trace.command("info")
@click.argument("file", type=click.Path())
@click.option("--json", "as_json", is_flag=True, help="Print one JSON object.")
def trace_info(file: str, as_json: bool) -> int:
    """Entities, counts, time span, lost records and damage of a trace."""
    from loopscope.trace import narrate, reader

    inf = reader.info(_existing(file))
    if as_json:
        click.echo(json.dumps(narrate.info_json(inf)))
    else:
        for line in narrate.info_lines(inf):
            click.echo(line)
    return 0


@trace.command("dump")
@click.argument("file", type=click.Path())
@click.option("--entity", default=None, help="Only this entity (group/name).")
@click.option("--limit", type=click.IntRange(min=0), default=None, help="At most this many records.")
@click.option("--file-order", is_flag=True, help="Keep file order (per thread) instead of sorting by time.")
def trace_dump(file: str, entity: str | None, limit: int | None, file_order: bool) -> int:
    """Narrate a trace, one record per line."""
    from loopscope.trace import narrate, reader

    df, inf = reader.read_with_info(_existing(file), sort=not file_order)
    df = narrate.select(df, inf, entity)
    out = sys.stdout
    for line in narrate.dump_lines(df, inf, limit):
        out.write(line + "\n")
    out.flush()
    return 0


# ---- bench ---------------------------------------------------------------------


@cli.group()
def channel() -> None:
    """Channels of time-sequenced items across hosts (the bench's two ends)."""


@channel.command("hub")
@click.option("--listen", required=True, help="HOST:PORT it serves on, TCP and UDP.")
@click.option("--channels", "spec", required=True, help='The channels it holds, JSON: [{"name", "capacity", "full", "max_item"}, ...].')
@click.option("--stats", "stats_path", type=click.Path(dir_okay=False), default=None, help="Write the final counts here (JSON).")
@click.option("--frag", type=click.IntRange(64, 65000), default=1400, show_default=True, help="UDP payload bytes per datagram.")
def channel_hub(listen: str, spec: str, stats_path: str | None, frag: int) -> int:
    """Host channels for other processes and hosts until SIGINT/SIGTERM, then write their counts.

    The lab runs one per host that holds channels declared in the experiment
    file; its trace (LOOPSCOPE_TRACE) gets the runtime's own records."""
    import signal

    from loopscope.channels import Hub
    from loopscope.errors import InputError
    from loopscope.trace import api

    try:
        decl = json.loads(spec)
        assert isinstance(decl, list) and all(isinstance(d, dict) and "name" in d for d in decl)
    except (ValueError, AssertionError):
        raise InputError(f"--channels: expected a JSON list of objects with a name [got {spec[:80]!r}]") from None
    stop = []
    signal.signal(signal.SIGINT, lambda *a: stop.append(1))
    signal.signal(signal.SIGTERM, lambda *a: stop.append(1))
    tr = api.open() if os.environ.get("LOOPSCOPE_TRACE") else None
    hub = Hub(listen=listen, frag=frag)
    chans = {d["name"]: hub.create(d["name"], int(d.get("capacity", 64)), d.get("full", "block"), int(d.get("max_item", 16 << 20))) for d in decl}
    click.echo(json.dumps({"listening": hub.address, "channels": list(chans)}), err=True)
    while not stop:
        hub.pump(0.2)
    out = {"address": hub.address, "channels": {n: c.stats() for n, c in chans.items()}, "net": hub.net_stats()}
    hub.close()
    if tr is not None:
        tr.close()
    if stats_path:
        Path(stats_path).write_text(json.dumps(out, indent=1) + "\n")
    click.echo(json.dumps(out))
    return 0


@channel.command("bench-serve")
@click.option("--transport", type=click.Choice(["tcp", "udp"]), required=True)
@click.option("--raw-bind", required=True, help="HOST:PORT of the raw echo server.")
@click.option("--chan-bind", required=True, help="HOST:PORT of the channel echo hub.")
@click.option("--reply-to", required=True, help="The client's hub HOST:PORT.")
@click.option("--frag", type=click.IntRange(64, 65000), default=1400, show_default=True, help="UDP payload bytes per datagram.")
@click.option("--cpu", "cpus", type=CpuList(), default=None, help="Pin to these CPUs.")
def channel_bench_serve(transport: str, raw_bind: str, chan_bind: str, reply_to: str, frag: int, cpus: list[int] | None) -> int:
    """Echo every item back, raw and through channels (the far end of `loopscope bench channels`); until Ctrl-C."""
    from loopscope import _native

    if cpus:
        os.sched_setaffinity(0, cpus)
    raw, chan = _native.chan_bench_serve(raw_bind, chan_bind, reply_to, transport, frag)
    click.echo(json.dumps({"raw_echoed": raw, "channel_echoed": chan}))
    return 0


@channel.command("bench-client")
@click.option("--transport", type=click.Choice(["tcp", "udp"]), required=True)
@click.option("--raw-dest", required=True, help="The raw echo server's HOST:PORT.")
@click.option("--chan-dest", required=True, help="The channel echo hub's HOST:PORT.")
@click.option("--bind", required=True, help="HOST:PORT of this end's hub.")
@click.option("--sizes", required=True, help="Item sizes in bytes, comma-separated.")
@click.option("--rounds", required=True, help="Timed round trips per block (one number, or one per size).")
@click.option("--blocks", type=click.IntRange(min=1), default=10, show_default=True, help="Blocks per size, raw and channel alternating.")
@click.option("--warmup", type=int, default=5, show_default=True, help="Untimed round trips at the start of each block.")
@click.option("--frag", type=click.IntRange(64, 65000), default=1400, show_default=True)
@click.option("--cpu", "cpus", type=CpuList(), default=None, help="Pin to these CPUs.")
def channel_bench_client(transport: str, raw_dest: str, chan_dest: str, bind: str, sizes: str, rounds: str, blocks: int, warmup: int, frag: int, cpus: list[int] | None) -> int:
    """Time ping-pong round trips per size, raw and channel blocks alternating; print one JSON list (a row per block)."""
    import numpy as np

    from loopscope import _native
    from loopscope.errors import InputError

    if cpus:
        os.sched_setaffinity(0, cpus)
    try:
        sz = [int(x) for x in sizes.split(",")]
        rn = [int(x) for x in rounds.split(",")]
    except ValueError:
        raise InputError(f"--sizes {sizes!r} / --rounds {rounds!r}: expected comma-separated integers") from None
    out = []
    for r in _native.chan_bench_client(raw_dest, chan_dest, bind, transport, sz, rn, blocks, warmup, frag):
        rtt = np.asarray(r["rtt_ns"])
        out.append({"mode": r["mode"], "block": r["block"], "size": r["size"], "n": int(len(rtt)), "elapsed_ns": int(r["elapsed_ns"]), "timeouts": int(r["timeouts"]), "rtt_ns": rtt.tolist()})
    click.echo(json.dumps(out))
    return 0


@cli.group()
def bench() -> None:
    """Benchmarks: loopscope against its floor and its peers, back to back."""


def _report(res: dict[str, Any], as_json: bool, human: Any) -> int:
    """A benchmark's result: one JSON object, or the human summary."""
    if as_json:
        click.echo(json.dumps(res))
    else:
        human(res)
    return 0


@bench.command("trace")
@click.option("--json", "as_json", is_flag=True, help="Print exactly one JSON object.")
@click.option("--quick", is_flag=True, help="Short runs (seconds, not minutes): for smoke tests, not for figures.")
@click.option("--write-seconds", type=float, default=None, help="Length of the sustained-write test [30, quick: 2].")
@click.option("--dir", "workdir", type=click.Path(file_okay=False), default=None, help="Where to write the benchmark traces [a temporary directory].")
def bench_trace(as_json: bool, quick: bool, write_seconds: float | None, workdir: str | None) -> int:
    """Cost per event (C, Rust, Python, two threads, disabled) against the raw floor and LTTng-UST."""
    from loopscope.bench import trace as bt

    return _report(bt.run(quick=quick, write_seconds=write_seconds, workdir=workdir, progress=None if as_json else click.echo), as_json, bt.print_human)


@bench.command("timer")
@click.option("--json", "as_json", is_flag=True, help="Print exactly one JSON object.")
@click.option("--interval-us", type=click.IntRange(min=1), default=1000, show_default=True)
@click.option("--duration", type=Duration(), default="10s", show_default=True, help="Length of each run.")
@click.option("--runs", type=click.IntRange(min=1), default=3, show_default=True, help="Runs of each tool, alternating.")
def bench_timer(as_json: bool, interval_us: int, duration: int, runs: int) -> int:
    """The timer probe against cyclictest -m -i N, alternating runs."""
    from loopscope.bench import timer as bt

    return _report(bt.run(interval_us=interval_us, duration_ns=duration, runs=runs, progress=None if as_json else click.echo), as_json, bt.print_human)


@bench.command("pacing")
@click.option("--json", "as_json", is_flag=True, help="Print exactly one JSON object.")
@click.option("--quick", is_flag=True, help="Short runs: for smoke tests, not for figures.")
@click.option("--seconds", type=float, default=None, help="Length of each rate's run [5, quick: 2].")
def bench_pacing(as_json: bool, quick: bool, seconds: float | None) -> int:
    """The UDP sender against iperf3 on loopback: achieved rate, per-second CV, departure error."""
    from loopscope.bench import pacing

    return _report(pacing.run(quick=quick, seconds=seconds, progress=None if as_json else click.echo), as_json, pacing.print_human)


@bench.command("emulator")
@click.option("--json", "as_json", is_flag=True, help="Print exactly one JSON object.")
@click.option("--quick", is_flag=True, help="Short runs: for smoke tests, not for figures.")
@click.option("--runs", type=click.IntRange(min=1), default=None, help="Rounds of every measurement [3, quick: 1].")
@click.option("--seconds", type=float, default=None, help="Length of each stream [5, quick: 1].")
@click.option("--rate-seconds", type=float, default=None, help="Length of each packet-rate trial [5, quick: 1].")
def bench_emulator(as_json: bool, quick: bool, runs: int | None, seconds: float | None, rate_seconds: float | None) -> int:
    """The link emulator against kernel forwarding: delay error at 10 kpps (sleeping and busy-polling), loss against its binomial
    interval, a lab path that asks for nothing, the highest packet rate against the kernel's, lab up/down."""
    from loopscope.bench import emulator

    return _report(emulator.run(quick=quick, runs=runs, seconds=seconds, rate_seconds=rate_seconds, progress=None if as_json else click.echo), as_json, emulator.print_human)


@bench.command("clocksync")
@click.option("--json", "as_json", is_flag=True, help="Print exactly one JSON object.")
@click.option("--quick", is_flag=True, help="Short runs: for smoke tests, not for figures.")
@click.option("--seconds", type=float, default=None, help="Length of each condition's run [60, quick: 10].")
@click.option("--network", "networks", type=click.Choice(["sync", "experiment"]), multiple=True, help="Which network the probes take (repeat for both) [both].")
def bench_clocksync(as_json: bool, quick: bool, seconds: float | None, networks: tuple[str, ...]) -> int:
    """Clock sync against injected offsets and drifts, idle and loaded, on the sync network and on the experiment's:
    error, bound, drift; NTP's filter on the same probes."""
    from loopscope.bench import clocksync

    return _report(clocksync.run(quick=quick, seconds=seconds, networks=networks or clocksync.NETWORKS, progress=None if as_json else click.echo), as_json, clocksync.print_human)


@bench.command("kcapture")
@click.option("--json", "as_json", is_flag=True, help="Print exactly one JSON object.")
@click.option("--quick", is_flag=True, help="Short runs: for smoke tests, not for figures.")
@click.option("--runs", type=click.IntRange(min=1), default=None, help="Runs with and without capture, alternating [timer-idle 5, pipeline-busy 10; quick: 2].")
@click.option("--seconds", type=float, default=None, help="Length of each run [timer-idle 10, pipeline-busy 5; quick: 2].")
@click.option("--scenario", "scenarios", type=click.Choice(["timer-idle", "pipeline-busy"]), multiple=True, help="Scenarios to run [both].")
@click.option("--designs", is_flag=True, help="pipeline-busy also with the designs the capture was chosen against: a reader reading continuously at SCHED_IDLE, and perf record.")
def bench_kcapture(as_json: bool, quick: bool, runs: int | None, seconds: float | None, scenarios: tuple[str, ...], designs: bool) -> int:
    """What kernel capture costs the probes: an idle timer and a pipeline under a network flood, with and without capture, alternating.

    \b
    Examples:
      loopscope bench kcapture --json
      loopscope bench kcapture --scenario pipeline-busy --designs
    """
    from loopscope.bench import kcapture

    return _report(kcapture.run(quick=quick, runs=runs, seconds=seconds, scenarios=list(scenarios) or None, designs=designs, progress=None if as_json else click.echo), as_json, kcapture.print_human)


@bench.command("channels")
@click.option("--json", "as_json", is_flag=True, help="Print exactly one JSON object.")
@click.option("--quick", is_flag=True, help="Short runs, three sizes: for smoke tests, not for figures.")
@click.option("--blocks", type=click.IntRange(min=1), default=None, help="Block pairs per size, raw and channel alternating [20, quick: 4].")
@click.option("--transport", "transports", type=click.Choice(["tcp", "udp"]), multiple=True, help="Transports to measure [tcp and udp].")
@click.option("--placement", type=click.Choice(["split", "same"]), default="split", show_default=True, help="split: client on CPU 0, server on CPU 1 (each hop wakes a CPU); same: both on CPU 0.")
def bench_channels(as_json: bool, quick: bool, blocks: int | None, transports: tuple[str, ...], placement: str) -> int:
    """What a channel costs: put → get ping-pong between two netns hosts against raw TCP and UDP, 1 KiB to 1 MiB."""
    from loopscope.bench import channels

    return _report(channels.run(quick=quick, blocks=blocks, transports=list(transports) or None, placement=placement, progress=None if as_json else click.echo), as_json, channels.print_human)


@bench.command("lab")
@click.option("--json", "as_json", is_flag=True, help="Print exactly one JSON object.")
@click.option("--quick", is_flag=True, help="Short runs: for smoke tests, not for figures.")
@click.option("--runs", type=click.IntRange(min=1), default=None, help="Runs of each measurement [5, quick: 2].")
@click.option("--demo", default=None, help="Experiment whose report is timed [examples/demo.yaml].")
def bench_lab(as_json: bool, quick: bool, runs: int | None, demo: str | None) -> int:
    """What the lab costs: agent start to probe start, report time, timer through the lab vs alone."""
    from loopscope.bench import lab

    return _report(lab.run(quick=quick, runs=runs, demo=demo, progress=None if as_json else click.echo), as_json, lab.print_human)


@bench.command("model")
@click.option("--json", "as_json", is_flag=True, help="Print exactly one JSON object.")
@click.option("--quick", is_flag=True, help="Few runs: for smoke tests, not for figures.")
@click.option("--runs", type=click.IntRange(min=2), default=None, help="Runs of each program per condition, the conditions taking turns run by run [100, quick: 4].")
def bench_model(as_json: bool, quick: bool, runs: int | None) -> int:
    """Portable CPU-time models: predict three programs idle → memory load and idle → I/O load, then measure them there."""
    from loopscope.bench import model

    return _report(model.run(quick=quick, runs=runs, progress=None if as_json else click.echo), as_json, model.print_human)


# ---- calibrate / model ----------------------------------------------------------------


@cli.group()
def calibrate() -> None:
    """Calibrate a node (system-call and execution-environment costs, per load) or an application."""


@calibrate.command("node")
@click.option("--loads", default="", help="Load conditions besides idle, comma-separated: cpu, memory, io, each optionally :PROCESSES (memory:2).")
@click.option("--calls", default=None, help="System calls to measure, comma-separated, a size for the ones that move data (read:4096) "
              "[every call the syscall probe knows, and read, write, sendto, recvfrom at a few sizes].")
@click.option("--sizes", default=None, help="With the default calls: the sizes (bytes, comma-separated) read, write, sendto and recvfrom are "
              "calibrated at [read/write 64,4096,65536; sendto/recvfrom 256,1400,16384].")
@click.option("--max-seconds-per-call", type=click.FloatRange(0.1, 600), default=2.0, show_default=True)
@click.option("--cpu", "cpus", type=CpuList(), default=None, help="Measure on these CPUs (calibrate apps with the same --cpu).")
@click.option("--load-cpu", "load_cpus", type=CpuList(), default=None, help="Run the load workers on these CPUs.")
@click.option("-o", "--output", type=click.Path(dir_okay=False), required=True, help="Write the node model (JSON) here.")
def calibrate_node(loads: str, calls: str | None, sizes: str | None, max_seconds_per_call: float, cpus: list[int] | None, load_cpus: list[int] | None,
                   output: str) -> int:
    """Measure what this machine charges for each system call and for two execution environments, idle and under each load."""
    from loopscope.model import node
    from loopscope.probes import syscall

    for x in [x for x in loads.split(",") if x]:
        node.parse_load(x)
    if calls and sizes:
        raise InputError("--sizes applies to the default calls; with --calls give each size in the call (read:4096)")
    names = [c for c in calls.split(",") if c] if calls else node.default_calls(node.parse_sizes(sizes) if sizes else None)
    syscall.validate(names, 200, 0.03, 10)
    m = node.calibrate([x for x in loads.split(",") if x], calls=names,
                       max_seconds_per_call=max_seconds_per_call, say=lambda t: click.echo(t, err=True), cpus=cpus, load_cpus=load_cpus)
    Path(output).write_text(json.dumps(m) + "\n")
    for cond, c in m["conditions"].items():
        env = ", ".join(f"{k} {v['mean_ns']:.2f} ± {v['ci95_half_ns']:.2f} ns/op" for k, v in c["environments"].items())
        click.echo(f"{cond}: {len(c['syscalls'])} calls; {env}")
        for k, ch in (m["changes"].get(cond) or {}).get("syscalls", {}).items():
            if ch["significant"]:
                click.echo(f"  {k}: {ch['ratio']:.2f}x [{ch['ci95'][0]:.2f}, {ch['ci95'][1]:.2f}]")
    click.echo(f"node model: {output}")
    return 0


@calibrate.command("app", context_settings={"ignore_unknown_options": True, "allow_interspersed_args": False})
@click.option("--runs", type=click.IntRange(min=2), default=200, show_default=True, help="Timed runs (Carlinet et al. 2000 used 200).")
@click.option("--traced-runs", type=click.IntRange(min=0), default=3, show_default=True, help="Further runs under perf trace, for the system-call structure.")
@click.option("--node", "node_path", type=click.Path(dir_okay=False), default=None, help="The node model of this machine (recorded in the app model).")
@click.option("--condition", default="idle", show_default=True, help="The node model's condition the app runs under now.")
@click.option("--environment", type=click.Choice(["cpython", "compiled"]), default=None, help="Its execution environment [cpython for python commands, else compiled].")
@click.option("--cpu", "cpus", type=CpuList(), default=None, help="Run it on these CPUs (as the node was calibrated).")
@click.option("-o", "--output", type=click.Path(dir_okay=False), required=True, help="Write the app model (JSON) here.")
@click.argument("command", nargs=-1, type=click.UNPROCESSED)
def calibrate_app(runs: int, traced_runs: int, node_path: str | None, condition: str, environment: str | None, cpus: list[int] | None, output: str,
                  command: tuple[str, ...]) -> int:
    """Run a program repeatedly: its CPU time (total, user, system) and its system-call structure, as an app model."""
    from loopscope.model import app, node

    nm = node.read(node_path) if node_path else None
    if nm is not None:
        node.condition(nm, condition, node_path or "")
    m = app.calibrate(list(command), runs, traced_runs, nm, node_path, condition, env_kind=environment, say=lambda t: click.echo(t, err=True), cpus=cpus)
    Path(output).write_text(json.dumps(m) + "\n")
    t = m["cpu"]["total"]
    click.echo(f"{m['command'][0]}: CPU {t['mean_ns'] / 1e6:.2f} ms mean, p95 {t['p95_ns'] / 1e6:.2f}, p99 {t['p99_ns'] / 1e6:.2f} "
               f"(user {m['cpu']['user']['mean_ns'] / 1e6:.2f}, system {m['cpu']['system']['mean_ns'] / 1e6:.2f}) over {runs} runs; "
               f"{m['syscalls'].get('calls_per_run', 0):.0f} system calls per run, {len(m['syscalls'].get('states') or {})} kinds")
    click.echo(f"app model: {output}")
    return 0


@cli.group("model")
def model_group() -> None:
    """Carry an app model from one node or condition to another."""


def _node_ref(text: str) -> tuple[dict[str, Any], dict[str, Any], str]:
    from loopscope.model import node

    path, _, cond = text.partition(":")
    m = node.read(path)
    return m, node.condition(m, cond or None, path), f"{path}:{cond or 'idle'}"


def _from_of(a: dict[str, Any], src: str | None, app_model: str) -> str:
    """--from, or the node the app model was calibrated against."""
    from loopscope.errors import InputError

    if src:
        return src
    n = a.get("node") or {}
    if not n.get("path"):
        raise InputError(f"{app_model}: calibrated without --node, so give --from NODE_MODEL[:CONDITION]")
    return f"{n['path']}:{n.get('condition') or 'idle'}"


@model_group.command("predict")
@click.argument("app_model", type=click.Path(dir_okay=False))
@click.option("--from", "src", default=None, help="NODE_MODEL[:CONDITION] the app was calibrated on [the one its model names].")
@click.option("--to", "dst", required=True, help="NODE_MODEL[:CONDITION] to predict for.")
@click.option("--json", "as_json", is_flag=True)
def model_predict(app_model: str, src: str | None, dst: str, as_json: bool) -> int:
    """Predict the app's CPU time distribution on another node or under another condition."""
    from loopscope.model import app, predict

    a = app.read(app_model)
    _, ca, na = _node_ref(_from_of(a, src, app_model))
    _, cb, nb = _node_ref(dst)
    p = predict.predict(a, ca, cb)
    if as_json:
        click.echo(json.dumps({"from": na, "to": nb, **p}))
        return 0
    click.echo(f"{' '.join(a['command'])}: {na} → {nb}")
    click.echo(f"  CPU mean {p['from_mean_ns'] / 1e6:.2f} ms → {p['pred_mean_ns'] / 1e6:.2f} ms [{p['pred_mean_ci95_ns'][0] / 1e6:.2f}, {p['pred_mean_ci95_ns'][1] / 1e6:.2f}], "
               f"p95 {p['pred_p95_ns'] / 1e6:.2f} ms, p99 {p['pred_p99_ns'] / 1e6:.2f} ms")
    u, s = p["user_ratio"], p["sys_ratio"]
    click.echo(f"  user ({p['user_share'] * 100:.0f} % of it, {p['environment']}) × {u['ratio']:.3f} [{u['ci95'][0]:.3f}, {u['ci95'][1]:.3f}]; "
               f"system × {s['ratio']:.3f} [{s['ci95'][0]:.3f}, {s['ci95'][1]:.3f}] from {len(s['calls_used'])} calls"
               + (f", {s['priced_by_size_share'] * 100:.0f} % of its calls priced at the sizes they moved" if s.get("priced_by_size_share") else "")
               + (f", {s['unmodelled_share'] * 100:.0f} % of its calls have no counterpart in the node model" if s.get("unmodelled_share") else ""))
    for lim in p["limits"]:
        click.echo(f"  not seen: {lim}")
    return 0


@model_group.command("show")
@click.argument("model_file", type=click.Path(dir_okay=False))
@click.option("--top", type=click.IntRange(min=1), default=12, show_default=True, help="States (calls) to list.")
def model_show(model_file: str, top: int) -> int:
    """Print a node or app model: costs per condition, or an app's CPU time and call structure."""
    from loopscope.errors import InputError

    try:
        kind = json.loads(Path(model_file).read_text()).get("format")
    except (OSError, ValueError, AttributeError):
        kind = None
    if kind == "loopscope-node-model":
        from loopscope.model import node

        m = node.read(model_file)
        click.echo(f"node model of {m['machine'].get('host')} ({(m['machine'].get('cpu') or {}).get('model')}), {m['created']}")
        conds = list(m["conditions"])
        click.echo(f"  {'cost (typical batch)':<22}" + "".join(f"{c:>14}" for c in conds))

        def cost(part: str, c: str, k: str) -> float:
            x = m["conditions"][c][part].get(k)
            return float(x.get("typical_ns", x["median_ns"])) if x else float("nan")

        rows = [("env " + k, [cost("environments", c, k) for c in conds]) for k in m["conditions"]["idle"]["environments"]]
        rows += [(k, [cost("syscalls", c, k) for c in conds]) for k in m["conditions"]["idle"]["syscalls"]]
        for name, vals in rows:
            marks = []
            for c, v in zip(conds, vals):
                ch = (m["changes"].get(c) or {})
                part = ch.get("environments" if name.startswith("env ") else "syscalls", {}).get(name.removeprefix("env "))
                marks.append(f"{v:>12.1f}{'*' if part and part['significant'] else ' '} ")
            click.echo(f"  {name:<22}" + "".join(marks))
        click.echo("  (ns per call or per operation; * = significantly different from idle)")
        return 0
    if kind == "loopscope-app-model":
        from loopscope.model import app

        a = app.read(model_file)
        t = a["cpu"]["total"]
        click.echo(f"{' '.join(a['command'])} ({a['environment']}), {len(a['runs']['user_ns'])} runs, node {a['node'].get('path')}:{a['node'].get('condition')}")
        click.echo(f"  CPU mean {t['mean_ns'] / 1e6:.2f} ms, p95 {t['p95_ns'] / 1e6:.2f}, p99 {t['p99_ns'] / 1e6:.2f}, min {t['min_ns'] / 1e6:.2f}, max {t['max_ns'] / 1e6:.2f}; "
                   f"user {a['cpu']['user']['mean_ns'] / 1e6:.2f} ms, system {a['cpu']['system']['mean_ns'] / 1e6:.2f} ms")
        sc = a["syscalls"]
        if not sc.get("states"):
            click.echo(f"  no call structure: {sc.get('note', 'not traced')}")
            return 0
        click.echo(f"  {sc['calls_per_run']:.0f} calls per run on {sc['threads_per_run']:.1f} threads; between calls p50 {sc['gap_p50_ns'] / 1e3:.1f} µs, p99 {sc['gap_p99_ns'] / 1e3:.1f} µs"
                   + (f"; {sc['lost_events']} events lost by the tracer" if sc.get("lost_events") else ""))
        click.echo(f"  {'call':<18}{'per run':>9}{'p50':>10}{'p99':>10}{'bytes':>10}  next")
        for name, st in list(sc["states"].items())[:top]:
            nxt = ", ".join(f"{k} {v * 100:.0f}%" for k, v in list(st["next"].items())[:3])
            nb = f"{st['bytes_mean']:>10.0f}" if st.get("bytes_mean") is not None else f"{'':>10}"
            click.echo(f"  {name:<18}{st['per_run']:>9.1f}{st['dur_p50_ns'] / 1e3:>8.1f}µs{st['dur_p99_ns'] / 1e3:>8.1f}µs{nb}  {nxt}")
        if len(sc["states"]) > top:
            click.echo(f"  … {len(sc['states']) - top} more kinds of call (--top)")
        return 0
    raise InputError(f"{model_file}: not a node or app model (they are written by `loopscope calibrate node|app`)")


@model_group.command("check")
@click.argument("app_model", type=click.Path(dir_okay=False))
@click.option("--from", "src", default=None, help="NODE_MODEL[:CONDITION] the app was calibrated on [the one its model names].")
@click.option("--to", "dst", required=True, help="NODE_MODEL[:CONDITION] of this machine as it is now.")
@click.option("--runs", type=click.IntRange(min=2), default=50, show_default=True)
@click.option("--json", "as_json", is_flag=True)
def model_check(app_model: str, src: str | None, dst: str, runs: int, as_json: bool) -> int:
    """Run the app here now and compare its CPU time with the prediction."""
    import numpy as np

    from loopscope.model import app, predict

    a = app.read(app_model)
    _, ca, na = _node_ref(_from_of(a, src, app_model))
    _, cb, nb = _node_ref(dst)
    p = predict.predict(a, ca, cb)
    r = app.run_many(a["command"], runs, cpus=a.get("cpus"))
    cpu = np.asarray(r["user_ns"], dtype=float) + np.asarray(r["sys_ns"], dtype=float)
    meas = {"meas_mean_ns": float(cpu.mean()), "meas_p95_ns": float(np.percentile(cpu, 95)), "meas_p99_ns": float(np.percentile(cpu, 99))}
    err = {"err_mean_pct": 100 * (p["pred_mean_ns"] / meas["meas_mean_ns"] - 1), "err_p99_pct": 100 * (p["pred_p99_ns"] / meas["meas_p99_ns"] - 1)}
    if as_json:
        click.echo(json.dumps({"from": na, "to": nb, **p, **meas, **err}))
        return 0
    click.echo(f"{' '.join(a['command'])}: {na} → {nb}, {runs} runs now")
    click.echo(f"  mean: predicted {p['pred_mean_ns'] / 1e6:.2f} ms, measured {meas['meas_mean_ns'] / 1e6:.2f} ms ({err['err_mean_pct']:+.1f} %)")
    click.echo(f"  p99:  predicted {p['pred_p99_ns'] / 1e6:.2f} ms, measured {meas['meas_p99_ns'] / 1e6:.2f} ms ({err['err_p99_pct']:+.1f} %)")
    return 0


# ---- entry point -----------------------------------------------------------------


def _fail(msg: str, code: int) -> int:
    sys.stderr.write(f"loopscope: error: {msg}\n")
    return code


def _terminate(signum: int, frame: object) -> None:
    # SIGTERM ends a run the way Ctrl-C does: stop, keep what was measured, clean up.
    raise KeyboardInterrupt


def main(argv: list[str] | None = None) -> None:
    from loopscope.selfname import from_env

    from_env()  # a lab component started by an agent names itself (clock-sync probes: ls-sync)
    if os.environ.get("LOOPSCOPE_PDEATHSIG") == "1":
        # Started by an agent: die with it, whatever kills it.
        from loopscope.host.procs import die_with_parent

        if not die_with_parent():
            sys.exit(EXIT_FAILED)
    signal.signal(signal.SIGTERM, _terminate)
    # A shell starts background commands with SIGINT ignored; loopscope's
    # servers are stopped with it, so take it back.
    signal.signal(signal.SIGINT, signal.default_int_handler)
    try:
        rv = cli.main(args=argv, prog_name="loopscope", standalone_mode=False)
        code = rv if isinstance(rv, int) else 0
    except click.UsageError as e:
        if type(e).__name__ == "NoArgsIsHelpError":
            click.echo(e.ctx.get_help() if e.ctx else "", err=True)
            sys.exit(EXIT_INPUT)
        cmd = e.ctx.command_path if e.ctx else "loopscope"
        code = _fail(f"{e.format_message()}; see '{cmd} --help'", EXIT_INPUT)
    except click.ClickException as e:
        code = _fail(e.format_message(), e.exit_code)
    except click.Abort:
        sys.stderr.write("loopscope: interrupted\n")
        code = EXIT_INTERRUPTED
    except KeyboardInterrupt:
        sys.stderr.write("loopscope: interrupted\n")
        code = EXIT_INTERRUPTED
    except LoopscopeError as e:
        code = _fail(str(e), e.exit_code)
    except BrokenPipeError:
        # `loopscope trace dump F | head`: the reader went away; not an error.
        try:
            sys.stdout = open(os.devnull, "w")
        except OSError:
            pass
        code = 0
    except OSError as e:
        code = _fail(f"{e.filename or ''}: {e.strerror}" if e.filename else str(e), EXIT_FAILED)
    sys.exit(code)


if __name__ == "__main__":
    main()
