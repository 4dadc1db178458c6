"""The monitor's histograms of the last hour (``hist.Recent``): bounded
whatever the periods, and their quantile over the span."""

from __future__ import annotations

import numpy as np

from loopscope.monitor import hist


def _of(*values: int) -> hist.HdrHistogram:
    h = hist.new()
    hist.record(h, np.array(values, dtype=np.int64))
    return h


def test_the_last_hour_holds_at_most_a_slot_a_minute_however_many_periods_close() -> None:
    r = hist.Recent(60_000_000_000)  # a minute: slots of a second
    for i in range(5000):  # a period every 0.1 s, four probes each
        for _ in range(4):
            r.add(i * 100_000_000, _of(1000))
    assert len(r.closed) <= hist.Recent.SLOTS + 1


def test_the_quantile_counts_the_span_and_the_open_period_and_forgets_what_is_older() -> None:
    r = hist.Recent(60_000_000_000)
    r.add(0, _of(*[5_000_000] * 1000))  # an old minute of slow values
    r.add(200_000_000_000, _of(*[1000] * 999))  # then, minutes later, fast ones
    assert r.quantile(0.999, np.array([2000], dtype=np.int64), 1000) == hist.quantile(_of(*[1000] * 999, 2000), 0.999)
    assert r.quantile(0.5, np.zeros(0, dtype=np.int64), 5000) is None  # fewer values than asked for
