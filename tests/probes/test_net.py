"""Network probes on loopback: schedules, accounting, kernel timestamps, errors."""

from __future__ import annotations

import json
import os
import socket
import struct
import subprocess
import time
from pathlib import Path

import numpy as np
import polars as pl
import pytest

import loopscope.trace as lt
from loopscope import _native
from loopscope.probes import net
from tests.conftest import BIN, Cli
from tests.helpers import assert_clean_error


def free_port() -> int:
    s = socket.socket(socket.AF_INET, socket.SOCK_DGRAM)
    s.bind(("127.0.0.1", 0))
    p = s.getsockname()[1]
    s.close()
    return int(p)


def background(*args: str, cwd: Path) -> subprocess.Popen[str]:
    p = subprocess.Popen([str(BIN), *args], cwd=cwd, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
    time.sleep(0.6)
    return p


# ---- schedules --------------------------------------------------------------------


def test_cbr_departures_are_exact_for_a_bit_rate() -> None:
    r = net.rate("1Gbit", 1400)
    off = _native.net_schedule("cbr", r.pps_num, r.pps_den, count=5)
    assert off.tolist() == [0, 11_200, 22_400, 33_600, 44_800]
    r = net.rate("3pps", 100)
    assert _native.net_schedule("cbr", r.pps_num, r.pps_den, count=4).tolist() == [0, 333_333_333, 666_666_666, 1_000_000_000]


def test_poisson_departures_repeat_for_a_seed_and_change_with_it() -> None:
    a = _native.net_schedule("poisson", 10_000, 1, count=50_000, seed=5)
    b = _native.net_schedule("poisson", 10_000, 1, count=50_000, seed=5)
    c = _native.net_schedule("poisson", 10_000, 1, count=50_000, seed=6)
    assert (a == b).all() and not (a == c).all()
    gaps = np.diff(a.astype(np.int64))
    assert abs(gaps.mean() - 100_000) < 2_000
    # Exponential gaps: the standard deviation equals the mean.
    assert abs(gaps.std() / gaps.mean() - 1) < 0.05


def test_on_off_departures_come_in_bursts() -> None:
    off = _native.net_schedule("onoff", 1000, 1, count=6, on_ns=3_000_000, off_ns=7_000_000)
    assert off.tolist() == [0, 1_000_000, 2_000_000, 10_000_000, 11_000_000, 12_000_000]


def test_replay_departures_come_from_the_file(tmp_path: Path) -> None:
    f = tmp_path / "offsets.txt"
    f.write_text("0\n250us\n1ms # third\n1.5ms\n")
    assert _native.net_schedule("replay", 1, 1, replay=str(f)).tolist() == [0, 250_000, 1_000_000, 1_500_000]
    f.write_text("0\n2ms\n1ms\n")
    with pytest.raises(Exception, match=r"offsets.txt:3: offsets must not decrease"):
        _native.net_schedule("replay", 1, 1, replay=str(f))


@pytest.mark.parametrize(
    "text, bps, pps", [("200Mbit", 200e6, 200e6 / 11200), ("1Gb/s", 1e9, 1e9 / 11200), ("1000pps", None, 1000.0), ("2.5kpps", None, 2500.0)]
)
def test_rates_parse_to_exact_packet_rates(text: str, bps: float | None, pps: float) -> None:
    r = net.rate(text, 1400)
    assert r.bps == bps and abs(r.pps - pps) < 1e-6


# ---- accounting with injected packets -----------------------------------------------


def pkt(seq: int, flow: int = 1, size: int = 64) -> bytes:
    now = time.clock_gettime_ns(time.CLOCK_REALTIME)
    h = b"LSPK" + struct.pack("<BBHIIQqqq", 1, 1, 48, flow, 0, seq, now, now, 0)
    return h + bytes(size - len(h))


def test_loss_duplicates_reordering_and_foreign_datagrams_are_counted(cli: Cli, tmp_path: Path, lab: None) -> None:
    port = free_port()
    rx = background("probe", "recv", "--bind", f"127.0.0.1:{port}", "--idle", "500ms", "--json", "--trace", "r.lstrace", cwd=tmp_path)
    s = socket.socket(socket.AF_INET, socket.SOCK_DGRAM)
    for seq in [0, 1, 2, 5, 4, 4, 7, 8]:
        s.sendto(pkt(seq), ("127.0.0.1", port))
    s.sendto(b"hello, not a loopscope packet", ("127.0.0.1", port))
    s.sendto(b"LSPK" + bytes(60), ("127.0.0.1", port))  # our magic, bad version
    for seq in [100, 101]:
        s.sendto(pkt(seq, flow=2), ("127.0.0.1", port))
    s.close()
    out, err = rx.communicate(timeout=30)
    assert rx.returncode == 0, err
    j = json.loads(out)
    assert j["packets"] == 10 and j["malformed"] == 2
    f1 = next(f for f in j["flows"] if f["flow"] == 1)
    assert (f1["unique"], f1["lost"], f1["duplicates"], f1["reordered"]) == (7, 2, 1, 1)
    f2 = next(f for f in j["flows"] if f["flow"] == 2)
    assert (f2["unique"], f2["lost"]) == (2, 0)
    assert j["kernel_timestamps"] == 10
    recs = lt.read(tmp_path / "r.lstrace").filter(pl.col("group") == "net")
    assert recs.filter(pl.col("name") == "recv").height == 10
    assert recs.filter(pl.col("name") == "malformed").height == 2


# ---- send and receive ----------------------------------------------------------------


def test_a_paced_run_arrives_whole_with_kernel_timestamps_both_ways(cli: Cli, tmp_path: Path, lab: None) -> None:
    port = free_port()
    rx = background("probe", "recv", "--bind", f"127.0.0.1:{port}", "--idle", "700ms", "--json", "--trace", "r.lstrace", cwd=tmp_path)
    s = cli("probe", "send", "--dest", f"127.0.0.1:{port}", "--rate", "20kpps", "--size", "200", "--count", "4000", "--json", "--trace", "s.lstrace")
    out, err = rx.communicate(timeout=30)
    assert s.returncode == 0, s.stderr
    js, jr = json.loads(s.stdout), json.loads(out)
    assert js["sent"] == 4000 and js["kept_up"] and js["shortfall"] is None
    assert js["tx_timestamps"] == {"software": 4000, "sched": 4000, "missing": 0}
    assert jr["packets"] == 4000 and jr["lost"] == 0 and jr["kernel_timestamps"] == 4000
    d = jr["delay_ns"]
    assert 0 < d["end_host"]["p50"] < d["one_way"]["p99"] + 1
    split = net.split_delays(tmp_path / "s.lstrace", tmp_path / "r.lstrace")
    assert split.height == 4000 and split["ktx_ns"].null_count() == 0
    assert (split["network_ns"] >= 0).all() and (split["sender_stack_ns"] >= 0).all() and (split["end_host_ns"] >= 0).all()
    # The sender's trace holds every departure against its schedule.
    sent = lt.read(tmp_path / "s.lstrace").filter(pl.col("name") == "send")
    gaps = np.diff(np.sort(sent["t_ns"].to_numpy()))
    assert sent.height == 4000 and set(np.unique(gaps)) <= {50_000}


def test_a_sender_stopped_mid_run_keeps_every_tx_timestamp_while_it_catches_up(tmp_path: Path, lab: None) -> None:
    # Stopped for 80 ms at 20 kpps, the sender owes 1,600 packets and sends
    # them in batches; their stamps pile up on the error queue meanwhile.
    port = free_port()
    rx = background("probe", "recv", "--bind", f"127.0.0.1:{port}", "--idle", "700ms", "--json", "--no-packet-records", cwd=tmp_path)
    tx = subprocess.Popen(
        [str(BIN), "probe", "send", "--dest", f"127.0.0.1:{port}", "--rate", "20kpps", "--size", "200", "--count", "20000", "--no-packet-records", "--json"],
        cwd=tmp_path,
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
    )
    for _ in range(3):
        time.sleep(0.25)
        tx.send_signal(19)  # SIGSTOP
        time.sleep(0.08)
        tx.send_signal(18)  # SIGCONT
    out, err = tx.communicate(timeout=30)
    rx.communicate(timeout=30)
    j = json.loads(out)
    assert j["sent"] == 20000 and j["largest_batch"] > 32, err
    assert j["tx_timestamps"] == {"software": 20000, "sched": 20000, "missing": 0}


def test_bounded_memory_mode_keeps_summaries_without_per_packet_records(cli: Cli, tmp_path: Path, lab: None) -> None:
    port = free_port()
    rx = background("probe", "recv", "--bind", f"127.0.0.1:{port}", "--idle", "500ms", "--no-packet-records", "--json", "--trace", "r.lstrace", cwd=tmp_path)
    cli("probe", "send", "--dest", f"127.0.0.1:{port}", "--rate", "10kpps", "--count", "1000", "--no-packet-records", "--trace", "s.lstrace")
    out, _ = rx.communicate(timeout=30)
    j = json.loads(out)
    assert j["packets"] == 1000 and j["delay_ns"]["one_way"]["n"] == 1000 and j["delay_ns"]["one_way"]["p99"] > 0
    assert lt.info(tmp_path / "r.lstrace").records == 0


def test_request_response_measures_rtt_and_both_legs_on_one_clock(cli: Cli, tmp_path: Path, lab: None) -> None:
    port = free_port()
    srv = background("probe", "echo", "--bind", f"127.0.0.1:{port}", "--duration", "5s", "--json", cwd=tmp_path)
    r = cli("probe", "rr", "--dest", f"127.0.0.1:{port}", "--rate", "500pps", "--duration", "1s", "--json", "--trace", "rr.lstrace")
    srv.communicate(timeout=30)
    assert r.returncode == 0, r.stderr
    j = json.loads(r.stdout)
    assert j["sent"] == 500 and j["answered"] == 500 and j["lost"] == 0 and j["same_clock"]
    assert j["forward_ns"]["p50"] + j["return_ns"]["p50"] <= j["rtt_ns"]["p99"]
    assert 0 < j["rtt_ns"]["p50"] < 1_000_000
    assert lt.info(tmp_path / "rr.lstrace").counts


def test_a_tcp_bulk_stream_reaches_its_sink_at_the_set_rate(cli: Cli, tmp_path: Path, lab: None) -> None:
    port = free_port()
    sink = background("probe", "recv", "--tcp", "--bind", f"127.0.0.1:{port}", "--duration", "3s", "--json", cwd=tmp_path)
    b = cli("probe", "bulk", "--tcp", "--dest", f"127.0.0.1:{port}", "--rate", "40Mbit", "--duration", "1s", "--json")
    out, _ = sink.communicate(timeout=30)
    assert b.returncode == 0, b.stderr
    jb, js = json.loads(b.stdout), json.loads(out)
    assert 0.8 * 5e6 < jb["bytes"] < 1.2 * 5e6
    assert js["bytes"] == jb["bytes"] and js["connections"] == 1


# ---- errors ----------------------------------------------------------------------------


def test_a_port_in_use_is_a_one_line_error(cli: Cli, beside: None) -> None:
    s = socket.socket(socket.AF_INET, socket.SOCK_DGRAM)
    s.bind(("127.0.0.1", 0))
    port = s.getsockname()[1]
    try:
        assert_clean_error(cli("probe", "recv", "--bind", f"127.0.0.1:{port}", "--duration", "1s"), 2, f"127.0.0.1:{port}: the port is in use")
    finally:
        s.close()


@pytest.mark.parametrize(
    "args, needle",
    [
        (["--dest", "nosuch.invalid:9", "--rate", "1kpps", "--count", "1"], "nosuch.invalid:9: cannot resolve"),
        (["--dest", "127.0.0.1", "--rate", "1kpps", "--count", "1"], "needs a port"),
        (["--dest", "127.0.0.1:9", "--rate", "10 mbit", "--count", "1"], "'m' would mean milli"),
        (["--dest", "127.0.0.1:9", "--rate", "fast", "--count", "1"], "--rate: 'fast' is not a rate"),
        (["--dest", "127.0.0.1:9", "--rate", "1kpps", "--count", "1", "--size", "20"], "--size: must be 48..65507"),
        (["--dest", "127.0.0.1:9", "--rate", "1kpps"], "give --duration or --count"),
        (["--dest", "127.0.0.1:9", "--rate", "1kpps", "--count", "1", "--pattern", "zigzag"], "--pattern: 'zigzag' is not one of"),
        (["--dest", "127.0.0.1:9", "--rate", "1kpps", "--pattern", "replay:/nonexistent"], "/nonexistent: no such replay file"),
    ],
)
def test_bad_sender_input_is_a_one_line_error(cli: Cli, args: list[str], needle: str, beside: None) -> None:
    assert_clean_error(cli("probe", "send", *args), 2, needle)


@pytest.mark.needs_root
def test_an_unreachable_network_is_named(tmp_path: Path, beside: None) -> None:
    # A fresh network namespace has no route anywhere: a real unreachable network.
    ns = f"lstest-unreach-{os.getpid()}"
    subprocess.run(["ip", "netns", "add", ns], check=True)
    try:
        r = subprocess.run(
            ["ip", "netns", "exec", ns, str(BIN), "probe", "send", "--dest", "10.0.0.1:9", "--rate", "1kpps", "--count", "1"],
            capture_output=True,
            text=True,
            timeout=60,
            cwd=tmp_path,
        )
        assert_clean_error(r, 2, "10.0.0.1:9: the network is unreachable")
    finally:
        subprocess.run(["ip", "netns", "delete", ns], check=False)


def test_a_rate_the_machine_cannot_keep_is_said_not_hidden(cli: Cli, tmp_path: Path, lab: None) -> None:
    port = free_port()
    rx = background("probe", "recv", "--bind", f"127.0.0.1:{port}", "--idle", "500ms", "--no-packet-records", "--json", "--trace", "r.lstrace", cwd=tmp_path)
    s = cli(
        "probe",
        "send",
        "--dest",
        f"127.0.0.1:{port}",
        "--rate",
        "100Gbit",
        "--size",
        "1400",
        "--duration",
        "500ms",
        "--no-packet-records",
        "--json",
        "--trace",
        "s.lstrace",
    )
    rx.communicate(timeout=30)
    j = json.loads(s.stdout)
    assert not j["kept_up"] and j["unsent"] > 0
    assert "could not keep up: sent" in j["shortfall"] and "could not keep up" in s.stderr
    assert "per worker" in s.stderr  # said before the run too


def test_sender_and_receiver_stop_cleanly_on_ctrl_c(tmp_path: Path, lab: None) -> None:
    import signal

    port = free_port()
    rx = background("probe", "recv", "--bind", f"127.0.0.1:{port}", "--json", "--trace", "r.lstrace", cwd=tmp_path)
    rx.send_signal(signal.SIGINT)
    out, err = rx.communicate(timeout=20)
    assert rx.returncode == 130, err
    assert json.loads(out)["interrupted"] is True
    assert lt.info(tmp_path / "r.lstrace").stats["closed"]
