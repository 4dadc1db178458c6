"""The clock-sync probes from Python: responder and initiator.

``serve`` runs on the reference host for the whole run, ``probe`` on every
other host (``crates/probes/src/net/sync.rs`` says what travels and what is
recorded). Both write their kernel stamps into their own trace, whose
calibration pairs relate the host's CLOCK_REALTIME (the kernel stamps) to
its CLOCK_MONOTONIC (every other record); ``loopscope.clock`` estimates the
offsets from the two traces afterwards.
"""

from __future__ import annotations

import sys
from loopscope import _native
from loopscope.probes.common import Envelope, TraceInfo, envelope, traced
from loopscope.probes.params import Launch, SyncParams, SyncServeParams
from loopscope.nativetypes import SyncProbeCounts, SyncServeCounts

DEFAULT_PORT = 9319
DEFAULT_RATE = 20.0
DEFAULT_GAP_NS = 20_000


class ServeJson(Envelope, SyncServeCounts):
    """The responder's JSON: the binding's counts (nativetypes) with what this side adds."""

    bind: str
    trace: TraceInfo


class ProbeJson(Envelope, SyncProbeCounts):
    """An initiator's JSON: the binding's counts with what this side adds."""

    dest: str
    flow: int
    rate: float
    gap_ns: int
    trace: TraceInfo


def serve(bind: str, trace_path: str | None) -> ServeJson:
    with traced(trace_path, ["clocksync"]) as tr:
        sys.stdout.flush()
        r = _native.sync_serve(bind, ready_fd=sys.stdout.fileno())
    return {**envelope("sync-serve"), "bind": bind, **r, "trace": {"path": tr.path, "records": tr.records, "lost": tr.lost}}


def probe(dest: str, flow: int, rate: float, gap_ns: int, duration_ns: int | None, trace_path: str | None) -> ProbeJson:
    with traced(trace_path, ["clocksync"]) as tr:
        r = _native.sync_probe(dest, flow, rate, gap_ns, duration_ns)
    return {
        **envelope("sync-probe"),
        "dest": dest,
        "flow": flow,
        "rate": rate,
        "gap_ns": gap_ns,
        **r,
        "trace": {"path": tr.path, "records": tr.records, "lost": tr.lost},
    }


def serve_launched(p: SyncServeParams, launch: Launch) -> ServeJson:
    """The responder as the lab starts it: ``ready`` once listening, until stopped."""
    return serve(p.bind, launch.trace)


def probe_launched(p: SyncParams, launch: Launch) -> ProbeJson:
    """An initiator as the lab starts it: ``ready`` at once, then pairs until stopped (or the launch's duration)."""
    sys.stdout.write("ready\n")
    sys.stdout.flush()
    return probe(p.dest, p.flow, p.rate, p.gap_ns, launch.duration_ns or None, launch.trace)
