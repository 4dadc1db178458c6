"""``loopscope monitor --metrics HOST:PORT``: the monitor's figures for Prometheus.

Served with prometheus-client (OpenMetrics or Prometheus text, as the
scraper asks), computed at each scrape from what the monitor holds, so a
scrape sees the open period's values too:

Every family is labelled with the probe and the spec's name of its host:

- ``loopscope_latency_seconds{probe,host}``: a histogram of every value of the
  run so far, in 1-2-5 buckets from 1 µs to 10 s (``histogram_quantile``
  over them is good to a bucket; the monitor's own quantiles, to 0.1 %,
  are in ``monitor.json`` and the ``.hlog``);
- ``loopscope_period_max_seconds{probe,host}``: the maximum of the last closed period;
- ``loopscope_periods{probe,host}``: periods closed so far;
- ``loopscope_outliers_total{probe,host,top_cause}``: outliers above the
  threshold, by the top cause of the kept ones (``not kept: <why>`` for the rest);
- ``loopscope_windows_kept_total``, ``loopscope_windows_removed_total``.

The endpoint binds to loopback unless an address is given; an address in
use is refused before the monitor starts (exit 2, naming ``--metrics``).
With ``monitor.metrics: agent`` each host in a network namespace of its own
serves its own figures too (``host`` filtered) at its address, on the same
port (``serve_in``): a Prometheus that scrapes each machine finds them where
it looks.
"""

from __future__ import annotations

import ctypes
import os
import socket
import threading
import wsgiref.simple_server
from collections.abc import Callable, Iterator, Mapping
from typing import TYPE_CHECKING, Any, Protocol

from prometheus_client import CollectorRegistry, make_wsgi_app, start_http_server
from prometheus_client.core import CounterMetricFamily, GaugeMetricFamily, HistogramMetricFamily

from loopscope.errors import InputError
from loopscope.monitor import hist

if TYPE_CHECKING:
    from loopscope.lab.hostkinds.base import HostRt
    from loopscope.monitor.keeper import Keeper

#: bucket upper bounds, seconds: 1-2-5 from 1 µs to 10 s
BUCKETS = [m * 10.0**e for e in range(-6, 1) for m in (1, 2, 5)] + [10.0]


def parse_address(text: str) -> tuple[str, int]:
    """``PORT``, ``HOST:PORT`` or ``[V6]:PORT``; the host defaults to loopback."""
    host, _, port = text.rpartition(":")
    host = host.strip("[]") or "127.0.0.1"
    if not port.isdigit() or not 0 < int(port) < 65536:
        raise InputError(f"--metrics: {text!r} is not HOST:PORT (e.g. 127.0.0.1:9464)")
    return host, int(port)


def check_free(host: str, port: int) -> None:
    """Refuse an address another process holds, before anything starts."""
    fam = socket.AF_INET6 if ":" in host else socket.AF_INET
    with socket.socket(fam, socket.SOCK_STREAM) as s:
        s.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
        try:
            s.bind((host, port))
        except OSError as e:
            raise InputError(f"--metrics: cannot listen on {host}:{port}: {e.strerror}; choose another port") from None


def cumulative(h: Any) -> tuple[list[tuple[str, float]], float]:
    """(le, cumulative count) per bucket, +Inf last, and the sum (seconds) of a histogram in ns."""
    counts = [0] * (len(BUCKETS) + 1)
    total_s = 0.0
    for item in h.get_recorded_iterator():
        v_s = item.value_iterated_to / 1e9
        n = item.count_at_value_iterated_to
        total_s += v_s * n
        i = next((k for k, b in enumerate(BUCKETS) if v_s <= b), len(BUCKETS))
        counts[i] += n
    out, run = [], 0
    for b, n in zip([*(f"{x:g}" for x in BUCKETS), "+Inf"], counts):
        run += n
        out.append((b, float(run)))
    return out, total_s


class Watched(Protocol):
    """What the endpoint reads of a running monitor."""

    keeper: Keeper

    def live_snapshot(self) -> Mapping[str, Mapping[str, Any]]: ...


