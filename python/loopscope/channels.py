"""Channels of time-sequenced items across threads, processes and hosts.

The model is Stampede's (Paul et al. 2003): a channel holds items keyed by a
timestamp you choose (a frame number, a control tick); producers put,
consumers get the next item, the latest, or the one at a timestamp, and
mark what they are done with consumed; an item is reclaimed once every
consumer that was connected when it was put has consumed it. A channel is
bounded: when full a put waits (``full="block"``, with a timeout) or the
oldest item goes (``full="drop-oldest"``); what is dropped, skipped or
refused is counted in ``stats()``, never lost silently.

A process hosts channels on a :class:`Hub`; with ``listen`` it serves them
to other processes and hosts, over TCP (reliable; the owner keeps an item
until a remote consumer consumed it) or UDP (an item split into datagrams
and put back together; a lost fragment loses the item, counted). Remote
ends are :func:`producer` and :func:`consumer`. Every call that can wait
takes a timeout (seconds) and raises :class:`ChannelTimeout` when it runs
out; nothing waits forever. The runtime writes its own trace records
(group ``chan``: put, get, block, send, recv, lock, alloc, arrived) into the
process's trace when one is open, which is how the report splits a thread's
time into application, blocking, runtime and messaging.

    hub = Hub(listen="0.0.0.0:47600")
    frames = hub.create("frames", capacity=8, full="drop-oldest")
    mine = frames.consumer()
    frames.put(1, b"...")
    with mine.get(timeout=1.0) as item:   # consumed when the block ends
        use(item.ts, item.data)

    # on another host
    p = producer("10.0.0.1:47600", "frames", transport="udp")
    p.put(2, frame_bytes)
    c = consumer("10.0.0.1:47600", "frames")
    item = c.get(which="latest")

Channels declared in an experiment file (``channels:``) are hosted by the
lab, one hub process per host that holds any; a program or app process
finds them by name alone, and the transport declared is used::

    frames = producer("frames")          # from LOOPSCOPE_CHANNELS
    seen = consumer("frames", capacity=8)

When the run gives LOOPSCOPE_CHANNEL_STATS (a file), the counts of every
remote end a process opened are written there at exit, so the report can
show what the receiving side lost (incomplete and missing UDP items).
"""

from __future__ import annotations

import atexit
import json
import os
from dataclasses import dataclass
from typing import Any, Callable

from loopscope import _native

ChannelTimeout = _native.ChannelTimeout


@dataclass
class Item:
    """An item got from a channel: its timestamp and bytes. ``consume()``
    (or leaving a ``with`` block) marks it consumed for the consumer that
    got it."""

    ts: int
    data: bytes
    _consume: Callable[[int], bool]

    def consume(self) -> bool:
        return self._consume(self.ts)

    def __enter__(self) -> "Item":
        return self

    def __exit__(self, *exc: object) -> None:
        self.consume()


def _which(latest: bool, at: int | None) -> tuple[str, int | None]:
    if latest and at is not None:
        raise ValueError("get: give latest=True or at=TS, not both")
    return ("latest", None) if latest else ("at", at) if at is not None else ("next", None)


class Consumer:
    """A consumer of a channel on this process's hub."""

    def __init__(self, core: Any, oldest: bool) -> None:
        self._c = core
        self.id: int = core.attach(oldest)

    def get(self, *, latest: bool = False, at: int | None = None, consume: bool = False, timeout: float = 5.0) -> Item:
        """The next item not got yet (``latest``: the newest, the older ones
        skipped and counted; ``at``: the item with that timestamp, waiting
        for it)."""
        w, ts = _which(latest, at)
        t, data = self._c.get(self.id, w, ts, consume, timeout)
        return Item(t, data, lambda x: self._c.consume(self.id, x))

    def consume(self, ts: int) -> bool:
        return self._c.consume(self.id, ts)

    def detach(self) -> None:
        """Leave the channel; what it had not consumed counts as consumed."""
        self._c.detach(self.id)


class Channel:
    """A channel this process hosts (create it with :meth:`Hub.create`)."""

    def __init__(self, core: Any) -> None:
        self._c = core

    @property
    def name(self) -> str:
        return self._c.name

    def put(self, ts: int, data: bytes, timeout: float = 5.0) -> None:
        self._c.put(ts, data, timeout)

    def consumer(self, oldest: bool = False) -> Consumer:
        """Attach a consumer: it sees the items put from now on (``oldest``:
        also those held now)."""
        return Consumer(self._c, oldest)

    def stats(self) -> dict[str, int]:
        return self._c.stats()


