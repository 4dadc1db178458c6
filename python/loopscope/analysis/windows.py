"""The one frame every probe kind hands explain: its attributable intervals.

A kind's ``windows`` hook (``kinds.base.ProbeKind.windows``) returns its
step's intervals in these columns; explain splits the outliers among them
into causes and knows no kind by name. ``t_ns`` and ``latency_ns`` are on
the host's CLOCK_MONOTONIC (explain moves them onto the kernel's with the
host's time-namespace offset); ``span`` True: any stretch of the thread's
time (split into running, blocked and what ran instead), False: from when
the thread should have run to when it ran (split like a timer's wake-up).
"""

from __future__ import annotations


import polars as pl

from loopscope.analysis.registry import Columns

# Text as categoricals: a long run has millions of windows, each naming its probe, phase and host.
WINDOWS: Columns = {
    "rep": pl.Int64,
    "phase": pl.Categorical,
    "probe": pl.Categorical,
    "host": pl.Categorical,
    "tid": pl.Int64,
    "t_ns": pl.Int64,
    "latency_ns": pl.Int64,
    "span": pl.Boolean,
}


def no_windows() -> pl.DataFrame:
    return pl.DataFrame(schema=WINDOWS)
