"""Traces: instrument programs, read what they logged.

Writing (``open``, ``event``, ``interval``, ``counter``, ``histogram``,
``timed``, ``trigger``…) is in :mod:`loopscope.trace.api`; reading (``read``,
``info``, ``histograms``) in :mod:`loopscope.trace.reader`; the text views of
``loopscope trace info`` and ``loopscope trace dump`` in
:mod:`loopscope.trace.narrate`.
"""

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
from loopscope.trace.reader import TraceInfo, histograms, info, read, read_with_info

__all__ = [
    "EndSummary",
    "Entity",
    "Session",
    "TraceInfo",
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
