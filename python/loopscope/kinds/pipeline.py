"""The ``pipeline`` kind: a distributed pipeline (Boie & Niehaus 2007 §3.3,
data_pipe). A source sends messages through processing nodes on any hosts
to a sink; with the sink on the source's host it is a control loop. Every
message records each hop's kernel RX, application RX and send times, so its
end-to-end time splits into network hops, kernel-to-application waits and
processing. Its stages are helper processes (``pipe-source``,
``pipe-node``, ``pipe-sink``; the native loops are
``crates/probes/src/net/pipe.rs``)."""

from __future__ import annotations

import hashlib
from pathlib import Path
from typing import Annotated, Any, Callable, ClassVar, Literal

import polars as pl
from pydantic import Field, model_validator
from pydantic_core import PydanticCustomError

from loopscope.analysis.phases import Measure
from loopscope.analysis.registry import Section, Tables
from loopscope.analysis.inputs import SectionInputs
from loopscope.probes.params import PipeNodeParams, PipeSinkParams, PipeSourceParams
from loopscope.rundir import Step
from loopscope.kinds.base import Collected, ProbeKind, RunFiles, Series, StepContext, StepRows, Tag, WindowSource, groups, no_windows, wait_windows
from loopscope.spec.models import Duration, Name, ProbeModel, pps
from loopscope.units import format_ns
from loopscope.report import charts

PIPE_HEADER = 56  # loopscope packet header + hop count (crates/probes/src/net/pipe.rs)
PIPE_HOP = 24  # kernel RX, application RX, application TX of one node
STAGE_COUNTS = ("sent", "send_errors", "received", "forwarded", "unique", "lost", "duplicates", "reordered", "malformed", "full", "no_kernel_ts")


def stage_names(probe: str, n: int) -> list[str]:
    """The processes of an ``n``-stage pipeline, source to sink (their traces are ``<name>.lstrace``)."""
    return [f"{probe}.source"] + [f"{probe}.node{i}" for i in range(1, n - 1)] + [f"{probe}.sink"]


class PipelineProbe(ProbeModel):
    """A distributed pipeline (Boie & Niehaus 2007 §3.3, data_pipe): a source sends messages through processing
    nodes on any hosts to a sink; with the sink on the source's host it is a control loop. Every
    message records each hop's kernel RX, application RX and send times."""

    kind: Literal["pipeline"]
    source: Name = Field(description="host of the source")
    nodes: list[Name] = Field(default_factory=list, max_length=64, description="hosts of the processing nodes, in order (a host may appear more than once)")
    sink: Name | None = Field(None, description="host of the sink (default: the source's host: a control loop)")
    rate: pps("a pipeline's") = Field("1000pps", description="messages per second")  # type: ignore[valid-type]  # an Annotated type a function makes
    size: Annotated[int, Field(ge=PIPE_HEADER, le=65000)] = Field(256, description="message bytes (UDP payload)")
    count: Annotated[int, Field(ge=1)] | None = Field(None, description="stop after this many messages (default: run for the duration)")
    work_us: Annotated[int, Field(ge=0, le=1_000_000)] = Field(0, description="busy work each node does per message, µs")
    port: Annotated[int, Field(ge=1024, le=65000)] = Field(47100, description="first UDP port; stage i listens on port + i")
    duration: Duration | None = None

    @model_validator(mode="after")
    def _fits(self) -> "PipelineProbe":
        need = PIPE_HEADER + PIPE_HOP * len(self.nodes)
        if self.size < need:
            raise PydanticCustomError(
                "pipeline_size",
                "size {size} is too small for {n} nodes: each message needs {need} bytes",
                {"size": self.size, "n": len(self.nodes), "need": need},
            )
        return self

    @property
    def stages(self) -> list[tuple[str, str]]:
        """(role, host) in the order a message visits them."""
        return [("source", self.source), *(("node", h) for h in self.nodes), ("sink", self.sink or self.source)]

    talks_across_hosts: ClassVar[bool] = True

    def host_refs(self) -> list[tuple[tuple[str | int, ...], str | None]]:
        return [(("source",), self.source), *((("nodes", j), n) for j, n in enumerate(self.nodes)), (("sink",), self.sink)]

    def hosts(self, first: str) -> list[str]:
        return list(dict.fromkeys(h for _, h in self.stages))


