"""``monitor.json``: the monitor's record, declared, read and written here;
and the lines of ``periods.jsonl`` and ``outliers.jsonl``, declared and read
here (the loop and the keeper append them as they close).

The monitor rewrites it at every period's close (atomically: a reader sees
the old record or the new one); ``--resume`` carries its counts over,
``monitor --json`` prints it, and the monitor's page reads it. Each reads
it through ``read``, so a damaged file is said one way. It sits with the run
directory's declarations, below the monitor, because the dataset (``runs``,
``query``) reads monitors' directories as it reads runs.
"""

from __future__ import annotations

import json
import os
from pathlib import Path
from typing import cast

from typing_extensions import NotRequired, TypedDict

from loopscope.errors import InputError

NAME = "monitor.json"


class ProbeStatus(TypedDict):
    """One probe's figures over the whole monitor."""

    max_ns: int | None
    max_at_utc: str | None
    periods: int
    count: int
    p99_ns: int | None
    p999_ns: int | None
    samples: int
    missed: int
    unmeasured_s: float
    probe_restarts: int
    #: the spec's name of its host
    host: NotRequired[str]


class Counts(TypedDict):
    """The flight recorder's counts: outliers above the threshold, kept, explained, and why others were not kept."""

    outliers_above: int
    kept: int
    explained: int
    not_kept: dict[str, int]
    windows: int
    windows_removed: int
    kept_bytes: int
    recorder_paused_ns: int
    by_top_cause: dict[str, int]


class MonitorJson(TypedDict):
    """``monitor.json``, and what ``loopscope monitor --json`` prints at the end."""

    format: str
    name: str
    status: str
    pid: int
    started_utc: str
    updated_utc: str
    settings: dict[str, object]
    periods: int
    probes: dict[str, ProbeStatus]
    counts: Counts
    recorder: str
    session: str
    notes: list[str]


class Cause(TypedDict):
    """One cause of an outlier: its time in the outlier and its share of it."""

    cause: str
    ns: int
    share: float


class OutlierLine(TypedDict):
    """One line of ``outliers.jsonl``: an outlier, whether its window was kept (and why not), and its causes."""

    probe: str
    host: str
    tid: int
    t_ns: int
    latency_ns: int
    #: the kept window's directory (None: not kept)
    window: str | None
    not_kept: str | None
    queued_after_ms: NotRequired[float]
    kept_after_ms: NotRequired[float]
    detail: NotRequired[str]
    causes: NotRequired[list[Cause]]
    complete: NotRequired[bool]
    top_cause: NotRequired[str | None]
    missing: NotRequired[str]


class PeriodLine(TypedDict):
    """One line of ``periods.jsonl``: a probe's period, its count and quantiles, its maximum and when."""

    period: int
    probe: str | None
    #: the spec's name of the host the probe measured on (lines before fleets: none, the probe's host)
    host: NotRequired[str]
    start_utc: str
    end_utc: str
    seconds: float
    count: int
    #: time between the previous period's last value and this one's first (not measured)
    gap_s: float | None
    probe_died: NotRequired[str]
    p50_ns: NotRequired[int | None]
    p99_ns: NotRequired[int | None]
    p999_ns: NotRequired[int | None]
    max_ns: NotRequired[int]
    max_t_ns: NotRequired[int]
    max_at_utc: NotRequired[str]
    samples: NotRequired[int]
    missed: NotRequired[int]
    interrupted: NotRequired[str | None]


def lines(p: Path) -> list[dict[str, object]]:
    """The whole JSON lines of ``p`` (a line cut short by a kill is skipped); [] when there is no file."""
    if not p.exists():
        return []
    out: list[dict[str, object]] = []
    for line in p.read_text().splitlines():
        line = line.strip()
        if line.startswith("{") and line.endswith("}"):
            try:
                out.append(json.loads(line))
            except ValueError:
                continue
    return out


def periods(d: Path) -> list[PeriodLine]:
    """``periods.jsonl`` of monitor directory ``d``."""
    return cast(list[PeriodLine], lines(d / "periods.jsonl"))


def outliers(d: Path) -> list[OutlierLine]:
    """``outliers.jsonl`` of monitor directory ``d``."""
    return cast(list[OutlierLine], lines(d / "outliers.jsonl"))


def exists(d: Path) -> bool:
    return (d / NAME).exists()


def read(d: Path) -> MonitorJson:
    """The record of monitor directory ``d``; InputError naming the file when it is missing or damaged."""
    p = d / NAME
    try:
        rec: MonitorJson = json.loads(p.read_text())
    except (OSError, ValueError) as e:
        raise InputError(f"{p}: cannot be read ({e}); give the directory a monitor wrote") from None
    return rec


def write(d: Path, rec: MonitorJson) -> None:
    """Write the record atomically."""
    p = d / NAME
    tmp = p.with_suffix(".tmp")
    tmp.write_text(json.dumps(rec, indent=1) + "\n")
    os.replace(tmp, p)
