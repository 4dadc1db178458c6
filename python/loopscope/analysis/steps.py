"""The programs behind a run's steps: one for a `program` probe, one per
process for an `app`, plus the hubs of the channels the experiment
declared (named ``hub-HOST``); every reader of their traces (tables, explain, the
time breakdown, per-item events, the report's images) goes through here."""

from __future__ import annotations

from typing import NamedTuple, Protocol

from loopscope.rundir import RunRecord, Step


class Part(NamedTuple):
    name: str  # the app's process ("" for a program probe)
    host: str
    trace: str  # relative to the run directory


class HasPrograms(Protocol):
    """A kind that may start programs (``kinds.base.ProbeKind.programs``)."""

    def programs(self, step: Step, run: RunRecord) -> list[Part]: ...


class Kinds(Protocol):
    """The kinds by name (the registry, or one kind for its own steps)."""

    def get(self, name: str) -> HasPrograms | None: ...


def program_parts(st: Step, run: RunRecord, kinds: Kinds, hubs: bool = True) -> list[Part]:
    """The programs ``st``'s kind started, and the hubs beside them."""
    kind = kinds.get(st.kind)
    out: list[Part] = kind.programs(st, run) if kind is not None else []
    if hubs:
        out += [Part(h.name, h.host, h.trace) for h in st.hubs or []]
    return out
