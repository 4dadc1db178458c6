"""Channels from Python: the reclaim rule, the bounds, and items crossing
real sockets between processes (TCP and UDP), including ends that vanish."""

from __future__ import annotations

import json
import os
import select
import subprocess
import sys
import time

import pytest

from loopscope import channels
from loopscope.errors import InputError


def test_an_item_got_in_a_with_block_is_consumed_and_reclaimed() -> None:
    hub = channels.Hub()
    ch = hub.create("c", capacity=4)
    a, b = ch.consumer(), ch.consumer()
    ch.put(1, b"x")
    with a.get(timeout=1) as item:
        assert (item.ts, item.data) == (1, b"x")
    assert ch.stats()["held"] == 1  # b has not consumed it
    b.get(consume=True, timeout=1)
    s = ch.stats()
    assert s["held"] == 0 and s["reclaimed"] == 1 and s["consumed"] == 2


def test_latest_skips_and_at_waits_for_a_timestamp() -> None:
    ch = channels.Hub().create("c", capacity=8)
    c = ch.consumer()
    for ts in range(1, 6):
        ch.put(ts, bytes([ts]))
    assert c.get(latest=True, consume=True, timeout=1).ts == 5
    assert ch.stats()["skipped"] == 4
    with pytest.raises(InputError, match="not in the channel"):
        c.get(at=2, timeout=0.05)


def test_every_blocking_call_times_out_and_says_so() -> None:
    ch = channels.Hub().create("c", capacity=1)
    c = ch.consumer()
    t0 = time.monotonic()
    with pytest.raises(channels.ChannelTimeout):
        c.get(timeout=0.1)
    ch.put(1, b"")
    with pytest.raises(channels.ChannelTimeout):
        ch.put(2, b"", timeout=0.1)
    assert time.monotonic() - t0 < 2
    assert ch.stats()["put_timeouts"] == 1 and ch.stats()["get_timeouts"] == 1


def test_a_full_drop_oldest_channel_counts_what_it_dropped() -> None:
    ch = channels.Hub().create("c", capacity=2, full="drop-oldest")
    c = ch.consumer()
    for ts in range(1, 6):
        ch.put(ts, b"")
    assert ch.stats()["dropped_full"] == 3
    assert c.get(consume=True, timeout=1).ts == 4


def test_bad_items_and_settings_are_refused_with_the_reason() -> None:
    hub = channels.Hub()
    ch = hub.create("c", capacity=2, max_item=8)
    ch.consumer()
    with pytest.raises(InputError, match="larger than the channel's maximum of 8 bytes"):
        ch.put(1, b"123456789")
    ch.put(1, b"")
    with pytest.raises(InputError, match="already put"):
        ch.put(1, b"")
    with pytest.raises(InputError, match="drop-oldest"):
        hub.create("d", full="sometimes")
    with pytest.raises(InputError, match="already exists"):
        hub.create("c")


PRODUCER = """
import sys
from loopscope import channels
p = channels.producer(sys.argv[1], "frames", transport=sys.argv[2])
for ts in range(1, 21):
    p.put(ts, bytes((ts + i) % 256 for i in range(200_000)))
print(p.stats()["sent"])
"""


