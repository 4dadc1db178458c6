"""The programs behind a run's steps: one for a `program` probe, one per
process for an `app`, plus the hubs of the channels the experiment
declared (named ``hub-HOST``); every reader of their traces (tables, explain, the
time breakdown, per-item events, the report's images) goes through here."""

from __future__ import annotations

from typing import Any, NamedTuple


class Part(NamedTuple):
    name: str  # the app's process ("" for a program probe)
    host: str
    trace: str  # relative to the run directory


def program_parts(st: dict[str, Any], run: dict[str, Any], hubs: bool = True) -> list[Part]:
    out: list[Part] = []
    if st.get("kind") == "program":
        out = [Part("", st.get("host") or next(iter(run.get("hosts") or {"localhost": 0})), st["trace"])]
    elif st.get("kind") == "app":
        out = [Part(p["name"], p["host"], p["trace"]) for p in st.get("processes") or []]
    if hubs:
        out += [Part(h["name"], h["host"], h["trace"]) for h in st.get("hubs") or []]
    return out
