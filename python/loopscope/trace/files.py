"""A run's files by their path in the run directory, for the analysis.

The analysis takes data, not paths: ``report.build`` (or a command) opens
the run directory once and hands the typed record and a ``Files`` down;
breakdown, items, channel statistics and the clock estimate ask it for a
step's trace by the relative path the record names, and never build a path
themselves. Inside ``reader.shared()`` (as the report reads) each trace is
decoded once however many parts ask for it. A file that is missing answers
None, so each caller says what it costs instead of failing the report.
"""

from __future__ import annotations

from pathlib import Path

import polars as pl

from loopscope.trace import reader
from loopscope.trace.reader import TraceInfo


class Files:
    """The files of one run directory, by their path in it."""

    def __init__(self, root: str | Path) -> None:
        self.root = Path(root)

    def trace_info(self, rel: str) -> tuple[pl.DataFrame, TraceInfo] | None:
        """A trace and its header (calibration pairs, counts); None when missing."""
        p = self.root / rel
        return reader.read_with_info(p, sort=False) if p.is_file() else None

    def trace(self, rel: str) -> pl.DataFrame | None:
        """A trace's records (unsorted); None when missing."""
        got = self.trace_info(rel)
        return None if got is None else got[0]

    def info(self, rel: str) -> TraceInfo | None:
        """A trace's header only (no records decoded); None when missing or unreadable."""
        p = self.root / rel
        if not p.is_file():
            return None
        try:
            return reader.info(p)
        except Exception:  # noqa: BLE001 - a damaged trace costs its header only
            return None

    def text(self, rel: str) -> str | None:
        """A text file of the run (a probe's JSON, a hub's statistics); None when missing."""
        try:
            return (self.root / rel).read_text()
        except (OSError, UnicodeDecodeError):
            return None
