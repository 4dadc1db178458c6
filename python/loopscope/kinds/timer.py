"""The ``timer`` kind: wake-up latency of a periodic thread on absolute
deadlines (cyclictest's measurement; the native loop is
``crates/probes/src/timer.rs``)."""

from __future__ import annotations

from typing import Literal

import polars as pl
from pydantic import Field

from loopscope.analysis.phases import Measure
from loopscope.analysis.registry import Tables
from loopscope.rundir import Step
from loopscope.kinds.base import ProbeKind, RunFiles, Series, StepRows, Tag, WindowSource, groups, interval_windows
from loopscope.probes.params import TimerParams
from loopscope.spec.models import Duration, Name, ProbeModel


class TimerProbe(TimerParams, ProbeModel):
    """Timer wake-up latency on absolute deadlines (cyclictest's measurement)."""

    kind: Literal["timer"]
    duration: Duration | None = Field(None, description="this probe's time per phase (default: the experiment's duration)")
    host: Name | None = Field(None, description="the host it runs on (default: the first host)")


class Timer(ProbeKind[TimerProbe]):
    name = "timer"
    windows_on_its_cpus = True
    model = TimerProbe
    params = TimerParams
    describe = "Wake-up latency of a periodic thread on absolute deadlines: how late each wake-up ran (cyclictest's measurement)."
    tables = {"timer": {"thread": pl.UInt32, "t_ns": pl.Int64, "latency_ns": pl.Int64}}
    records = (("timer", "'latency'", "latency_ns"),)
    main = ("timer", "latency_ns")
    steady = (("timer", "latency_ns", ()),)
    labels = {"latency": "wake-up latency"}

    def trace_bytes_per_s(self, probe: TimerProbe) -> float:
        """A record of about 25 bytes per wake-up of each thread (72 kB for 2,920 wake-ups, measured)."""
        return float(probe.threads * 1e6 / probe.interval_us * 25)

    def rows(self, step: Step, trace: pl.DataFrame, result: dict[str, object], read: RunFiles, tag: Tag) -> StepRows:
        out = StepRows()
        w = trace.filter(pl.col("name").cast(pl.String) == "wakeup").select(pl.col("tag").alias("thread"), "t_ns", pl.col("dur_ns").alias("latency_ns"))
        out.add("timer", tag(w))
        return out

    def measures(self, tables: Tables) -> list[Measure]:
        return [
            Measure(probe, "timer", "latency", g.select("rep", "phase", "loads", pl.col("latency_ns").alias("value")), ("p50", "p99", "mean"), 32)
            for probe, g in groups(tables.timer)
        ]

    def missed(self, tables: Tables, probe: str) -> dict[str, list[tuple[int, int]]]:
        """Periods the threads overran and skipped (each a missed deadline), per repetition."""
        out: dict[str, list[tuple[int, int]]] = {}
        for (rep, phase, name), res in sorted(tables.results.items()):
            if name == probe and "missed" in res:
                out.setdefault(phase, []).append((int(res["missed"]), int(res.get("samples") or 0) + int(res["missed"])))
        return out

    def windows(self, step: Step, src: WindowSource) -> pl.DataFrame:
        """Every wake-up, from its deadline to when the thread ran."""
        return interval_windows(step, src, "timer", ["wakeup"], span=False)

    def series(self, tables: Tables, probe: str) -> list[Series]:
        df = tables.timer.filter(pl.col("probe") == probe)
        return [Series("latency", "wake-up latency", df.select("rep", "phase", "t_ns", pl.col("latency_ns").alias("value")))]


KIND = Timer()
