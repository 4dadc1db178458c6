"""The link emulator between two real network namespaces: each netem
semantic does what it says, counted on both sides (the emulator's counts and
the receiving probe's)."""

from __future__ import annotations

import json
import subprocess
import sys
import time
from pathlib import Path
from typing import Any, Iterator

import pytest
from scipy.stats import binom

from loopscope.lab import netns
from loopscope.lab.emulator import Emulator

pytestmark = [pytest.mark.needs_root, pytest.mark.needs_tool("ip", "ethtool")]


@pytest.fixture
def topo(lab: None) -> Iterator[netns.Topology]:
    t = netns.Topology.plan(f"emu-test-{time.monotonic_ns()}", ["a", "b"])
    t.up()
    try:
        yield t
    finally:
        t.down()
    assert not [n for n in netns.existing() if n.startswith(f"ls-{t.tag}-")]


def link(**kw: Any) -> dict[str, Any]:
    base = {
        "name": "a->b",
        "from": "a",
        "to": "b",
        "delay_ns": 0,
        "jitter_ns": 0,
        "distribution": "normal",
        "loss": 0.0,
        "duplicate": 0.0,
        "reorder": 0.0,
        "rate_bps": None,
        "limit": 1000,
    }
    return {**base, **kw}


def _in(t: netns.Topology, host: str, *args: str) -> list[str]:
    return [sys.executable, "-m", "loopscope.lab.nsexec", "--net", f"/run/netns/{t.host(host).ns}", "--", sys.executable, "-m", "loopscope.cli", *args]


def _dropped(ns: str) -> int:
    """Frames the interfaces of namespace ``ns`` dropped so far (rx and tx)."""
    out = subprocess.run(["ip", "-n", ns, "-s", "-j", "link"], capture_output=True, text=True, check=True).stdout
    return sum(int(i["stats64"][d]["dropped"]) for i in json.loads(out) for d in ("rx", "tx"))


def send_through(
    t: netns.Topology, tmp: Path, lk: dict[str, Any], rate: str, count: int, size: int = 200
) -> tuple[dict[str, Any], dict[str, Any], dict[str, Any]]:
    """Send ``count`` packets a → b through a link; (sender, receiver, emulator link) results.
    The link's result carries ``dropped_before``: what the kernel dropped on
    the way to the emulator (the sender's and the router's interfaces, the
    router's socket), counted, so a starved machine's drops are told from
    the emulator's own."""
    on_way = (t.host("a").ns, t.router_ns)
    before = sum(_dropped(ns) for ns in on_way)
    emu = Emulator(t.router_ns, t.emulator_config([lk], seed=3, priority=50), tmp / "netem", "emu-test")
    try:
        dest = f"{t.host('b').address}:5001"
        rx = subprocess.Popen(
            _in(
                t, "b", "probe", "recv", "--bind", dest, "--idle", "1s", "--duration", "60s", "--json", "--no-packet-records", "--trace", str(tmp / "r.lstrace")
            ),
            stdout=subprocess.PIPE,
            text=True,
        )
        time.sleep(0.4)
        tx = subprocess.run(
            _in(
                t,
                "a",
                "probe",
                "send",
                "--dest",
                dest,
                "--rate",
                rate,
                "--count",
                str(count),
                "--size",
                str(size),
                "--json",
                "--no-packet-records",
                "--no-tx-timestamps",
                "--trace",
                str(tmp / "s.lstrace"),
            ),
            capture_output=True,
            text=True,
            timeout=120,
        )
        assert tx.returncode == 0, tx.stderr
        out, _ = rx.communicate(timeout=120)
    finally:
        res = emu.stop()
    assert res is not None
    em = next(l for l in res["links"] if l["name"] == "a->b")
    em["dropped_before"] = sum(_dropped(ns) for ns in on_way) - before + sum(p["socket_drops"] for p in res["ports"])
    return json.loads(tx.stdout), json.loads(out), em


def test_a_host_namespace_keeps_loopscope_s_listening_ports_out_of_its_ephemeral_range(topo: netns.Topology, lab: None) -> None:
    # a channel hub once failed to listen on 47600: a client socket of its namespace had taken it as its own port
    for h in topo.hosts:
        got = subprocess.run(["ip", "netns", "exec", h.ns, "sysctl", "-n", "net.ipv4.ip_local_reserved_ports"], capture_output=True, text=True, check=True)
        assert got.stdout.strip() == netns.RESERVED_PORTS == "47000-47999"
    # the machine's own namespace is left as it was
    assert "47000" not in Path("/proc/sys/net/ipv4/ip_local_reserved_ports").read_text()


def test_loss_falls_in_the_binomial_interval_of_the_requested_rate(topo: netns.Topology, tmp_path: Path, lab: None) -> None:
    n, p = 4000, 0.2
    tx, rx, em = send_through(topo, tmp_path, link(loss=p), "4000pps", n)
    # every packet sent reached the emulator or was counted dropped before it (a starved router's rings)
    assert tx["sent"] == n and em["packets_in"] + em["dropped_before"] == n, em
    lo, hi = binom.interval(0.9999, em["packets_in"], p)
    assert lo <= em["lost"] <= hi
    assert rx["packets"] == n - em["lost"]


