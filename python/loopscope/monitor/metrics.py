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
"""

from __future__ import annotations

import socket
from collections.abc import Iterator, Mapping
from typing import TYPE_CHECKING, Any, Protocol

from prometheus_client import CollectorRegistry, start_http_server
from prometheus_client.core import CounterMetricFamily, GaugeMetricFamily, HistogramMetricFamily

from loopscope.errors import InputError
from loopscope.monitor import hist

if TYPE_CHECKING:
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
    def __init__(self, mon: Watched) -> None:
        self.mon = mon

    def collect(self) -> Iterator[Any]:
        m = self.mon
        lat = HistogramMetricFamily("loopscope_latency_seconds", "every value of the run so far, per probe", labels=["probe", "host"])
        pmax = GaugeMetricFamily("loopscope_period_max_seconds", "the maximum of the last closed period", labels=["probe", "host"])
        pn = GaugeMetricFamily("loopscope_periods", "periods closed so far", labels=["probe", "host"])
        snap = m.live_snapshot()
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
            out.add_metric([probe, str(snap[probe]["host"]) if probe in snap else "", cause], n)
        yield out
        yield CounterMetricFamily("loopscope_windows_kept", "windows of kernel events kept", value=kept)
        yield CounterMetricFamily("loopscope_windows_removed", "kept windows removed to stay within monitor.retain", value=removed)


def serve(mon: Watched, host: str, port: int) -> Any:
    """Start the endpoint (a daemon thread); its server, to shut down."""
    reg = CollectorRegistry(auto_describe=True)
    reg.register(Collector(mon))
    server, _thread = start_http_server(port, addr=host, registry=reg)
    return server


__all__ = ["BUCKETS", "check_free", "cumulative", "hist", "parse_address", "serve"]
