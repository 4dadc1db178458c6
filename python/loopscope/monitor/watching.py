"""A ``live_capture`` kind's watching capture for one period (``threads``).

The probe's own threads only: the probe puts its target in the capture's
``set_event_pid`` (``kernel.drain --watch``), and the tail reads what was
read into the period's directory as it reads a probe's trace.
"""

from __future__ import annotations

import os
from pathlib import Path
from typing import TYPE_CHECKING, Protocol

from loopscope.kernel import capture as C
from loopscope.monitor.tail import LiveSource

if TYPE_CHECKING:
    from loopscope.spec.models import ProbeModel


class Watcher(Protocol):
    """What a watching capture needs of its monitor."""

    src: LiveSource
    watch_name: str
    watch_tids: list[int]

    def note_once(self, text: str) -> None: ...


def watch(mon: Watcher, probe: ProbeModel, d: Path) -> C.Capture | None:
    """A watching capture for ``probe``'s period, or None when the kernel refuses (said once)."""
    cap = C.Capture(d, events=C.WATCH_EVENTS, buffer_mb=C.WATCH_BUFFER_MB, name=mon.watch_name, read="watch")
    meta = cap.start()
    if meta.refused:
        mon.note_once(f"probe {probe.name}: its threads cannot be recorded, so it measures nothing: {meta.refused}")
        return None
    if meta.missing_events:
        mon.note_once(f"probe {probe.name}: this kernel lacks {', '.join(meta.missing_events)}; its threads are measured without them")
    mon.src.stores[str(probe.name)] = d
    try:
        mon.watch_tids = sorted(int(t) for t in os.listdir(f"/proc/{cap.proc.pid}/task")) if cap.proc is not None else []
    except OSError:
        mon.watch_tids = []
    return cap


def unwatch(mon: Watcher, cap: C.Capture) -> None:
    """The watching capture's last read, then its instance removed."""
    cap.stop()
    if cap.final.get("error"):
        mon.note_once(f"the watching capture's last read failed: {cap.final['error']}")