class Hub:
    """The channels a process hosts; with ``listen`` (HOST:PORT, port 0 for
    any) reachable from other processes and hosts on that TCP and UDP port.
    ``frag``: UDP payload bytes per datagram (1400 fits a 1500-byte MTU)."""

    def __init__(self, listen: str | None = None, frag: int = 1400) -> None:
        self._h = _native.HubCore(frag)
        self.address: str | None = self._h.listen(listen) if listen else None

    def create(self, name: str, capacity: int = 64, full: str = "block", max_item: int = 16 << 20) -> Channel:
        return Channel(self._h.create(name, capacity, full, max_item))

    def pump(self, timeout: float) -> bool:
        """Move network input for up to ``timeout`` seconds. Needed only on a
        hub nobody waits on (a get or a blocked put pumps by itself)."""
        return self._h.pump(timeout)

    def net_stats(self) -> dict[str, int]:
        return self._h.net_stats()

    def close(self) -> None:
        self._h.close()


class Producer:
    """A producer of a channel another hub hosts."""

    def __init__(self, hub: str, name: str, transport: str = "tcp", frag: int = 1400, timeout: float = 5.0) -> None:
        self._p = _native.RemoteProducerCore(hub, name, transport, frag, timeout)

    def put(self, ts: int, data: bytes, timeout: float = 5.0) -> None:
        """Hand the item to the network (the owning hub counts what its
        channel refuses: full, a timestamp already put, too large)."""
        self._p.put(ts, data, timeout)

    def stats(self) -> dict[str, int]:
        return self._p.stats()


class RemoteConsumer:
    """A consumer of a channel another hub hosts: the owner pushes every
    item put after attaching; they wait here (at most ``capacity``, the
    oldest dropped and counted) until got."""

    def __init__(
        self, hub: str, name: str, transport: str = "tcp", capacity: int = 64, max_item: int = 16 << 20, frag: int = 1400, timeout: float = 5.0
    ) -> None:
        self._r = _native.RemoteConsumerCore(hub, name, transport, capacity, max_item, frag, timeout)

    def get(self, *, latest: bool = False, at: int | None = None, consume: bool = False, timeout: float = 5.0) -> Item:
        w, ts = _which(latest, at)
        t, data = self._r.get(w, ts, consume, timeout)
        return Item(t, data, self._r.consume)

    def consume(self, ts: int) -> bool:
        return self._r.consume(ts)

    def stats(self) -> dict[str, int]:
        """Counts here: held, got, skipped, dropped; ``incomplete`` and
        ``missing`` items over UDP."""
        return self._r.stats()


def declared() -> dict[str, dict[str, object]]:
    """The channels the run declared: name -> {hub, transport, capacity, full, max_item}."""
    text = os.environ.get("LOOPSCOPE_CHANNELS")
    if not text:
        return {}
    try:
        out = json.loads(text)
    except ValueError:
        raise ValueError(f"LOOPSCOPE_CHANNELS is not JSON: {text[:80]!r}") from None
    return out if isinstance(out, dict) else {}


def _resolve(hub_or_name: str, name: str | None, transport: str | None) -> tuple[str, str, str, dict[str, object]]:
    if name is not None:
        return hub_or_name, name, transport or "tcp", {}
    known = declared()
    d = known.get(hub_or_name)
    if d is None:
        have = ", ".join(sorted(known)) or "none (LOOPSCOPE_CHANNELS is not set: declare channels in the experiment file)"
        raise ValueError(f"no declared channel named {hub_or_name!r}; declared: {have}")
    if transport is not None and transport != d["transport"]:
        raise ValueError(f"channel {hub_or_name!r} is declared with transport {d['transport']!r}, not {transport!r}")
    return d["hub"], hub_or_name, d["transport"], d


_ends: list[tuple[str, str, Any]] = []


def _write_stats() -> None:
    path = os.environ.get("LOOPSCOPE_CHANNEL_STATS")
    if not path or not _ends:
        return
    out = []
    for role, name, end in _ends:
        try:
            out.append({"role": role, "channel": name, "pid": os.getpid(), **end.stats()})
        except Exception:  # noqa: BLE001 - a closed end: nothing to add
            pass
    try:
        with open(path, "a") as f:
            for row in out:
                f.write(json.dumps(row) + "\n")
    except OSError:
        pass


def _track(role: str, name: str, end: Any) -> None:
    if not _ends:
        atexit.register(_write_stats)
    _ends.append((role, name, end))


def producer(hub: str, name: str | None = None, transport: str | None = None, frag: int = 1400, timeout: float = 5.0) -> Producer:
    """A producer of channel ``name`` on ``hub`` (HOST:PORT), or of the
    declared channel ``hub`` when ``name`` is not given."""
    h, n, t, _ = _resolve(hub, name, transport)
    p = Producer(h, n, t, frag, timeout)
    _track("producer", n, p)
    return p


def consumer(
    hub: str, name: str | None = None, transport: str | None = None, capacity: int = 64, max_item: int | None = None, frag: int = 1400, timeout: float = 5.0
) -> RemoteConsumer:
    """A consumer of channel ``name`` on ``hub`` (HOST:PORT), or of the
    declared channel ``hub`` when ``name`` is not given (its ``max_item``
    then defaults to the declared one)."""
    h, n, t, d = _resolve(hub, name, transport)
    c = RemoteConsumer(h, n, t, capacity, max_item or d.get("max_item") or 16 << 20, frag, timeout)
    _track("consumer", n, c)
    return c
