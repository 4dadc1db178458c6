"""System-call cost probe (Carlinet et al. 2000): front end of ``crates/probes/src/syscall.rs``.

Each call is timed in independent batches until the 95 % confidence
interval of its mean cost is within ``target`` of the mean (default 5 %) or
a cap is reached; the result says which, so a number that did not converge
is never passed off as one that did.
"""

from __future__ import annotations

import os
import tempfile
from dataclasses import dataclass, field

from typing_extensions import TypedDict

import numpy as np

from loopscope import _native
from loopscope.errors import RunError
from loopscope.probes.common import Envelope, envelope, traced
from loopscope.probes.params import Launch, SyscallParams


class CallJson(TypedDict):
    mean_ns: float
    ci95_half_ns: float
    ci95_ns: list[float]
    batches: int
    converged: bool


class SyscallJson(TypedDict):
    """What ``loopscope probe syscall --json`` prints: each call's mean cost with its interval."""

    calls: dict[str, CallJson]
    batch: int
    target_rel: float
    clock_read_ns: float
    interrupted: bool
    trace: str | None
    trace_records: int | None
    trace_lost_records: int | None
    version: Envelope


@dataclass
class CallCost:
    name: str
    mean_ns: float
    ci_half_ns: float
    batches: int
    converged: bool
    batch_ns: np.ndarray = field(repr=False)


@dataclass
class SyscallResult:
    calls: list[CallCost]
    batch: int
    target_rel: float
    clock_read_ns: float
    interrupted: bool
    trace: str | None
    trace_records: int | None = None
    trace_lost: int | None = None

    def to_json(self) -> SyscallJson:
        return {
            "calls": {
                c.name: {
                    "mean_ns": round(c.mean_ns, 2),
                    "ci95_half_ns": round(c.ci_half_ns, 2),
                    "ci95_ns": [round(c.mean_ns - c.ci_half_ns, 2), round(c.mean_ns + c.ci_half_ns, 2)],
                    "batches": c.batches,
                    "converged": c.converged,
                }
                for c in self.calls
            },
            "batch": self.batch,
            "target_rel": self.target_rel,
            "clock_read_ns": round(self.clock_read_ns, 1),
            "interrupted": self.interrupted,
            "trace": self.trace,
            "trace_records": self.trace_records,
            "trace_lost_records": self.trace_lost,
            "version": envelope("syscall"),
        }


def run(
    p: SyscallParams, workdir: str | os.PathLike[str] | None = None, trace_path: str | os.PathLike[str] | None = None, min_batches: int = 10
) -> SyscallResult:
    """Time ``p.calls``; scratch files go to ``p.dir``, else ``workdir``, else the system's temporary directory."""
    d = os.fspath(workdir) if workdir is not None else tempfile.gettempdir()
    with traced(trace_path, ["syscall"]) as tr:
        raw = _native.syscall_probe(p, d, min_batches)
    failed = [c for c in raw["calls"] if c["error"]]
    if failed:
        c = failed[0]
        raise RunError(f"syscall probe: {c['name']} failed: {c['error']}")
    out = [
        CallCost(
            name=c["name"],
            mean_ns=float(c["mean_ns"]),
            ci_half_ns=float(c["ci_half_ns"]),
            batches=len(c["batch_ns"]),
            converged=bool(c["converged"]),
            batch_ns=np.asarray(c["batch_ns"]),
        )
        for c in raw["calls"]
    ]
    return SyscallResult(
        calls=out,
        batch=p.batch,
        target_rel=p.target_pct / 100,
        clock_read_ns=float(raw["clock_read_ns"]),
        interrupted=bool(raw["interrupted"]),
        trace=tr.path,
        trace_records=tr.records,
        trace_lost=tr.lost,
    )


PARAMS = SyscallParams


def launched(p: SyscallParams, launch: Launch) -> SyscallResult:
    """The probe as an agent starts it: scratch files in the run's scratch directory unless it names one."""
    return run(p, launch.scratch, launch.trace)
