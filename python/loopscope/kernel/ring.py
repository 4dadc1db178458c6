"""A draining flight recorder's memory (``Ring``): the kernel's pages, per
CPU, for as long as the recorder reaches back.

The draining recorder reads its buffers every ``DRAIN_EVERY_S`` and keeps
the raw pages here, not decoded events: a keep decodes only the pages that
overlap its window. Pages older than the reach fall off the front, oldest
first, but only once the ring holds more than ``SPARE_BYTES``: below that a
page stays longer than the reach, so a keep that comes late still finds its
window. Late keeps happen when the monitor's own threads get no CPU for
seconds (beside a context-switch storm its tail and keeper waited up to 6 s
each for a CPU): a few MB more memory turns those windows from lost
(``overwritten``) into kept late (``kept_after_ms`` says how late). Under a
storm the recorder records (150 MB for an 8 s reach), the ring holds the
reach and no more, as before. Stretches the kernel overwrote before a read
took them are kept as gaps, so a window over one says so.
"""

from __future__ import annotations

from collections import deque

#: what the ring may hold without letting go of pages older than the reach (a few minutes of the probes' CPUs
#: at the demo's noise; under a storm on the recorded CPUs the reach alone is more than this)
SPARE_BYTES = 32 << 20


class Ring:
    """A draining flight recorder's memory: per CPU, the pages read from the
    kernel in order, each with its header's time, for ``reach_ns``; and the
    stretches the kernel overwrote before a read took them."""

    def __init__(self, reach_ns: int, page_size: int, spare_bytes: int = SPARE_BYTES) -> None:

        self.reach_ns, self.page_size, self.spare_bytes = reach_ns, page_size, spare_bytes
        self.pages: dict[int, deque[tuple[int, bytes]]] = {}
        self.gaps: list[tuple[int, int, int, int]] = []  # (cpu, from, to, events)
        self.bytes = 0
        self.cut: dict[int, int] = {}  # per CPU, once pages were let go: the time the oldest kept page starts

    def add(self, cpu: int, buf: bytes) -> None:

        q = self.pages.setdefault(cpu, deque())
        ps = self.page_size
        for i in range(0, len(buf), ps):
            page = buf[i : i + ps]
            if len(page) < 16:
                continue
            q.append((int.from_bytes(page[:8], "little"), page))
            self.bytes += len(page)

    def trim(self, now_k: int) -> None:
        """While the ring holds more than ``spare_bytes``, the oldest pages
        whose whole span ended more than ``reach_ns`` ago go (the next
        page's time is where a page ends), whichever CPU they are of."""
        edge = now_k - self.reach_ns
        while self.bytes > self.spare_bytes:
            old = [(q[0][0], c) for c, q in self.pages.items() if len(q) > 1 and q[1][0] < edge]
            if not old:
                break
            c = min(old)[1]
            q = self.pages[c]
            self.bytes -= len(q.popleft()[1])
            self.cut[c] = q[0][0]
        held = min((q[0][0] for q in self.pages.values() if q), default=edge)
        self.gaps = [g for g in self.gaps if g[2] >= min(edge, held)]

    def over(self, cpu: int, t0: int, t1: int) -> list[bytes]:
        """The pages of ``cpu`` that may hold events in [t0, t1]."""
        q = self.pages.get(cpu)
        if not q:
            return []
        out = []
        items = list(q)
        for i, (ts, page) in enumerate(items):
            end = items[i + 1][0] if i + 1 < len(items) else None
            if ts <= t1 and (end is None or end >= t0):
                out.append(page)
        return out