class Pipeline(ProbeKind[PipelineProbe]):
    name = "pipeline"
    model = PipelineProbe
    describe = (
        "A distributed pipeline (Boie & Niehaus 2007 §3.3): a source sends messages through processing nodes to a sink; every message carries each "
        "hop's kernel RX, application RX and send times, so its end-to-end time splits into network hops (previous send → kernel RX, the router "
        "included), each node's kernel-to-application wait and processing. Times are CLOCK_REALTIME kernel and application stamps; on one machine "
        "all hosts share that clock."
    )
    tables = {"pipeline": {}, "stages": {}}
    records = (("pipeline", "'e2e'", "e2e_ns"), ("pipeline", "'sink_stack'", "sink_stack_ns"))
    main = ("pipeline", "e2e_ns")
    steady = (("pipeline", "e2e_ns", ()),)
    summary = frozenset({"e2e"})  # per-hop figures are in the report
    helpers = {"pipe-source": PipeSourceParams, "pipe-node": PipeNodeParams, "pipe-sink": PipeSinkParams}
    threads = frozenset({"ls-pipe-source", "ls-pipe-node", "ls-pipe-sink"})

    def run(self, ctx: StepContext, probe: PipelineProbe, key: str, dur_ns: int) -> dict[str, object]:
        """Start the sink and the nodes (at once: each only binds, and sends
        nothing before the source does), then the source; wait for the source,
        let the last messages arrive, stop the rest."""
        stages = probe.stages
        n = len(stages)
        flow = int(hashlib.sha256(f"{ctx.run_id}/{probe.name}".encode()).hexdigest()[:6], 16)
        host = [ctx.hosts[h] for _, h in stages]
        names = stage_names(probe.label, n)
        results: dict[str, Collected] = {}
        with ctx.helpers(key) as hs:
            downstream = []
            for i in reversed(range(1, n)):
                role, hname = stages[i]
                if role == "sink":
                    spec = {"kind": "pipe-sink", "name": names[i], "bind": host[i].bind(probe.port + i), "flow": flow}
                else:
                    spec = {
                        "kind": "pipe-node",
                        "name": names[i],
                        "bind": host[i].bind(probe.port + i),
                        "next": host[i + 1].at(probe.port + i + 1),
                        "work_us": probe.work_us,
                    }
                downstream.append((hname, spec))
            hs.start_each(downstream, wait_ready=True)
            src_host = stages[0][1]
            # Messages still in flight when the source stops: the configured
            # delays plus a margin. The source sleeps through it before its
            # exit's own work, and the stages are stopped after it.
            in_flight_ns = int(0.2e9 + 2 * sum(link.delay + 3 * link.jitter for link in ctx.exp.links))
            spec = {
                "kind": "pipe-source",
                "name": names[0],
                "dest": host[1].at(probe.port + 1),
                "rate": probe.rate,
                "size": probe.size,
                "flow": flow,
                "count": probe.count,
                "linger_ns": in_flight_ns,
            }
            running: dict[str, list[str]] = {}
            for h, name in hs.running():
                running.setdefault(h, []).append(name)
            hs.start(src_host, spec, duration_ns=dur_ns)
            # The window: the lab sleeps while the stages measure. The source's
            # agent answers when the source exits, the others when a stage
            # fails; nothing is collected until the last messages have
            # arrived, so the lab's own work stays out of their way.
            done, _ = ctx.window(running, (src_host, names[0]), dur_ns / 1e9 + 120)
            ctx.check()
            if not done:
                raise ctx.failure(f"the pipeline source {names[0]} on {src_host} did not finish", src_host, f"probe {names[0]}")
            for h, name in list(reversed(hs.running())):
                results[name] = hs.stop(h, name)
        stage_steps = []
        for i, (role, hname) in enumerate(stages):
            r = results[names[i]]
            stage_steps.append({"role": role, "host": hname, "name": names[i], "trace": r.trace, "json": r.json, "command": r.command, "cpu_usec": r.cpu_usec})
        sink = stage_steps[-1]
        src = results[names[0]]
        return {
            "host": stages[0][1],
            "trace": sink["trace"],
            "json": sink["json"],
            "command": stage_steps[0]["command"],
            "cpu_usec": stage_steps[0]["cpu_usec"],
            "spawn_mono_ns": src.spawn_mono_ns,
            "end_mono_ns": src.end_mono_ns,
            "stages": stage_steps,
            "flow": flow,
        }

    def live_step(self, probe: PipelineProbe, key: str, host: str, step_dir: Callable[[str], str]) -> dict[str, object]:
        """The stages' traces where ``run`` has its processes write them (the sink's is the step's)."""
        stages = probe.stages
        names = stage_names(probe.label, len(stages))
        st = [
            {
                "role": role,
                "host": h,
                "name": names[i],
                "trace": str(Path(step_dir(h)) / f"{names[i]}.lstrace"),
                "json": str(Path(step_dir(h)) / f"{names[i]}.json"),
            }
            for i, (role, h) in enumerate(stages)
        ]
        return {"host": stages[0][1], "trace": st[-1]["trace"], "json": st[-1]["json"], "stages": st}

    def rows(self, step: Step, trace: pl.DataFrame, result: dict[str, object], read: RunFiles, tag: Tag) -> StepRows:
        from loopscope.probes.pipeline import messages_from

        out = StepRows()
        m = messages_from(trace)
        if len(m):
            out.add("pipeline", tag(m))
        for sg in step.stages or []:
            sres = read.json(sg.json_)
            row = {"rep": step.rep, "phase": step.phase, "probe": step.probe, "role": sg.role, "stage": sg.name, "host": sg.host}
            row.update({k: sres.get(k) for k in STAGE_COUNTS})
            out.rows.setdefault("stages", []).append(row)
        return out

    def measures(self, tables: Tables) -> list[Measure]:
        from loopscope.probes.pipeline import components

        out = []
        for probe, g in groups(tables.pipeline):
            hops = max(int(c[3:].split("_")[0]) for c in g.columns if c.startswith("hop") and c.endswith("_net_ns"))
            for col in ["e2e_ns", *[c for c in components(hops) if c != "e2e_ns"]]:
                if col in g.columns and g[col].null_count() < len(g):
                    v = g.select("rep", "phase", "loads", pl.col(col).alias("value")).drop_nulls("value")
                    out.append(Measure(probe, "pipeline", col[:-3], v, ("p50", "p99", "mean"), 32))
        return out

    def series(self, tables: Tables, probe: str) -> list[Series]:
        df = tables.pipeline
        if not len(df) or "e2e_ns" not in df.columns or "t_ns" not in df.columns:
            return []
        return [Series("e2e", "end-to-end time", df.filter(pl.col("probe") == probe).select("rep", "phase", "t_ns", pl.col("e2e_ns").alias("value")))]

    def windows(self, step: Step, src: WindowSource) -> pl.DataFrame:
        """Each stage's kernel-to-application waits (the message is in the
        host's kernel; the stage's thread has not read it yet), as windows of
        that thread, named ``<probe> <stage> stack (<host>)``."""
        from loopscope.probes.pipeline import messages_from

        stages = step.stages or []
        sink = src.trace(step.trace) if stages and step.trace else None
        if sink is None:
            return no_windows()
        m = messages_from(sink)
        if not len(m):
            return no_windows()
        n_nodes = len(stages) - 2
        out = []
        for k in range(1, n_nodes + 2):
            host = stages[k].host
            krx, urx, label, rel = (
                (f"node{k}_krx_rt_ns", f"node{k}_urx_rt_ns", f"node{k}", stages[k].trace)
                if k <= n_nodes
                else ("sink_krx_rt_ns", "sink_urx_rt_ns", "sink", step.trace)
            )
            df = src.trace(rel)
            if df is None or krx not in m.columns:
                continue
            ev = df.filter(pl.col("group").cast(pl.String) == "pipe")
            if not len(ev):
                continue
            out.append(
                wait_windows(step, src, rel, m[krx].to_numpy(), m[urx].to_numpy(), int(ev["tid"].mode()[0]), host, f"{step.probe} {label} stack ({host})")
            )
        return pl.concat(out) if out else no_windows()

    def section(self, sec: Section, tables: Tables, comp: pl.DataFrame, present: list[str], inputs: SectionInputs) -> None:
        pipeline_section(sec, tables, comp, sec.name, present)


