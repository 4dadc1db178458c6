"""Commands the lab starts, not users: `netem` (the link emulator) and `channel` (hubs, the channel benchmark's ends)."""

from __future__ import annotations

import json
import os
import signal
from pathlib import Path

import click

from loopscope.errors import InputError
from loopscope.cli.base import CpuList, Duration, _console, _default_run_dir, cli, prints  # noqa: F401
from loopscope.cli.show import _ci, _print_timer, _report, _trace_line, _trace_path  # noqa: F401
from loopscope.lab.emulator import run_emulator
from loopscope.channels import Hub
from loopscope.trace import api
from loopscope import _native
import numpy as np


@cli.command("netem", hidden=True)
@click.option("--config", "config_path", required=True, type=click.Path(exists=True, dir_okay=False), help="Emulator configuration (JSON, written by the lab).")
@click.option("--trace", "trace_path", type=click.Path(dir_okay=False), default=None, help="Trace file of every forwarded packet.")
@click.option("--json", "as_json", is_flag=True, help="Print exactly one JSON object when stopped.")
@prints("loopscope.rundir:EmulatorResult")
def netem_cmd(config_path: str, trace_path: str | None, as_json: bool) -> int:
    """The user-space link emulator: forward between a router namespace's interfaces until Ctrl-C.

    The lab runs it inside the router namespace it creates; it prints `ready` once its
    interfaces are open and its counts when stopped."""

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
            click.echo(
                f"{l['name']}: in {l['packets_in']:,}, forwarded {l['forwarded']:,}, lost {l['lost']:,}, duplicated {l['duplicated']:,}, "
                f"reordered {l['reordered']:,}, queue drops {l['queue_drops']:,}; applied p50 {a.get('p50')} ns"
            )
        for p in res["ports"]:
            if p.get("socket_drops") or p.get("truncated"):
                click.echo(
                    f"{p['ifname']} ({p['host']}): the kernel dropped {p['socket_drops']:,} frames before they were read; {p['truncated']:,} too long for a ring slot"
                )
    return 0


@cli.group(hidden=True)
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
@click.option("--transport", type=click.Choice(["tcp", "udp"]), required=True, help="Transport of the channels measured.")
@click.option("--raw-bind", required=True, help="HOST:PORT of the raw echo server.")
@click.option("--chan-bind", required=True, help="HOST:PORT of the channel echo hub.")
@click.option("--reply-to", required=True, help="The client's hub HOST:PORT.")
@click.option("--frag", type=click.IntRange(64, 65000), default=1400, show_default=True, help="UDP payload bytes per datagram.")
@click.option("--cpu", "cpus", type=CpuList(), default=None, help="Pin to these CPUs.")
def channel_bench_serve(transport: str, raw_bind: str, chan_bind: str, reply_to: str, frag: int, cpus: list[int] | None) -> int:
    """Echo every item back, raw and through channels (the far end of `loopscope bench channels`); until Ctrl-C."""

    if cpus:
        os.sched_setaffinity(0, cpus)
    raw, chan = _native.chan_bench_serve(raw_bind, chan_bind, reply_to, transport, frag)
    click.echo(json.dumps({"raw_echoed": raw, "channel_echoed": chan}))
    return 0


@channel.command("bench-client")
@click.option("--transport", type=click.Choice(["tcp", "udp"]), required=True, help="Transport of the channels measured.")
@click.option("--raw-dest", required=True, help="The raw echo server's HOST:PORT.")
@click.option("--chan-dest", required=True, help="The channel echo hub's HOST:PORT.")
@click.option("--bind", required=True, help="HOST:PORT of this end's hub.")
@click.option("--sizes", required=True, help="Item sizes in bytes, comma-separated.")
@click.option("--rounds", required=True, help="Timed round trips per block (one number, or one per size).")
@click.option("--blocks", type=click.IntRange(min=1), default=10, show_default=True, help="Blocks per size, raw and channel alternating.")
@click.option("--warmup", type=int, default=5, show_default=True, help="Untimed round trips at the start of each block.")
@click.option("--frag", type=click.IntRange(64, 65000), default=1400, show_default=True, help="UDP payload bytes per datagram.")
@click.option("--cpu", "cpus", type=CpuList(), default=None, help="Pin to these CPUs.")
def channel_bench_client(
    transport: str, raw_dest: str, chan_dest: str, bind: str, sizes: str, rounds: str, blocks: int, warmup: int, frag: int, cpus: list[int] | None
) -> int:
    """Time ping-pong round trips per size, raw and channel blocks alternating; print one JSON list (a row per block)."""

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
        out.append(
            {
                "mode": r["mode"],
                "block": r["block"],
                "size": r["size"],
                "n": int(len(rtt)),
                "elapsed_ns": int(r["elapsed_ns"]),
                "timeouts": int(r["timeouts"]),
                "rtt_ns": rtt.tolist(),
            }
        )
    click.echo(json.dumps(out))
    return 0
