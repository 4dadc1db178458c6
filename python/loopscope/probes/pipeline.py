"""The distributed pipeline's three roles and the table of its messages.

``source`` paces messages to the first stage, ``node`` forwards them with
its stamps appended, ``sink`` records each one (``crates/probes/src/net/
pipe.rs``). Node and sink print ``ready`` on standard output once they are
listening, then their JSON when stopped (SIGINT/SIGTERM), so the lab can
start a pipeline back to front and the source last.

``messages`` decodes the sink's trace into one row per message: the
source's scheduled and send times, each node's kernel RX, application RX
and send times, the sink's kernel RX and application RX (CLOCK_REALTIME
ns), and derived per-hop columns:

- ``hop<k>_net_ns``: previous stage's send → this stage's kernel RX (wire,
  both kernels, the emulator; hop 0 leaves the source, the last hop
  arrives at the sink);
- ``node<k>_stack_ns``: kernel RX → application at node k (socket queueing
  and wake-up);
- ``node<k>_work_ns``: application RX → send at node k;
- ``e2e_ns``: source send → sink application receive;
- ``source_late_ns``: source send − its schedule.

On one machine all stamps share one clock; across machines they differ by
the hosts' clock offsets until the clock-sync step maps them.
"""

from __future__ import annotations

import os
import sys
from typing import Any

import numpy as np

from loopscope import _native
from loopscope.probes.common import Envelope, TraceInfo, envelope, traced
from loopscope.rundir import HistQuantiles
from loopscope.probes.net import Rate, hist_quantiles
from loopscope.probes.params import Launch, PipeNodeParams, PipeSinkParams, PipeSourceParams


class SourceJson(Envelope):
    """What the pipeline's source says when it stops."""

    dest: str
    rate_pps: float
    size: int
    flow: int
    sent: int
    send_errors: int
    late_ns: HistQuantiles
    elapsed_ns: int
    interrupted: bool
    trace: TraceInfo


class NodeJson(Envelope):
    """What a node says when it stops: its counts and residence (kernel RX to send)."""

    bind: str
    next: str
    work_us: int
    received: int
    forwarded: int
    malformed: int
    full: int
    send_errors: int
    no_kernel_ts: int
    elapsed_ns: int
    interrupted: bool
    residence_ns: HistQuantiles
    trace: TraceInfo


class SinkJson(Envelope):
    """What the sink says when it stops: sequence accounting and end-to-end delay."""

    bind: str
    flow: int
    received: int
    unique: int
    lost: int
    duplicates: int
    reordered: int
    malformed: int
    truncated: int
    no_kernel_ts: int
    first_seq: int
    max_seq: int
    hops_seen: list[int]
    elapsed_ns: int
    interrupted: bool
    end_to_end_ns: HistQuantiles
    trace: TraceInfo


def source(dest: str, rate: Rate, size: int, flow: int, count: int | None, duration_ns: int | None, trace_path: str | None, linger_ns: int = 0) -> SourceJson:
    """Send, then (``linger_ns``) sleep while the last messages travel: the
    source's own exit (its results, closing its trace, the interpreter's
    teardown: tens of ms of CPU) would otherwise compete with the stages
    still carrying them. The sleep is the sending thread's, before the
    native call returns: even turning its results into Python objects
    waits."""
    with traced(trace_path, ["pipe"]) as tr:
        r = _native.pipe_source(dest, flow, rate.pps_num, rate.pps_den, size, count, duration_ns, linger_ns)
    return {
        **envelope("pipe-source"),
        "dest": dest,
        "rate_pps": rate.pps,
        "size": size,
        "flow": flow,
        "sent": r["sent"],
        "send_errors": r["send_errors"],
        "late_ns": hist_quantiles(r["late"], r["hist_scale"]),
        "elapsed_ns": r["elapsed_ns"],
        "interrupted": r["interrupted"],
        "trace": {"path": tr.path, "records": tr.records, "lost": tr.lost},
    }


def node(bind: str, next_hop: str, work_us: int, trace_path: str | None) -> NodeJson:
    with traced(trace_path, ["pipe"]) as tr:
        sys.stdout.flush()
        r = _native.pipe_node(bind, next_hop, work_us * 1000, ready_fd=sys.stdout.fileno())
    return {
        **envelope("pipe-node"),
        "bind": bind,
        "next": next_hop,
        "work_us": work_us,
        "received": r["received"],
        "forwarded": r["forwarded"],
        "malformed": r["malformed"],
        "full": r["full"],
        "send_errors": r["send_errors"],
        "no_kernel_ts": r["no_kernel_ts"],
        "elapsed_ns": r["elapsed_ns"],
        "interrupted": r["interrupted"],
        "residence_ns": hist_quantiles(r["residence"], r["hist_scale"]),
        "trace": {"path": tr.path, "records": tr.records, "lost": tr.lost},
    }


