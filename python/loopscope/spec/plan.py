"""The order a run follows: repetitions × phases × probes.

Within a repetition every phase runs once (its loads held throughout) and
every probe runs in turn inside it. Repetitions are interleaved (baseline,
load A, load B, baseline, load A, …) so that a slow drift of the machine
affects every phase alike; ``order: shuffled`` also permutes the phases of
each repetition (seeded, so a rerun follows the same order).
"""

from __future__ import annotations

import random
from dataclasses import dataclass
from typing import Any

from loopscope.spec.models import Experiment, Phase


@dataclass(frozen=True)
class PhaseRun:
    rep: int
    phase: Phase
    index: int  # position in the run, from 0

    @property
    def key(self) -> str:
        return f"r{self.rep:02d}-{self.phase.name}"


def phase_runs(exp: Experiment) -> list[PhaseRun]:
    out: list[PhaseRun] = []
    for rep in range(1, exp.repetitions + 1):
        phases = list(exp.phases or [])
        if exp.order == "shuffled":
            random.Random(exp.seed * 1_000_003 + rep).shuffle(phases)
        for ph in phases:
            out.append(PhaseRun(rep, ph, len(out)))
    return out


def probe_seconds(exp: Experiment, probe: Any) -> float:
    """Time a probe takes in one phase (its kind decides: the syscall probe's is its cap)."""
    return float(probe.seconds(exp.duration))


def estimate_seconds(exp: Experiment) -> float:
    per_phase = exp.warmup / 1e9 + sum(probe_seconds(exp, p) for p in exp.probes)
    return per_phase * len(phase_runs(exp))
