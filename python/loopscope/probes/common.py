"""What every probe front end shares: its trace session and its JSON envelope."""

from __future__ import annotations

import json
import os
from contextlib import contextmanager
from dataclasses import dataclass
from typing import Any, Iterator

from loopscope import _native
from loopscope.trace import api as trace_api


@dataclass
class TraceOutcome:
    path: str | None = None
    records: int | None = None
    lost: int | None = None


@contextmanager
def traced(path: str | os.PathLike[str] | None, groups: list[str]) -> Iterator[TraceOutcome]:
    """Open a trace logging ``groups`` (plus ``loopscope``) around a probe run;
    afterwards the outcome holds the records written and lost."""
    out = TraceOutcome(path=os.fspath(path) if path is not None else None)
    session = trace_api.open(path, groups=[*groups, "loopscope"]) if path is not None else None
    try:
        yield out
    finally:
        if session is not None:
            session.close()
    if path is not None:
        # Count what reached the file (no table is built: polars stays unloaded).
        _, meta = _native.read_trace(os.fspath(path), False, True)
        stats = json.loads(meta)["stats"]
        out.records, out.lost = stats["records"], stats["lost_records"]


def envelope(kind: str) -> dict[str, Any]:
    """Version stamp every probe's JSON carries."""
    from loopscope import __version__

    return {"probe": kind, "loopscope": __version__, "json_format": 1}
