"""The programs behind a run's steps: one for a `program` probe, one per
process for an `app`; every reader of their traces (tables, explain, the
time breakdown, per-item events, the report's images) goes through here."""

from __future__ import annotations

from typing import Any, NamedTuple


class Part(NamedTuple):
    name: str  # the app's process ("" for a program probe)
    host: str
    trace: str  # relative to the run directory


def program_parts(st: dict[str, Any], run: dict[str, Any]) -> list[Part]:
    if st.get("kind") == "program":
        return [Part("", st.get("host") or next(iter(run.get("hosts") or {"localhost": 0})), st["trace"])]
    if st.get("kind") == "app":
        return [Part(p["name"], p["host"], p["trace"]) for p in st.get("processes") or []]
    return []