def stage_hosts(tables: Tables, probe: str) -> list[str]:
    for p in tables.spec.get("probes") or []:
        if p.get("name") == probe and p.get("kind") == "pipeline":
            return [p["source"], *p.get("nodes", []), p.get("sink") or p["source"]]
    return []


def component_label(measure: str, hosts: list[str]) -> str:
    """``hop1_net`` → ``network b → c`` and so on, from the stage hosts."""

    def host(i: int) -> str:
        return hosts[i] if 0 <= i < len(hosts) else f"stage {i}"

    if measure == "e2e":
        return "end to end"
    if measure == "sink_stack":
        return f"{host(len(hosts) - 1)} (sink): kernel → application"
    if measure.startswith("hop") and measure.endswith("_net"):
        k = int(measure[3:-4])
        return f"network {host(k)} → {host(k + 1)}"
    if measure.startswith("node"):
        ks, what = measure[4:].split("_", 1)
        return f"{host(int(ks))} (node {ks}): " + ("kernel → application" if what == "stack" else "processing")
    return measure


def pipeline_section(sec: Section, tables: Tables, c: pl.DataFrame, probe: str, present: list[str]) -> None:
    from loopscope.report.sections import cell, heading, metrics_table

    hosts = stage_hosts(tables, probe)
    measures = c["measure"].unique(maintain_order=True).to_list()
    labels = {m: component_label(m, hosts) for m in measures}
    if hosts:
        sec.describe += f" Path: {' → '.join(hosts)}."
    src = tables.pipeline.filter(pl.col("probe") == probe)
    frame = src.select("rep", "phase", "t_ns", pl.col("e2e_ns").alias("value"))
    # the end-to-end time's summary, as every probe's: p50 … max by phase
    sec.tables.append(metrics_table(c, "e2e", "end-to-end time", present))
    sec.charts.append(charts.ecdf(frame, present, f"{probe}: end-to-end time, distribution by phase", "end-to-end time"))
    sec.charts.append(charts.over_time(frame, present, f"{probe}: end-to-end time over time", "end-to-end time"))
    for metric in ("p50", "p99"):
        cm = c.filter((pl.col("metric") == metric) & (pl.col("measure") != "e2e"))
        sec.charts.append(charts.syscall_bars(cm, present, f"{probe}: where the time goes, {metric} per hop by phase", metric, labels))
    tabs = []
    # each (measure, phase, metric)'s first comparison row, looked up, not filtered for (hops × phases × metrics)
    first = {(r["measure"], r["phase"], r["metric"]): r for r in reversed(c.rows(named=True))}
    for metric in [x for x in ("p50", "p99", "p999", "max", "mean") if x in set(c["metric"].to_list())]:
        rows = []
        for m in measures:
            cells = {ph: cell(first[(m, ph, metric)]) for ph in present if (m, ph, metric) in first}
            rows.append({"call": labels[m], "cells": cells})
        tabs.append({"metric": metric, "heading": heading(metric), "phases": present, "rows": rows})
    sec.pipeline = tabs
    # Queueing inside the hosts: each kernel-to-application stage against the M/Er/1 model of Marcondes 2005.
    from loopscope.analysis.queueing import fit as erlang

    fits: list[dict[str, object]] = []
    samples: list[tuple[str, Any, Any]] = []
    for m in [x for x in measures if x.endswith("_stack")]:
        col = f"{m}_ns"
        if col not in src.columns:
            continue
        for ph in present:
            x = src.filter(pl.col("phase") == ph)[col].drop_nulls().to_numpy()
            f = erlang(x)
            if f is None:
                continue
            fits.append(
                {
                    "stage": labels[m],
                    "phase": ph,
                    "stages": f.stages,
                    "floor": format_ns(f.floor_ns),
                    "mean": format_ns(f.mean_above_floor_ns),
                    "ks_d": f"{f.ks_d:.3f}",
                    "fits": f.fits,
                    "n": f"{f.n:,}",
                }
            )
            if ph == present[0] or len(samples) < 4:
                samples.append((f"{labels[m]} ({ph})", x, f))
    sec.queueing = {"rows": fits, "fit": sum(1 for x in fits if x["fits"]), "id": f"queueing-{probe}"} if fits else None
    if samples:
        sec.charts.append(charts.erlang_fit(samples[:4], f"{probe}: kernel → application delays against the M/Er/1 (Erlang) model"))
    st = tables.stages.filter(pl.col("probe") == probe) if len(tables.stages) else tables.stages
    acct = []
    for (rep, ph), g in st.group_by(["rep", "phase"], maintain_order=True) if len(st) else []:
        src_row = g.filter(pl.col("role") == "source")
        sink_row = g.filter(pl.col("role") == "sink")
        nodes = g.filter(pl.col("role") == "node")
        sent = int(src_row["sent"][0] or 0) if len(src_row) else 0
        got = int(sink_row["unique"][0] or 0) if len(sink_row) else 0
        acct.append(
            {
                "phase": ph,
                "rep": rep,
                "sent": f"{sent:,}",
                "received": f"{got:,}",
                "lost": f"{sent - got:,}",
                "duplicates": int(sink_row["duplicates"][0] or 0) if len(sink_row) else 0,
                "reordered": int(sink_row["reordered"][0] or 0) if len(sink_row) else 0,
                "node_drops": int(sum((r.get("full") or 0) + (r.get("send_errors") or 0) + (r.get("malformed") or 0) for r in nodes.iter_rows(named=True))),
            }
        )
    sec.accounting = acct


KIND = Pipeline()
