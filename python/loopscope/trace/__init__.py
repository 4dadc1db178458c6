"""Traces: instrument programs, read what they logged.

Writing (``open``, ``event``, ``interval``, ``counter``, ``histogram``,
``timed``, ``trigger``…) is in :mod:`loopscope.trace.api`; reading (``read``,
``info``, ``histograms``) in :mod:`loopscope.trace.reader`, imported on first
use (it brings polars, which a probe process does not need); the text views
of ``loopscope trace info`` and ``loopscope trace dump`` are in
:mod:`loopscope.trace.narrate`.
"""

from typing import Any

from loopscope.trace.api import (
    EndSummary,
    Entity,
    Session,
    close,
    counter,
    enable_group,
    event,
    flush,
    histogram,
    interval,
    now,
    open,
    prepare_thread,
    timed,
    trigger,
)

_READER = {"TraceInfo", "histograms", "info", "read", "read_with_info", "check"}


def __getattr__(name: str) -> Any:
    if name in _READER:
        from loopscope.trace import reader

        return getattr(reader, name)
    raise AttributeError(name)


__all__ = [
    "EndSummary",
    "Entity",
    "Session",
    "TraceInfo",
    "check",
    "close",
    "counter",
    "enable_group",
    "event",
    "flush",
    "histogram",
    "histograms",
    "info",
    "interval",
    "now",
    "open",
    "prepare_thread",
    "read",
    "read_with_info",
    "timed",
    "trigger",
]
