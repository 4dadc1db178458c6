"""The ``sched`` kind: scheduler responsiveness, a thread alternating sleep
and work next to busy threads (Paul et al. 2003; the native loop is
``crates/probes/src/sched.rs``). Its burst is sized once per run on the idle
machine (``prepare``), so every phase runs the same work."""

from __future__ import annotations

from typing import Any, Callable, Literal

import polars as pl
from pydantic import Field

from loopscope.analysis.phases import Measure
from loopscope.analysis.registry import Section, Tables
from loopscope.analysis.inputs import SectionInputs
from loopscope.rundir import Step
from loopscope.kinds.base import ProbeKind, RunFiles, Series, StepContext, StepRows, Tag, WindowSource, groups, interval_windows
from loopscope.probes.params import SchedParams
from loopscope.spec.models import Duration, Name, ProbeModel


class SchedProbe(SchedParams, ProbeModel):
    """Scheduler responsiveness: a thread alternating sleep and work next to busy threads (Paul et al. 2003)."""

    kind: Literal["sched"]
    duration: Duration | None = None
    host: Name | None = Field(None, description="the host it runs on (default: the first host)")


class Sched(ProbeKind[SchedProbe]):
    name = "sched"
    windows_on_its_cpus = True
    model = SchedProbe
    params = SchedParams
    describe = (
        "A thread alternating sleep and work next to busy threads (Paul et al. 2003): its wake-up delay past each deadline, and how long each "
        "burst of work took (the same work in every phase, sized once on the idle machine; its time alone is the reference)."
    )
    tables = {"sched": {"cycle": pl.UInt32, "t_ns": pl.Int64, "wake_delay_ns": pl.Int64, "burst_ns": pl.Int64, "extra_ns": pl.Int64}}
    records = (("sched", "'wake_delay'", "wake_delay_ns"), ("sched", "'burst'", "burst_ns"))
    main = ("sched", "wake_delay_ns")
    steady = (("sched", "wake_delay_ns", ()),)
    labels = {"wake_delay": "wake-up delay", "burst": "burst completion time"}

    def prepare(self, ctx: StepContext, probe: SchedProbe, say: Callable[[str], None]) -> dict[str, int] | None:
        say(f"calibrating {probe.name} (idle)")
        r = ctx.calibrate(probe)
        return {"work_iters": int(r["work_iters"]), "alone_ns": int(r["alone_ns"])}

    def rows(self, step: Step, trace: pl.DataFrame, result: dict[str, Any], read: RunFiles, tag: Tag) -> StepRows:
        name = pl.col("name").cast(pl.String)
        wk = trace.filter(name == "wakeup").select(pl.col("tag").alias("cycle"), pl.col("t_ns"), pl.col("dur_ns").alias("wake_delay_ns"))
        bu = trace.filter(name == "burst").select(pl.col("tag").alias("cycle"), pl.col("dur_ns").alias("burst_ns"))
        alone = int(result.get("alone_ns") or 0)
        out = StepRows()
        out.add("sched", tag(wk.join(bu, on="cycle", how="left").with_columns((pl.col("burst_ns") - alone).alias("extra_ns"))))
        return out

    def measures(self, tables: Tables) -> list[Measure]:
        out = []
        for probe, g in groups(tables.sched):
            out.append(
                Measure(probe, "sched", "wake_delay", g.select("rep", "phase", "loads", pl.col("wake_delay_ns").alias("value")), ("p50", "p99", "mean"), 32)
            )
            out.append(Measure(probe, "sched", "burst", g.select("rep", "phase", "loads", pl.col("burst_ns").alias("value")), ("p50", "p99", "mean"), 32))
        return out

    def windows(self, step: Step, src: WindowSource) -> pl.DataFrame:
        """Every wake-up, from the waker's wake-up call to when the thread ran."""
        return interval_windows(step, src, "sched", ["wakeup"], span=False)

    def series(self, tables: Tables, probe: str) -> list[Series]:
        df = tables.sched.filter(pl.col("probe") == probe)
        return [
            Series("wake_delay", "wake-up delay", df.select("rep", "phase", "t_ns", pl.col("wake_delay_ns").alias("value"))),
            Series("burst", "burst completion time", df.select("rep", "phase", "t_ns", pl.col("burst_ns").alias("value")), scan=False),
        ]

    def section(self, sec: Section, tables: Tables, comp: pl.DataFrame, present: list[str], inputs: SectionInputs) -> None:
        cal = tables.run.calibration.get(sec.name)
        if cal:
            from loopscope.report.sections import ns

            sec.describe += f" Here the burst is {cal['work_iters']:,} iterations, {ns(cal['alone_ns'])} alone."
        super().section(sec, tables, comp, present, inputs)


KIND = Sched()
