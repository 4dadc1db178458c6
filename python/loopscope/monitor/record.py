"""``monitor.json``: the monitor's record, declared, read and written here.

The monitor rewrites it at every period's close (atomically: a reader sees
the old record or the new one); ``--resume`` carries its counts over,
``monitor --json`` prints it, and the monitor's page reads it. Each reads
it through ``read``, so a damaged file is said one way.
"""

from __future__ import annotations

import json
import os
from pathlib import Path

from typing_extensions import TypedDict

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
