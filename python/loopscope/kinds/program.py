"""The ``program`` kind: your own program, instrumented with loopscope's
trace API (it takes its trace file from LOOPSCOPE_TRACE). Every interval it
logs becomes a measure, compared across phases and explained like a
built-in probe's. It may use the lab's channels."""

from __future__ import annotations

from typing import Any, ClassVar, Literal

import polars as pl
from pydantic import Field

from loopscope.analysis.phases import Measure
from loopscope.analysis.registry import Columns, Section, Tables
from loopscope.analysis.inputs import SectionInputs
from loopscope.analysis.steps import Part
from loopscope.rundir import RunRecord, Step
from loopscope.kinds.base import ProbeKind, RunFiles, Series, StepContext, StepRows, Tag, WINDOWS, WindowSource, groups, no_windows
from loopscope.probes.params import ProgramParams
from loopscope.spec.models import Duration, Name, ProbeModel
from fnmatch import fnmatchcase
from loopscope.analysis.steps import program_parts

PATTERNS = Field(default_factory=lambda: ["*"], description="which of its intervals (group/name patterns, * and ? wildcards) have their outliers explained")
WAKEUP: Any = Field(
    default_factory=list,
    description="intervals (patterns) that run from a deadline to when the thread ran, like the timer's: their outliers are split as wake-ups (CPU idle = the wake-up came late) rather than into running/blocked",
)
INTERVALS: Columns = {"interval": pl.String, "tag": pl.UInt32, "tid": pl.Int64, "t_ns": pl.Int64, "dur_ns": pl.Int64, "kind": pl.String}


class ProgramProbe(ProgramParams, ProbeModel):
    """Your own program, instrumented with loopscope's trace API (it takes its trace file from
    LOOPSCOPE_TRACE): every interval it logs is compared across phases and its outliers are
    explained like a built-in probe's."""

    kind: Literal["program"]
    timeout: Duration | None = Field(None, description="with until: exit, how long it may run (default 10 minutes)")
    attribute: list[str] = PATTERNS
    wakeup: list[str] = WAKEUP
    duration: Duration | None = Field(None, description="this probe's time per phase (default: the experiment's duration)")
    host: Name | None = Field(None, description="the host it runs on (default: the first host)")
    uses_channels: ClassVar[bool] = True

    def seconds(self, default_ns: int) -> float:
        if self.until == "exit":
            return (self.timeout or 600_000_000_000) / 1e9
        return super().seconds(default_ns)


def intervals(df: pl.DataFrame, prefix: str, kind: str) -> pl.DataFrame:
    """A program's intervals (its own groups: loopscope's and the channel
    runtime's ``chan``, which the time breakdown uses, left out), named
    ``<prefix><group>/<name>``."""
    name = pl.col("name").cast(pl.String)
    return df.filter((pl.col("kind").cast(pl.String) == "interval") & ~pl.col("group").cast(pl.String).is_in(["loopscope", "chan"])).select(
        (pl.lit(prefix) + pl.col("group").cast(pl.String) + "/" + name).alias("interval"),
        "tag",
        pl.col("tid").cast(pl.Int64),
        "t_ns",
        "dur_ns",
        pl.lit(kind).alias("kind"),
    )


def interval_sweep_values(tables: Tables, probe: str) -> list[tuple[str, pl.DataFrame]]:
    """Each interval a program or app logged, as a series named ``<probe> <interval>``."""
    d = tables.program
    if not len(d):
        return []
    d = d.filter(pl.col("probe") == probe)
    return [(f"{probe} {iv}", g.select("phase", pl.col("dur_ns").alias("value"))) for (iv,), g in d.group_by(["interval"], maintain_order=True)]


def program_windows(kind: ProbeKind[Any], step: Step, src: WindowSource) -> pl.DataFrame:
    """Every interval a program (or an app's process) logged that its
    probe's ``attribute`` patterns select, as windows of the thread that
    logged it, named ``<probe> [<process>: ]<group>/<name>``: any stretch of
    the program's time (``span``), except those its ``wakeup`` patterns name
    (from a deadline to when the thread ran, split like the timer's)."""

    probe: dict[str, Any] = next((p for p in src.spec.get("probes") or [] if p.get("name") == step.probe), {})
    pats, wake = probe.get("attribute") or ["*"], probe.get("wakeup") or []
    out = []
    for part in program_parts(step, src.run, {step.kind: kind}):
        df = src.trace(part.trace)
        if df is None or not len(df):
            continue
        iv = df.filter((pl.col("kind").cast(pl.String) == "interval") & ~pl.col("group").cast(pl.String).is_in(["loopscope", "chan"]) & (pl.col("dur_ns") > 0))
        if not len(iv):
            continue
        iv = iv.with_columns((pl.col("group").cast(pl.String) + "/" + pl.col("name").cast(pl.String)).alias("entity"))
        ents = [e for e in iv["entity"].unique().to_list() if any(fnmatchcase(e, p) for p in pats)]
        woken = [e for e in ents if any(fnmatchcase(e, p) for p in wake)]
        prefix = f"{part.name}: " if part.name else ""
        out.append(
            iv.filter(pl.col("entity").is_in(ents))
            .select(
                pl.lit(step.rep).alias("rep"),
                pl.lit(step.phase).alias("phase"),
                (pl.lit(f"{step.probe} {prefix}") + pl.col("entity")).alias("probe"),
                pl.lit(part.host).alias("host"),
                pl.col("tid"),
                "t_ns",
                pl.col("dur_ns").alias("latency_ns"),
                ~pl.col("entity").is_in(woken).alias("span"),
            )
            .cast(WINDOWS)  # type: ignore[arg-type]
        )
    return pl.concat(out) if out else no_windows()


