"""The order a run follows: repetitions × phases × probes.

Within a repetition every phase runs once (its loads held throughout) and
every probe runs in turn inside it. Repetitions are interleaved (baseline,
load A, load B, baseline, load A, …) so that a slow drift of the machine
affects every phase alike; ``order: shuffled`` also permutes the phases of
each repetition (seeded, so a rerun follows the same order).
"""

from __future__ import annotations

import os
import random
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any, NamedTuple, Protocol

from loopscope.spec.models import Experiment, Phase
from loopscope.kernel.capture import size_buffers

if TYPE_CHECKING:
    from loopscope.spec.models import ProbeModel


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


def probe_seconds(exp: Experiment, probe: ProbeModel) -> float:
    """Time a probe takes in one phase (its kind decides: the syscall probe's is its cap)."""
    return float(probe.seconds(exp.duration))


def estimate_seconds(exp: Experiment) -> float:
    per_phase = exp.warmup / 1e9 + sum(probe_seconds(exp, p) for p in exp.probes)
    return per_phase * len(phase_runs(exp))


#: what the kernel capture writes to disk per second of a run and kernel
#: (its segment files, zstd): a quiet run's and a busy one's (measured on a
#: 2-CPU machine: 0.06 MB/s for the demo's 30 s, 0.09 for a timer alone,
#: 0.4-0.7 under pipelines and context-switch storms)
KERNEL_MB_PER_S = (0.05, 0.7)


class Footprint(NamedTuple):
    """What a run will take: disk (MB, a low and a high figure) and the kernel
    ring buffers' memory (MiB), and the probes whose traces it cannot size."""

    disk_mb: tuple[float, float]
    kernel_mb: tuple[float, float]
    traces_mb: float
    buffers_mib: int
    buffer_mib_per_cpu: int
    unsized: list[str]


class _KindsByName(Protocol):
    def __getitem__(self, name: str) -> Any: ...


def estimate_footprint(exp: Experiment, kinds: _KindsByName) -> Footprint:
    """The disk and memory of running ``exp`` here, from its length and rates:
    each probe's trace at its kind's rate over its windows, the kernel capture
    (when on) over the whole run on every host, and its ring buffers (per CPU,
    sized as the run would size them, on every host of this machine)."""

    n = len(phase_runs(exp))
    traces, unsized = 0.0, []
    for p in exp.probes:
        rate = kinds[p.kind].trace_bytes_per_s(p)
        if rate is None:
            unsized.append(p.name or p.kind)
        else:
            traces += rate * probe_seconds(exp, p) * n / 1e6
    # one capture per kernel: this machine's (its namespaces share it) and each ssh or exec host's (at most: exec hosts on one kernel share one)
    here = any(not h.remote for h in exp.hosts) or not exp.hosts
    kernels = int(here) + sum(1 for h in exp.hosts if h.remote)
    capture = exp.kernel.capture != "off"
    secs = estimate_seconds(exp)
    kern = (KERNEL_MB_PER_S[0] * secs * kernels, KERNEL_MB_PER_S[1] * secs * kernels) if capture else (0.0, 0.0)
    longest = max((probe_seconds(exp, p) for p in exp.probes), default=None)
    per_cpu = size_buffers(longest, exp.kernel.buffer_mb)[0] if capture and here else 0
    return Footprint((kern[0] + traces, kern[1] + traces), kern, traces, per_cpu * (os.cpu_count() or 1), per_cpu, unsized)