class Collector:
    """The figures of every host, or of one (``host``: what its own endpoint serves)."""

    def __init__(self, mon: Watched, host: str | None = None) -> None:
        self.mon, self.host = mon, host

    def collect(self) -> Iterator[Any]:
        m = self.mon
        lat = HistogramMetricFamily("loopscope_latency_seconds", "every value of the run so far, per probe", labels=["probe", "host"])
        pmax = GaugeMetricFamily("loopscope_period_max_seconds", "the maximum of the last closed period", labels=["probe", "host"])
        pn = GaugeMetricFamily("loopscope_periods", "periods closed so far", labels=["probe", "host"])
        snap = {k: v for k, v in m.live_snapshot().items() if self.host is None or v["host"] == self.host}
        for name, lv in snap.items():
            b, s = cumulative(lv["whole"])
            lat.add_metric([name, lv["host"]], buckets=b, sum_value=s)
            if lv["last_max_ns"] is not None:
                pmax.add_metric([name, lv["host"]], lv["last_max_ns"] / 1e9)
            pn.add_metric([name, lv["host"]], lv["periods"])
        yield lat
        yield pmax
        yield pn
        c = m.keeper.counts
        out = CounterMetricFamily(
            "loopscope_outliers", "outliers above the threshold, by the top cause of the kept ones", labels=["probe", "host", "top_cause"]
        )
        with m.keeper.lock:
            by = dict(m.keeper.by_probe_cause)
            kept, removed = c.windows, c.windows_removed
        for (probe, cause), n in sorted(by.items()):
            if self.host is not None and probe not in snap:
                continue
            out.add_metric([probe, str(snap[probe]["host"]) if probe in snap else "", cause], n)
        yield out
        yield CounterMetricFamily("loopscope_windows_kept", "windows of kernel events kept", value=kept)
        yield CounterMetricFamily("loopscope_windows_removed", "kept windows removed to stay within monitor.retain", value=removed)


def serve_hosts(mon: Watched, hosts: list[HostRt], port: int, say: Callable[[str], None], note: Callable[[str], None]) -> list[Any]:
    """``monitor.metrics: agent``: each host in a network namespace of its own
    (its agent's) serves its own figures at its address on ``port``; a host
    whose endpoint cannot be made is noted, and the others go on. The servers."""
    mine = os.stat("/proc/self/ns/net").st_ino
    out = []
    for h in hosts:
        if h.hello is None or not h.address:
            continue
        ns = f"/proc/{h.hello.pid}/ns/net"
        try:
            if os.stat(ns).st_ino == mine:
                continue  # this machine's own network: the controller's endpoint serves it
            out.append(serve_in(mon, h.name, ns, h.address, port))
            say(f"metrics of {h.name}: http://{h.address}:{port}/metrics (in its network namespace)")
        except OSError as e:
            note(f"host {h.name}: its own metrics endpoint could not be made at {h.address}:{port} ({e}); the controller's serves its figures")
    return out


def serve_in(mon: Watched, host: str, netns: str, address: str, port: int) -> Any:
    """``host``'s own figures at ``address:port`` inside the network namespace
    ``netns`` (a path: its agent's ``/proc/PID/ns/net``): the socket is made
    there by a thread that enters it and comes back, and served from here."""
    reg = CollectorRegistry(auto_describe=True)
    reg.register(Collector(mon, host))
    sock = _socket_in(netns, address, port)
    server = wsgiref.simple_server.WSGIServer((address, port), _Quiet, bind_and_activate=False)
    server.socket.close()
    server.socket = sock
    server.server_address = sock.getsockname()[:2]
    server.server_name, server.server_port = address, port
    server.setup_environ()
    server.set_app(make_wsgi_app(reg))
    threading.Thread(target=server.serve_forever, name=f"ls-metrics-{host}", daemon=True).start()
    return server


class _Quiet(wsgiref.simple_server.WSGIRequestHandler):
    def log_message(self, format: str, *args: object) -> None:  # noqa: A002 - the base class's name
        pass


CLONE_NEWNET = 0x40000000


def _socket_in(netns: str, address: str, port: int) -> socket.socket:
    """A listening TCP socket at ``address:port`` in the namespace ``netns``."""
    made: list[socket.socket] = []
    failed: list[OSError] = []

    def make() -> None:
        libc = ctypes.CDLL(None, use_errno=True)
        own = os.open("/proc/thread-self/ns/net", os.O_RDONLY)
        there = os.open(netns, os.O_RDONLY)
        try:
            if libc.setns(there, CLONE_NEWNET) != 0:
                raise OSError(ctypes.get_errno(), f"entering {netns}")
            try:
                s = socket.socket(socket.AF_INET6 if ":" in address else socket.AF_INET, socket.SOCK_STREAM)
                s.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
                s.bind((address, port))
                s.listen(16)
                made.append(s)
            finally:
                libc.setns(own, CLONE_NEWNET)  # (failing, this thread stays there, and ends)
        except OSError as e:
            failed.append(e)
        finally:
            os.close(own)
            os.close(there)

    t = threading.Thread(target=make, name="ls-metrics-bind")
    t.start()
    t.join()
    if failed:
        raise failed[0]
    return made[0]


def serve(mon: Watched, host: str, port: int) -> Any:
    """Start the endpoint (a daemon thread); its server, to shut down."""
    reg = CollectorRegistry(auto_describe=True)
    reg.register(Collector(mon))
    server, _thread = start_http_server(port, addr=host, registry=reg)
    return server


__all__ = ["BUCKETS", "check_free", "cumulative", "hist", "parse_address", "serve", "serve_hosts", "serve_in"]
