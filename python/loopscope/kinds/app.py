"""The ``app`` kind: several programs that work together across hosts (a
video pipeline, a control loop), each instrumented like a ``program``
probe. They start in the order given (servers first) after the hubs of the
declared channels, and stop in the reverse order when the probe's time is
up; a process that exits early stops the run, naming it."""

from __future__ import annotations

import re
import time
from typing import Annotated, Any, ClassVar, Literal

import polars as pl
from pydantic import Field, model_validator
from pydantic_core import PydanticCustomError

from loopscope.analysis.phases import Measure
from loopscope.analysis.registry import Section, Tables
from loopscope.analysis.inputs import SectionInputs
from loopscope.analysis.steps import Part
from loopscope.rundir import HubStep, RunRecord, Step
from loopscope.kinds.base import Collected, ProbeKind, RunFiles, Series, StepContext, StepRows, Tag, WindowSource
from loopscope.probes.params import EnvName
from loopscope.kinds.program import PATTERNS, INTERVALS, interval_measures, interval_series, interval_sweep_values, intervals, program_windows
from loopscope.spec.models import HOST_REF, Command, Duration, Model, Name, ProbeModel


class AppProcess(Model):
    """One process of an app: a program on a host, instrumented like a `program` probe's."""

    name: Name
    command: Command
    host: Name | None = Field(None, description="the host it runs on (default: the first host)")
    env: dict[EnvName, str] = Field(default_factory=dict)
    cpu: list[Annotated[int, Field(ge=0)]] | None = None
    cwd: str | None = Field(None, description="its working directory (default: the experiment file's directory; on ssh hosts the login directory)")


class AppProbe(ProbeModel):
    """Several programs that work together across hosts (a video pipeline, a control loop): started
    in the order given (servers first), stopped in the reverse order when the probe's time is up.
    Every interval each logs is compared across phases and explained like a `program` probe's.
    In commands, {host:NAME} is replaced by that host's address."""

    kind: Literal["app"]
    processes: list[AppProcess] = Field(min_length=1, max_length=64)
    start_gap: Duration = Field(300_000_000, description="pause after starting each process, so the next finds it listening")
    attribute: list[str] = PATTERNS
    wakeup: list[str] = Field(default_factory=list, description="intervals (patterns) from a deadline to when the thread ran: split like the timer's wake-ups")
    duration: Duration | None = Field(None, description="this probe's time per phase (default: the experiment's duration)")
    uses_channels: ClassVar[bool] = True

    @model_validator(mode="after")
    def _distinct(self) -> "AppProbe":
        names = [p.name for p in self.processes]
        dup = sorted({n for n in names if names.count(n) > 1})
        if dup:
            raise PydanticCustomError("app_names", "process names must be distinct [{dup} used twice]", {"dup": ", ".join(dup)})
        return self

    def host_refs(self) -> list[tuple[tuple[str | int, ...], str | None]]:
        refs: list[tuple[tuple[str | int, ...], str | None]] = []
        for j, proc in enumerate(self.processes):
            refs.append((("processes", j, "host"), proc.host))
            for k, arg in enumerate(proc.command):
                refs += [(("processes", j, "command", k), n) for n in re.findall(HOST_REF, arg)]
        return refs

    def hosts(self, first: str) -> list[str]:
        return list(dict.fromkeys(p.host or first for p in self.processes))


