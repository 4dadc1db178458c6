"""Instrumenting Python programs.

The same event logger C and Rust programs use, reached through the native
module: an entity is registered once and returns a handle whose methods log
records into the calling thread's buffer (about 100 ns from Python, most of it
the interpreter's call overhead). ``open`` starts a session and returns a
context manager that closes it; closing drains every buffer and reports what
was written and what was lost.

    import loopscope.trace as lt
    with lt.open("app.lstrace", groups=["app"]):
        frame = lt.event("app", "frame", "a frame arrived")
        work = lt.interval("app", "work")
        frame(7)
        with lt.timed(work, tag=7):
            do_work()
"""

from __future__ import annotations

import json
import os
from contextlib import contextmanager
from dataclasses import dataclass, field
from pathlib import Path
from typing import Iterator, Sequence

from loopscope import _native
from loopscope.errors import InputError

Entity = _native.Entity


@dataclass(frozen=True)
class EndSummary:
    """What a closed session wrote: bytes, records lost per stream, dumps."""

    path: str
    bytes_written: int
    lost_records: int
    lost_by_stream: list[int] = field(default_factory=list)
    dumps: int = 0


class Session:
    """An open trace; use as a context manager or call ``close()``."""

    def __init__(self, path: str) -> None:
        self.path = path
        self.summary: EndSummary | None = None

    def close(self) -> EndSummary:
        if self.summary is None:
            end = json.loads(_native.close())
            self.summary = EndSummary(
                path=self.path, bytes_written=end["bytes_written"], lost_records=end["lost_records"], lost_by_stream=end["lost_by_stream"], dumps=end["dumps"]
            )
        return self.summary

    def __enter__(self) -> "Session":
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()


def open(
    path: str | os.PathLike[str] | None = None,
    *,
    groups: Sequence[str] | None = None,
    ring_groups: Sequence[str] | None = None,
    config: str | os.PathLike[str] | None = None,
    fsync: bool = False,
    flush_ms: int | None = None,
    writer_idle: bool = False,
) -> Session:
    """Open a trace file (``path`` None: ``$LOOPSCOPE_TRACE``, which a run's
    ``program`` probe sets).

    ``groups``: group patterns the main stream logs (default ``["*"]``, or
    ``$LOOPSCOPE_GROUPS``). ``ring_groups``: groups for a flight-recorder
    stream ``ring`` written only on ``trigger("ring")``. ``config``: a TOML
    file with ``[[stream]]`` tables (docs/trace-format.md), else
    ``$LOOPSCOPE_CONFIG``; ``flush_ms`` (without ``config``): how long the
    writer sleeps between quiet cycles (default 10).
    """
    if path is None:
        path = os.environ.get("LOOPSCOPE_TRACE") or ""
        if not path:
            raise InputError("no trace path given and LOOPSCOPE_TRACE is not set")
    text = None
    if config is None and (flush_ms is not None or writer_idle):
        # how long the writer sleeps between quiet cycles, and whether it runs at SCHED_IDLE (docs/trace-format.md)
        text = (f"flush_ms = {int(flush_ms)}\n" if flush_ms is not None else "") + ("writer_idle = true\n" if writer_idle else "")
    if config is not None:
        p = Path(config)
        try:
            text = p.read_text()
        except OSError as e:
            raise InputError(f"{p}: cannot read the trace configuration: {e.strerror}") from None
    _native.open(os.fspath(path), text, list(groups) if groups is not None else None, list(ring_groups) if ring_groups is not None else None, fsync)
    return Session(os.fspath(path))


def close() -> EndSummary:
    """Close the open trace (when not using the Session object)."""
    return Session("").close()


def flush() -> None:
    """Wait until the writer has taken everything logged so far."""
    _native.flush()


def enable_group(group: str, on: bool = True, stream: str = "main") -> None:
    """Switch a group on or off in a stream of the open trace."""
    _native.enable_group(stream, group, on)


def trigger(stream: str = "ring", tag: int = 0) -> None:
    """Write out a flight-recorder stream with the records that led here."""
    _native.trigger(stream, tag)


def prepare_thread() -> bool:
    """Allocate this thread's buffers now rather than at its first record."""
    return _native.prepare_thread()


def now() -> int:
    """A raw timestamp for starting an interval."""
    return _native.now()


def event(group: str, name: str, desc: str = "") -> Entity:
    """Register an event: ``e(tag)``, ``e.event(tag, value=…)``, ``e.event(tag, payload=b…)``."""
    return _native.register_entity(group, name, "event", desc)


def interval(group: str, name: str, desc: str = "") -> Entity:
    """Register an interval: ``e.interval(start, tag)`` or ``with timed(e): …``."""
    return _native.register_entity(group, name, "interval", desc)


def counter(group: str, name: str, desc: str = "") -> Entity:
    """Register a counter: ``c.add(n)``, ``c.log()``, ``c.reset()``."""
    return _native.register_entity(group, name, "counter", desc)


def histogram(group: str, name: str, desc: str = "", *, max: int = 1 << 40, sub_bits: int = 7, linear: tuple[int, int, int] | None = None) -> Entity:
    """Register a fixed-memory histogram: ``h.add(v)``, ``h.log()``, ``h.reset()``.

    Log-linear over [0, max] by default (bucket width at most 1/2^(sub_bits-1)
    of the value); ``linear=(lo, hi, n)`` for n equal buckets over [lo, hi).
    Values outside the range are counted as underflow/overflow.
    """
    if linear is not None:
        lo, hi, n = linear
        scale = {"scale": "linear", "lo": int(lo), "hi": int(hi), "n": int(n)}
    else:
        scale = {"scale": "log", "sub_bits": int(sub_bits), "max": int(max)}
    return _native.register_entity(group, name, "histogram", desc, json.dumps(scale))


@contextmanager
def timed(entity: Entity, tag: int = 0) -> Iterator[None]:
    """Log the enclosed block as one interval record."""
    t0 = _native.now()
    try:
        yield
    finally:
        entity.interval(t0, tag)