def test_duplicates_arrive_twice_and_are_counted_by_both_ends(topo: netns.Topology, tmp_path: Path, lab: None) -> None:
    n, p = 3000, 0.1
    tx, rx, em = send_through(topo, tmp_path, link(duplicate=p), "3000pps", n)
    lo, hi = binom.interval(0.9999, n, p)
    assert lo <= em["duplicated"] <= hi
    assert rx["duplicates"] == em["duplicated"] and rx["packets"] == n + em["duplicated"]


def test_reordered_packets_overtake_the_delayed_ones(topo: netns.Topology, tmp_path: Path, lab: None) -> None:
    tx, rx, em = send_through(topo, tmp_path, link(delay_ns=3_000_000, reorder=0.3), "2000pps", 2000)
    assert em["reordered"] > 400
    assert rx["reordered"] > 100 and rx["lost"] == 0


def test_delay_and_jitter_shape_the_one_way_delay(topo: netns.Topology, tmp_path: Path, lab: None) -> None:
    tx, rx, em = send_through(topo, tmp_path, link(delay_ns=5_000_000, jitter_ns=1_000_000, distribution="normal"), "2000pps", 3000)
    d = rx["delay_ns"]["sender_and_network"]
    # Normal jitter of sd 1 ms around 5 ms: the median near 5 ms, tails well beyond ±1 ms.
    assert 4_700_000 < d["p50"] < 5_600_000
    assert d["min"] < 3_500_000 and d["p99"] > 6_800_000
    assert em["applied_ns"]["min"] < 3_500_000


def test_a_rate_limit_queues_and_drops_what_exceeds_it(topo: netns.Topology, tmp_path: Path, lab: None) -> None:
    tx, rx, em = send_through(topo, tmp_path, link(rate_bps=8e6, limit=20), "2000pps", 4000, size=1000)
    assert em["queue_drops"] > 1000
    # What got through left at the link's rate (frames of 1042 bytes on the wire).
    t = rx["throughput"]
    assert abs(t["bps"] * 1042 / 1000 / 8e6 - 1) < 0.1, t


def _stream(
    t: netns.Topology, tmp: Path, src: str, dest: str, count: int, bind: str | None = None, recv_host: str = "b"
) -> tuple[dict[str, Any], dict[str, Any]]:
    rx = subprocess.Popen(
        _in(
            t,
            recv_host,
            "probe",
            "recv",
            "--bind",
            bind or dest,
            "--idle",
            "1s",
            "--duration",
            "60s",
            "--json",
            "--no-packet-records",
            "--trace",
            str(tmp / "r.lstrace"),
        ),
        stdout=subprocess.PIPE,
        text=True,
    )
    time.sleep(0.4)
    tx = subprocess.run(
        _in(
            t,
            src,
            "probe",
            "send",
            "--dest",
            dest,
            "--rate",
            "2000pps",
            "--count",
            str(count),
            "--size",
            "200",
            "--json",
            "--no-packet-records",
            "--no-tx-timestamps",
            "--trace",
            str(tmp / "s.lstrace"),
        ),
        capture_output=True,
        text=True,
        timeout=120,
    )
    assert tx.returncode == 0, tx.stderr
    out, _ = rx.communicate(timeout=120)
    return json.loads(tx.stdout), json.loads(out)


def test_a_path_that_asks_for_nothing_is_forwarded_by_the_kernel_and_never_reaches_the_emulator(topo: netns.Topology, tmp_path: Path, lab: None) -> None:
    topo.kernel_forwarding({("b", "a")})
    back = link(name="b->a", delay_ns=1_000_000, **{"from": "b", "to": "a"})
    emu = Emulator(topo.router_ns, topo.emulator_config([back], seed=3, kernel={("a", "b")}), tmp_path / "netem", "emu-test")
    try:
        tx, rx = _stream(topo, tmp_path, "a", f"{topo.host('b').address}:5001", 400)
    finally:
        res = emu.stop()
    assert rx["packets"] == tx["sent"] == 400
    assert res is not None and res["unfiltered"] == []
    ab = next(l for l in res["links"] if l["name"] == "a->b")
    assert ab["kernel"] and ab["packets_in"] == 0
    # the socket filter kept a's frames out of the emulator altogether
    assert next(p for p in res["ports"] if p["host"] == "a")["frames"] == 0
    counts = topo.forward_counts()
    assert counts is not None and counts["forwarded"] >= 400


def test_the_sync_network_joins_each_host_to_the_reference_without_the_router(tmp_path: Path, lab: None) -> None:
    t = netns.Topology.plan(f"sync-test-{time.monotonic_ns()}", ["a", "b", "c"], sync_reference="a")
    t.up()
    try:
        assert set(t.sync_links) == {"b", "c"}
        sl = t.sync_links["b"]
        tx, rx = _stream(t, tmp_path, "b", f"{sl.peer_address}:5002", 200, bind="0.0.0.0:5002", recv_host="a")
        assert rx["packets"] == tx["sent"] == 200
        counts = t.forward_counts()
        assert counts is not None and counts["forwarded"] == 0
        assert t.describe()["sync"]["links"]["c"]["reference_address"] == "10.78.3.1"
    finally:
        t.down()
    assert not [n for n in netns.existing() if n.startswith(f"ls-{t.tag}-")]


def test_a_host_address_inside_the_sync_network_is_refused_when_there_is_one(lab: None) -> None:
    with pytest.raises(netns.NetnsError, match="10.78.0.0/16"):
        netns.Topology.plan("x", ["a", "b"], {"b": "10.78.9.2"}, sync_reference="a")
    netns.Topology.plan("x", ["a", "b"], {"b": "10.78.9.2"})
