"""The ``syscall`` kind: the per-call cost of system calls, timed in batches
until the 95 % CI is within a target (Carlinet et al. 2000; the native loop
is ``crates/probes/src/syscall.rs``)."""

from __future__ import annotations

from typing import Any, Literal

import polars as pl
from pydantic import Field

from loopscope.analysis.phases import Measure
from loopscope.analysis.registry import Section, Tables
from loopscope.analysis.inputs import SectionInputs
from loopscope.rundir import Step
from loopscope.kinds.base import ProbeKind, RunFiles, StepRows, Tag, WindowSource, groups, interval_windows
from loopscope.probes.params import SyscallParams
from loopscope.spec.models import Duration, Name, ProbeModel
from loopscope.report import charts


class SyscallProbe(SyscallParams, ProbeModel):
    """Per-call cost of system calls, in batches until the 95 % CI is within `target_pct` (Carlinet et al. 2000)."""

    kind: Literal["syscall"]
    duration: Duration | None = Field(None, description="not used: the syscall probe stops when every call has converged or hit its cap")
    host: Name | None = Field(None, description="the host it runs on (default: the first host)")

    def seconds(self, default_ns: int) -> float:
        return self.max_seconds_per_call * len(self.calls)  # its cap: it stops when every call converged


class Syscall(ProbeKind[SyscallProbe]):
    name = "syscall"
    windows_on_its_cpus = True
    model = SyscallProbe
    params = SyscallParams
    describe = "Cost of each system call, timed in batches until the 95% confidence interval is within the target of the mean (Carlinet et al. 2000)."
    tables = {"syscall": {"call": pl.String, "batch": pl.UInt32, "t_ns": pl.Int64, "per_call_ns": pl.Float64}}
    records = (("syscall", "call", "per_call_ns"),)

    def rows(self, step: Step, trace: pl.DataFrame, result: dict[str, Any], read: RunFiles, tag: Tag) -> StepRows:
        batch = int(result.get("batch") or 1)
        s = trace.filter(pl.col("group").cast(pl.String) == "syscall").select(
            pl.col("name").cast(pl.String).alias("call"), pl.col("tag").alias("batch"), "t_ns", (pl.col("dur_ns") / batch).alias("per_call_ns")
        )
        out = StepRows()
        out.add("syscall", tag(s))
        return out

    def windows(self, step: Step, src: WindowSource) -> pl.DataFrame:
        """Every timed batch of a call, as any stretch of the thread's time
        (its own running, the interrupts inside, a preemption), one group per call."""
        return interval_windows(step, src, "syscall", None, span=True, label=f"{step.probe} {{name}}")

    def measures(self, tables: Tables) -> list[Measure]:
        out = []
        for probe, g in groups(tables.syscall):
            for (call,), gc in g.group_by("call", maintain_order=True):
                out.append(Measure(probe, "syscall", str(call), gc.select("rep", "phase", "loads", pl.col("per_call_ns").alias("value")), ("mean",), 1))
        return out

    def section(self, sec: Section, tables: Tables, comp: pl.DataFrame, present: list[str], inputs: SectionInputs) -> None:
        from loopscope.report.sections import cell

        sec.charts.append(charts.syscall_bars(comp, present, f"{sec.name}: cost per call by phase"))
        rows = []
        for call in comp["measure"].unique(maintain_order=True).to_list():
            cells = {}
            for ph in present:
                r = comp.filter((pl.col("measure") == call) & (pl.col("phase") == ph))
                if not r.is_empty():
                    cells[ph] = cell(r.row(0, named=True))
            rows.append({"call": call, "cells": cells})
        sec.syscall = {"phases": present, "rows": rows}


KIND = Syscall()