def interval_measures(tables: Tables, kind: str) -> list[Measure]:
    out = []
    prog = tables.program
    for probe, g in groups(prog.filter(pl.col("kind") == kind) if len(prog) else prog):
        for (ent,), ge in g.group_by("interval", maintain_order=True):
            out.append(Measure(probe, kind, str(ent), ge.select("rep", "phase", "loads", pl.col("dur_ns").alias("value")), ("p50", "p99", "mean"), 32))
    return out


def interval_series(tables: Tables, probe: str) -> list[Series]:
    prog = tables.program.filter(pl.col("probe") == probe)
    return [
        Series(str(ent), str(ent), g.select("rep", "phase", "t_ns", pl.col("dur_ns").alias("value")), prefix=f"{ent}, ")
        for (ent,), g in prog.group_by("interval", maintain_order=True)
    ]


class Program(ProbeKind[ProgramProbe]):
    name = "program"
    model = ProgramProbe
    describe = "Your own program, run with LOOPSCOPE_TRACE set: every interval its instrumentation logged (group/name), compared across phases like a built-in probe's measure."
    tables = {"program": INTERVALS}
    records = (("program", "interval", "dur_ns"),)
    steady = (("program", "dur_ns", ("interval",)),)

    params = ProgramParams

    def run(self, ctx: StepContext, probe: ProgramProbe, key: str, dur_ns: int) -> dict[str, object]:
        spec = {**probe.model_dump(mode="json"), "command": ctx.with_hosts(probe.command)}
        return ctx.run_one(probe, spec, key, dur_ns)

    def local_programs(self, probe: ProgramProbe) -> list[Any]:
        return [probe]

    def rows(self, step: Step, trace: pl.DataFrame, result: dict[str, object], read: RunFiles, tag: Tag) -> StepRows:
        out = StepRows()
        out.add("program", tag(intervals(trace, "", "program")))
        return out

    def measures(self, tables: Tables) -> list[Measure]:
        return interval_measures(tables, "program")

    def series(self, tables: Tables, probe: str) -> list[Series]:
        return interval_series(tables, probe)

    def sweep_values(self, tables: Tables, probe: str) -> list[tuple[str, pl.DataFrame]]:
        """Every interval the program logged, as its own series."""
        return interval_sweep_values(tables, probe)

    def programs(self, step: Step, run: RunRecord) -> list[Part]:
        """The one program the step ran, on its host."""
        return [Part("", run.host_of(step), step.trace)]

    def windows(self, step: Step, src: WindowSource) -> pl.DataFrame:
        return program_windows(self, step, src)

    def silent(self, results: list[dict[str, Any]]) -> str:
        """A program that logged no interval (it is not built against loopscope, or logged only events)."""
        cpu = sum((r.get("user_cpu_ns") or 0) + (r.get("sys_cpu_ns") or 0) for r in results) / max(1, len(results))
        ends = sorted({str(r.get("stopped") or r.get("exit") or "?") for r in results})
        records = sum(int(r.get("records") or 0) for r in results)
        events = sum(sum((r.get("events") or {}).values()) for r in results)
        return (
            f"logged no interval in its {len(results)} step(s): {records:,} trace records ({events:,} events), {cpu / 1e9:.3f} s of CPU per step, "
            f"ended by {', '.join(ends)}. A program that does not log through loopscope is measured from the kernel: "
            "loopscope probe threads -- COMMAND (docs/threads.md)"
        )

    def section(self, sec: Section, tables: Tables, comp: pl.DataFrame, present: list[str], inputs: SectionInputs) -> None:
        super().section(sec, tables, comp, present, inputs)
        sec.images = inputs.images_of(tables.run, sec.name, present, {self.name: self})


KIND = Program()
