"""What a monitor holds of each probe, and what it writes of it and of its
counts in ``monitor.json`` (``statuses``, ``counts``); a resumed monitor's
carry-over of them from the directory (``carry_over``)."""

from __future__ import annotations

import datetime as _dt
import time
from dataclasses import dataclass, field
from pathlib import Path
from typing import TYPE_CHECKING

from hdrh.histogram import HdrHistogram

from loopscope.errors import InputError
from loopscope.monitor import hist
from loopscope.rundir import monitor as record
from loopscope.rundir.monitor import Counts, MonitorJson, ProbeStatus

if TYPE_CHECKING:
    from loopscope.monitor.keeper import Counts as Kept, Keeper

HOUR_NS = 3_600_000_000_000


@dataclass
class ProbeLive:
    """One probe's figures so far (the live view and the metrics read them)."""

    name: str
    period: HdrHistogram = field(default_factory=hist.new)
    whole: HdrHistogram = field(default_factory=hist.new)
    last_period: HdrHistogram | None = None
    max_ns: int = 0
    max_at_utc: str | None = None
    periods: int = 0
    samples: int = 0
    missed: int = 0
    #: time between one period's last value and the next one's first (the probe restarting): not measured
    unmeasured_ns: int = 0
    last_end_k: int | None = None
    #: periods whose probe died (it starts again with the next one), and how many in a row now
    restarts: int = 0
    deaths_in_a_row: int = 0


def utc(t: float) -> str:
    return _dt.datetime.fromtimestamp(t, _dt.timezone.utc).isoformat(timespec="milliseconds")


def statuses(live: dict[str, ProbeLive], probe_host: dict[str, str]) -> dict[str, ProbeStatus]:
    """Each probe's figures over the whole monitor, as ``monitor.json`` holds them."""
    return {
        str(k): {
            "max_ns": v.max_ns or None,
            "max_at_utc": v.max_at_utc,
            "periods": v.periods,
            "count": v.whole.get_total_count(),
            "p99_ns": hist.quantile(v.whole, 0.99),
            "p999_ns": hist.quantile(v.whole, 0.999),
            "samples": v.samples,
            "missed": v.missed,
            "unmeasured_s": round(v.unmeasured_ns / 1e9, 3),
            "probe_restarts": v.restarts,
            "host": probe_host[str(k)],
        }
        for k, v in live.items()
    }


def counts(keeper: Keeper) -> Counts:
    """The flight recorder's counts as they stand."""
    c = keeper.counts
    with keeper.lock:
        return {
            "outliers_above": c.above,
            "kept": c.kept,
            "explained": c.explained,
            "not_kept": dict(c.not_kept),
            "windows": c.windows,
            "windows_removed": c.windows_removed,
            "kept_bytes": c.kept_bytes,
            "recorder_paused_ns": c.paused_ns,
            "by_top_cause": dict(c.by_cause),
        }


def previous(mdir: Path) -> MonitorJson | None:
    """The record a monitor left in ``mdir`` (None: none, or unreadable)."""
    if not record.exists(mdir):
        return None
    try:
        return record.read(mdir)
    except InputError:
        return None


def carry_over(old: MonitorJson, mdir: Path, k: Kept, live: dict[str, ProbeLive], recent: hist.Recent) -> None:
    """Go on from ``old``: its counts, each probe's maximum and whole-run
    histogram (from its interval log), the last hour's periods."""
    c = old.get("counts") or {}
    k.above, k.kept, k.explained = int(c.get("outliers_above", 0)), int(c.get("kept", 0)), int(c.get("explained", 0))
    k.not_kept, k.by_cause = dict(c.get("not_kept") or {}), dict(c.get("by_top_cause") or {})
    k.windows, k.windows_removed, k.paused_ns = int(c.get("windows", 0)), int(c.get("windows_removed", 0)), int(c.get("recorder_paused_ns", 0))
    now_ms = time.time() * 1000
    for name, lv in live.items():
        was = (old.get("probes") or {}).get(str(name))
        if was is not None:
            lv.max_ns, lv.max_at_utc = int(was.get("max_ns") or 0), was.get("max_at_utc")
            lv.periods, lv.samples, lv.missed = int(was.get("periods", 0)), int(was.get("samples", 0)), int(was.get("missed", 0))
            lv.unmeasured_ns = int(float(was.get("unmeasured_s") or 0) * 1e9)
            lv.restarts = int(was.get("probe_restarts") or 0)
        log = mdir / "histograms" / f"{name}.hlog"
        for h in hist.read_log(log) if log.exists() else []:
            lv.whole.add(h)
            if now_ms - h.get_end_time_stamp() < HOUR_NS / 1e6:
                recent.add(time.monotonic_ns() - int((now_ms - h.get_end_time_stamp()) * 1e6), h)
