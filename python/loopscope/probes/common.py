"""What every probe front end shares: its trace session and its JSON envelope."""

from __future__ import annotations

import os
from contextlib import contextmanager
from dataclasses import dataclass
from typing import Any, Iterator

from loopscope.trace import api as trace_api
from loopscope.trace import reader


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
        inf = reader.check(path)
        out.records, out.lost = inf.records, inf.lost_records


def envelope(kind: str) -> dict[str, Any]:
    """Version stamp every probe's JSON carries."""
    from loopscope import __version__

    return {"probe": kind, "loopscope": __version__, "json_format": 1}