@pytest.mark.parametrize("transport", ["tcp", "udp"])
def test_large_items_from_another_process_arrive_whole(transport: str) -> None:
    hub = channels.Hub(listen="127.0.0.1:0")
    ch = hub.create("frames", capacity=32)
    me = ch.consumer()
    child = subprocess.Popen([sys.executable, "-c", PRODUCER, hub.address, transport], stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
    got = []
    try:
        while len(got) < 20:
            item = me.get(consume=True, timeout=10)
            assert item.data == bytes((item.ts + i) % 256 for i in range(200_000))
            got.append(item.ts)
    finally:
        out, err = child.communicate(timeout=30)
    assert child.returncode == 0, err
    assert got == list(range(1, 21))
    n = hub.net_stats()
    assert n["items_in"] == 20 and n["incomplete"] == 0 and n["missing"] == 0
    if transport == "udp":
        assert n["datagrams_in"] >= 20 * (200_000 // 1400)


CONSUMER = """
import sys, json
from loopscope import channels
c = channels.consumer(sys.argv[1], "frames", transport=sys.argv[2], capacity=64)
print("ready", flush=True)
got = []
while len(got) < int(sys.argv[3]):
    try:
        got.append(c.get(consume=True, timeout=5).ts)
    except channels.ChannelTimeout:
        break
print(json.dumps(got), flush=True)
if len(sys.argv) > 4:
    import time; time.sleep(60)
"""


def _pump_until_ready(hub: channels.Hub, child: subprocess.Popen) -> None:
    deadline = time.monotonic() + 15
    while time.monotonic() < deadline:
        hub.pump(0.02)
        r, _, _ = select.select([child.stdout], [], [], 0)
        if r:
            assert child.stdout.readline().strip() == "ready"
            return
    raise AssertionError("the consumer never attached")


@pytest.mark.parametrize("transport", ["tcp", "udp"])
def test_a_remote_consumer_gets_every_item_put_after_it_attached(transport: str) -> None:
    hub = channels.Hub(listen="127.0.0.1:0")
    ch = hub.create("frames", capacity=64)
    child = subprocess.Popen([sys.executable, "-c", CONSUMER, hub.address, transport, "30"], stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
    try:
        _pump_until_ready(hub, child)
        for ts in range(1, 31):
            ch.put(ts, os.urandom(3000))
        if transport == "tcp":
            # the consumer's consumption comes back over TCP: the owner reclaims
            deadline = time.monotonic() + 10
            while ch.stats()["held"] and time.monotonic() < deadline:
                hub.pump(0.05)
            assert ch.stats()["held"] == 0 and ch.stats()["reclaimed"] == 30
        out, err = child.communicate(timeout=30)
    finally:
        if child.poll() is None:
            child.kill()
            child.communicate()
    assert child.returncode == 0, err
    assert json.loads(out.strip().splitlines()[-1]) == list(range(1, 31))


def test_a_remote_consumer_that_vanishes_is_counted_and_nothing_hangs() -> None:
    hub = channels.Hub(listen="127.0.0.1:0")
    ch = hub.create("frames", capacity=4)
    child = subprocess.Popen([sys.executable, "-c", CONSUMER, hub.address, "tcp", "2", "stay"], stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
    try:
        _pump_until_ready(hub, child)
        ch.put(1, b"a")
        ch.put(2, b"b")
        child.stdout.readline()  # it got both
        child.kill()
        child.communicate()
        # the owner notices on its next pump; its puts go on and never block
        t0 = time.monotonic()
        for ts in range(3, 40):
            hub.pump(0.01)
            ch.put(ts, b"x" * 100, timeout=0.5)
        assert time.monotonic() - t0 < 10
    finally:
        if child.poll() is None:
            child.kill()
            child.communicate()
    assert ch.stats()["consumers_lost"] >= 1
    assert hub.net_stats()["conns_lost"] >= 1


def test_a_producer_for_a_channel_the_hub_lacks_gets_a_clear_error() -> None:
    hub = channels.Hub(listen="127.0.0.1:0")
    hub.create("frames")
    code = f"from loopscope import channels\ntry:\n    channels.producer('{hub.address}', 'nosuch', timeout=5)\nexcept Exception as e:\n    print(type(e).__name__, e)\n"
    child = subprocess.Popen([sys.executable, "-c", code], stdout=subprocess.PIPE, text=True)
    deadline = time.monotonic() + 15
    while child.poll() is None and time.monotonic() < deadline:
        hub.pump(0.02)
    out = child.communicate(timeout=5)[0]
    assert "RunError" in out and 'no channel named "nosuch"' in out