class App(ProbeKind[AppProbe]):
    name = "app"
    model = AppProbe
    describe = (
        "Programs working together across hosts, each run with LOOPSCOPE_TRACE set: every interval each logged (process: group/name), compared across phases."
    )
    tables = {"program": INTERVALS}
    records = (("program", "interval", "dur_ns"),)

    def local_programs(self, probe: AppProbe) -> list[Any]:
        return list(probe.processes)

    def run(self, ctx: StepContext, probe: AppProbe, key: str, dur_ns: int) -> dict[str, object]:
        procs = [(p, p.host or ctx.first_host, f"{probe.name}.{p.name}") for p in probe.processes]
        running_hubs: list[Any] = []
        hub_parts: list[HubStep] = []
        results: dict[str, Collected] = {}
        t0 = time.monotonic_ns()
        try:
            running_hubs = ctx.hubs_start(probe.label, key, dur_ns)
            with ctx.helpers(key) as hs:
                for p, host, name in procs:
                    env = {**p.env, **ctx.channel_env(host, key, name)}
                    spec = {"kind": "program", "name": name, "command": ctx.with_hosts(p.command), "until": "exit", "env": env, "cpu": p.cpu, "cwd": p.cwd}
                    # its own timeout is the phase plus a margin: stopping it is ours to do
                    hs.start(host, spec, duration_ns=dur_ns + 600_000_000_000)
                    ctx.sleep(probe.start_gap / 1e9)
                # The window: the lab sleeps while the programs run; an agent
                # answers at once when one of its programs exits (an app's
                # processes must last the phase) or fails.
                on: dict[str, list[str]] = {}
                for host, name in hs.running():
                    on.setdefault(host, []).append(name)
                _, exited = ctx.window(on, None, dur_ns / 1e9)
                ctx.check()
                ctx.hubs_check(running_hubs)
                for host, name in exited[:1]:
                    r = hs.stop(host, name)
                    raise ctx.failure(
                        f"app {probe.name}: process {name} on {host} exited before the phase ended ({r.result.get('exit')})", host, f"probe {name}"
                    )
                for host, name in list(reversed(hs.running())):
                    results[name] = hs.stop(host, name)
            hub_parts = ctx.hubs_stop(running_hubs)
        finally:
            ctx.hubs_stop(running_hubs, quiet=True)
        steps: list[dict[str, object]] = []
        for p, host, name in procs:
            r = results[name]
            steps.append({"name": p.name, "host": host, "trace": r.trace, "json": r.json, "command": r.command, "cpu_usec": r.cpu_usec})
            stats = ctx.channel_stats(host, key, name)
            if stats:
                steps[-1]["channel_stats"] = stats
        out: dict[str, object] = {
            "host": steps[0]["host"],
            "trace": steps[0]["trace"],
            "json": steps[0]["json"],
            "command": steps[0]["command"],
            "cpu_usec": sum(results[name].cpu_usec or 0 for _, _, name in procs),
            "spawn_mono_ns": t0,
            "end_mono_ns": time.monotonic_ns(),
            "processes": steps,
        }
        if ctx.exp.channels:
            out["hubs"] = hub_parts
        return out

    def rows(self, step: Step, trace: pl.DataFrame, result: dict[str, object], read: RunFiles, tag: Tag) -> StepRows:
        out = StepRows()
        for proc in step.processes or []:
            df = read.trace(proc.trace)
            if df is not None:
                out.add("program", tag(intervals(df, f"{proc.name}: ", "app")))
        return out

    def measures(self, tables: Tables) -> list[Measure]:
        return interval_measures(tables, "app")

    def series(self, tables: Tables, probe: str) -> list[Series]:
        return interval_series(tables, probe)

    def sweep_values(self, tables: Tables, probe: str) -> list[tuple[str, pl.DataFrame]]:
        """Every interval the app's processes logged, each its own series."""
        return interval_sweep_values(tables, probe)

    def programs(self, step: Step, run: RunRecord) -> list[Part]:
        """One program per process of the app, each on its host."""
        return [Part(p.name, p.host, p.trace) for p in step.processes or []]

    def windows(self, step: Step, src: WindowSource) -> pl.DataFrame:
        return program_windows(self, step, src)

    def section(self, sec: Section, tables: Tables, comp: pl.DataFrame, present: list[str], inputs: SectionInputs) -> None:
        super().section(sec, tables, comp, present, inputs)
        sec.images = inputs.images_of(tables.run, sec.name, present, {self.name: self})


KIND = App()
