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
from typing import Any

import numpy as np

from loopscope import _native
from loopscope.errors import InputError, RunError
from loopscope.probes.common import envelope, traced

CALLS: list[str] = list(_native.syscall_names())


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

    def to_json(self) -> dict[str, Any]:
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


def validate(calls: list[str], batch: int, target_rel: float, max_batches: int) -> None:
    for c in calls:
        try:
            _native.syscall_parse(c)
        except ValueError as e:
            raise InputError(f"--calls: {e}") from None
    if not calls:
        raise InputError("--calls: name at least one system call")
    if not 1 <= batch <= 500:
        raise InputError(f"--batch: must be 1..500 calls [got {batch}]")
    if not 0 < target_rel < 1:
        raise InputError(f"--target: must be between 0 and 100 % [got {target_rel * 100:g} %]")
    if max_batches < 2:
        raise InputError(f"--max-batches: must be at least 2 [got {max_batches}]")


def run(
    *,
    calls: list[str] | None = None,
    batch: int = 200,
    target_rel: float = 0.05,
    min_batches: int = 10,
    max_batches: int = 2000,
    max_seconds: float = 5.0,
    workdir: str | os.PathLike[str] | None = None,
    trace_path: str | os.PathLike[str] | None = None,
) -> SyscallResult:
    calls = list(calls or CALLS)
    validate(calls, batch, target_rel, max_batches)
    d = os.fspath(workdir) if workdir is not None else tempfile.gettempdir()
    with traced(trace_path, ["syscall"]) as tr:
        raw = _native.syscall_probe(calls, d, batch, min_batches, max_batches, target_rel, max_seconds)
    failed = [c for c in raw["calls"] if c["error"]]
    if failed:
        c = failed[0]
        raise RunError(f"syscall probe: {c['name']} failed: {c['error']}")
    out = [
        CallCost(
            name=c["name"], mean_ns=float(c["mean_ns"]), ci_half_ns=float(c["ci_half_ns"]),
            batches=len(c["batch_ns"]), converged=bool(c["converged"]), batch_ns=np.asarray(c["batch_ns"]),
        )
        for c in raw["calls"]
    ]
    return SyscallResult(
        calls=out, batch=batch, target_rel=target_rel, clock_read_ns=float(raw["clock_read_ns"]),
        interrupted=bool(raw["interrupted"]), trace=tr.path, trace_records=tr.records, trace_lost=tr.lost,
    )