def sink(bind: str, flow: int, trace_path: str | None) -> SinkJson:
    with traced(trace_path, ["pipe"]) as tr:
        sys.stdout.flush()
        r = _native.pipe_sink(bind, flow, ready_fd=sys.stdout.fileno())
    return {
        **envelope("pipe-sink"),
        "bind": bind,
        "flow": flow,
        "received": r["received"],
        "unique": r["unique"],
        "lost": r["lost"],
        "duplicates": r["duplicates"],
        "reordered": r["reordered"],
        "malformed": r["malformed"],
        "truncated": r["truncated"],
        "no_kernel_ts": r["no_kernel_ts"],
        "first_seq": r["first_seq"],
        "max_seq": r["max_seq"],
        "hops_seen": r["hops_seen"],
        "elapsed_ns": r["elapsed_ns"],
        "interrupted": r["interrupted"],
        "end_to_end_ns": hist_quantiles(r["end_to_end"], r["hist_scale"]),
        "trace": {"path": tr.path, "records": tr.records, "lost": tr.lost},
    }


def messages(trace: str | os.PathLike[str]) -> Any:
    """One row per message the sink recorded (a polars DataFrame)."""
    from loopscope.trace.reader import read

    return messages_from(read(trace))


def messages_from(records: Any) -> Any:
    """``messages`` from a sink trace already read into records."""
    import polars as pl

    ev = records.filter((pl.col("group").cast(pl.String) == "pipe") & (pl.col("name").cast(pl.String) == "message"))
    payloads = ev["payload"].to_list()
    t_ns = ev["t_ns"].to_numpy()
    if not payloads:
        return pl.DataFrame()
    lengths = {len(p) for p in payloads}
    n_hops = (max(lengths) - 40) // 24
    rows = [p for p in payloads if len(p) == 40 + 24 * n_hops]
    arr = np.frombuffer(b"".join(rows), dtype="<i8").reshape(len(rows), 5 + 3 * n_hops)
    keep = np.array([len(p) == 40 + 24 * n_hops for p in payloads])
    cols: dict[str, np.ndarray] = {"t_ns": t_ns[keep], "seq": arr[:, 0], "sched_rt_ns": arr[:, 1], "sent_rt_ns": arr[:, 2]}
    for k in range(n_hops):
        cols[f"node{k + 1}_krx_rt_ns"] = arr[:, 3 + 3 * k]
        cols[f"node{k + 1}_urx_rt_ns"] = arr[:, 4 + 3 * k]
        cols[f"node{k + 1}_utx_rt_ns"] = arr[:, 5 + 3 * k]
    cols["sink_krx_rt_ns"] = arr[:, 3 + 3 * n_hops]
    cols["sink_urx_rt_ns"] = arr[:, 4 + 3 * n_hops]
    prev_tx = cols["sent_rt_ns"]
    for k in range(n_hops):
        krx = cols[f"node{k + 1}_krx_rt_ns"]
        cols[f"hop{k}_net_ns"] = krx - prev_tx
        cols[f"node{k + 1}_stack_ns"] = cols[f"node{k + 1}_urx_rt_ns"] - krx
        cols[f"node{k + 1}_work_ns"] = cols[f"node{k + 1}_utx_rt_ns"] - cols[f"node{k + 1}_urx_rt_ns"]
        prev_tx = cols[f"node{k + 1}_utx_rt_ns"]
    cols[f"hop{n_hops}_net_ns"] = cols["sink_krx_rt_ns"] - prev_tx
    cols["sink_stack_ns"] = cols["sink_urx_rt_ns"] - cols["sink_krx_rt_ns"]
    cols["e2e_ns"] = cols["sink_urx_rt_ns"] - cols["sent_rt_ns"]
    cols["source_late_ns"] = cols["sent_rt_ns"] - cols["sched_rt_ns"]
    df = pl.DataFrame(cols)
    return df.with_columns(pl.lit(int((~keep).sum())).alias("skipped_other_shape")) if (~keep).any() else df


def components(n_nodes: int) -> list[str]:
    """The per-message duration columns in path order, then end to end."""
    out = []
    for k in range(n_nodes):
        out += [f"hop{k}_net_ns", f"node{k + 1}_stack_ns", f"node{k + 1}_work_ns"]
    return [*out, f"hop{n_nodes}_net_ns", "sink_stack_ns", "e2e_ns"]


def source_launched(p: PipeSourceParams, launch: Launch) -> SourceJson:
    """The source as the lab starts it: ``count`` messages, else for the step's duration."""
    from loopscope.probes.net import rate

    return source(p.dest, rate(p.rate, p.size), p.size, p.flow, p.count, None if p.count else launch.duration_ns, launch.trace, p.linger_ns)


def node_launched(p: PipeNodeParams, launch: Launch) -> NodeJson:
    """A node as the lab starts it: ``ready`` once listening, until stopped."""
    return node(p.bind, p.next, p.work_us, launch.trace)


def sink_launched(p: PipeSinkParams, launch: Launch) -> SinkJson:
    """The sink as the lab starts it: ``ready`` once listening, until stopped."""
    return sink(p.bind, p.flow, launch.trace)
