"""Rendering the report page (Jinja2 template ``report.html.j2``)."""

from __future__ import annotations

import datetime as _dt

from loopscope.report import templates
import polars as pl

from loopscope.report import charts, clocks
from loopscope.report.sections import labels, min_effect_of, probe_sections
from loopscope.analysis.phases import baseline_of
from loopscope.report.sections import ns as _ns
from loopscope.report.sections import ratio as _ratio
from loopscope.analysis.registry import Registry
from loopscope.analysis.explained import CaptureSummary, ExplainDoc, Group, opened
from loopscope.rundir import Provenance
from loopscope.report.tables import EmulatorView, RunTables
from loopscope.report.view import (
    Breakdown,
    CallSizeRow,
    ChannelCountRow,
    EmulatorRow,
    HostRow,
    ItemRow,
    LoadRow,
    OutlierRow,
    PhaseOutliers,
    ShareRow,
    SweepBlock,
    Why,
    WhyProbe,
    WhyRow,
)
from loopscope import __version__
from loopscope.analysis.inputs import SectionInputs
from loopscope.report.derived import Derived
from loopscope.report.charts import cause_bars
from loopscope.analysis.breakdown import CALL_CATEGORIES, CATEGORIES
from loopscope.analysis import sweeps


def _kernel_paths(em: EmulatorView | None) -> list[str]:
    """The paths the router's kernel forwarded (nothing asked of them)."""
    return [n.replace("->", "→") for n, p in (em.paths if em else {}).items() if p.mechanism == "kernel"]


def _emulator_rows(em: EmulatorView | None) -> list[EmulatorRow]:
    """One row per path the emulator carried, with its counts."""
    if not em or not em.result:
        return []
    rows: list[EmulatorRow] = []
    for l in em.result.get("links") or []:
        if l["kernel"]:
            continue
        if not em.paths and not l["packets_in"] and not l["configured"]:
            continue
        a, late = l["applied_ns"], l["late_ns"]
        path = em.paths.get(l["name"])
        q = em.queueing.get(l["name"])
        rows.append(
            {
                "name": l["name"],
                "carried": "emulator",
                "configured": (path.why if path else None) or ("yes" if l["configured"] else "no (ideal)"),
                "in": f"{l['packets_in']:,}",
                "forwarded": f"{l['forwarded']:,}",
                "lost": l["lost"],
                "duplicated": l["duplicated"],
                "reordered": l["reordered"],
                "queue_drops": l["queue_drops"] + l["send_errors"],
                "pending": l["pending_at_stop"],
                "applied": f"{_ns(a.get('p50'))} / {_ns(a.get('p99'))}" if a.get("n") else "n/a",
                "late": f"{_ns(late.get('p50'))} / {_ns(late.get('p99'))} / {_ns(late.get('max'))}" if late.get("n") else "n/a",
                "queueing": q.text() if q else "",
            }
        )
    return rows


def _version() -> str:

    return str(__version__)


def _hosts(prov: Provenance) -> list[HostRow]:
    out: list[HostRow] = []
    for name, h in prov.lab.hosts.items():
        off = h.clock_offset_ns
        out.append(
            {
                "name": name,
                "kind": h.kind,
                "address": h.address,
                "offset": f"{off / 1e9:+g} s" if off else "0",
                "ssh": f"ssh {h.ssh}" if h.ssh else " ".join(h.launcher) if h.launcher else "",
            }
        )
    return out


def _why(ex: ExplainDoc | None, inputs: SectionInputs) -> Why | None:
    """The Why section: per probe, its phases' top causes, a chart, the worst outliers."""
    if not ex:
        return None

    caps = []
    for entry in ex["captures"]:
        c = opened(entry)
        if c is None:
            caps.append(f"{entry.get('host')}: the capture could not be read: {entry.get('error')}")
            continue
        share, reader, during = c["perf_cpu_share"], c["reader_cpu_share"], c["reader_ran_during"]
        caps.append(
            f"{c['host']} (kernel of {', '.join(c['covers'])}): {c['events']:,} events"
            + (f" ({c['events_per_s']:,.0f}/s)" if c["events_per_s"] else "")
            + f", {c['lost_events']:,} lost"
            + (_lost_where(c) if c["lost_events"] else "")
            + (f"; {c['bytes_on_disk'] / 1e6:.1f} MB on disk ({c['bytes_per_s'] / 1e6:.2f} MB/s)" if c["bytes_per_s"] else "")
            + (f"; perf used {share * 100:.1f} % of a CPU" if share is not None else "")
            + (f"; its reader used {reader * 100:.1f} % of a CPU, between the probe windows" if reader is not None and share is None else "")
            + (
                f" ({setup:.2f} s of it starting and allocating its ring buffers)"
                if reader is not None and share is None and (setup := c.get("reader_setup_cpu_s"))
                else ""
            )
            + (
                f", and ran inside {sum(1 for d in during if d.get('step'))} window(s) when a buffer was half full"
                if any(d.get("step") for d in during)
                else ""
            )
            + (f"; this kernel lacks {', '.join(c['missing_events'])}" if c["missing_events"] else "")
            + ("; " + "; ".join(c["problems"]) if c["problems"] else "")
        )
    probes: list[WhyProbe] = []
    by_probe: dict[str, list[Group]] = {}
    for g in ex["groups"]:
        by_probe.setdefault(g["probe"], []).append(g)
    for probe, groups in by_probe.items():
        rows: list[WhyRow] = []
        for g in groups:
            top = ", ".join(f"{c['cause']} {(c['share'] or 0) * 100:.0f} %" for c in g["causes"][:4] if (c["share"] or 0) >= 0.005)
            note = "complete" if g["complete"] else f"incomplete: {g['incomplete_outliers']} outliers ({'; '.join(g['incomplete_why'])})"
            split = f"{g['lab_share'] * 100:.1f} % / {g['load_share'] * 100:.0f} % / {g['system_share'] * 100:.0f} %"
            rows.append(
                {
                    "phase": g["phase"],
                    "outliers": g["outliers"],
                    "records": f"{g['records']:,}",
                    "threshold": _ns(g["threshold_ns"]),
                    "top": top,
                    "note": note,
                    "split": split,
                    "lab": ", ".join(f"{k} {v * 100:.1f} %" for k, v in g["lab"].items()),
                }
            )
        # The worst outliers of each phase, behind one control per phase.
        outliers: list[PhaseOutliers] = []
        for g in groups:
            ws: list[OutlierRow] = []
            for w in inputs.worst(probe, g["phase"], 20):
                ws.append(
                    {
                        "rep": w["rep"],
                        "latency": (f"took {_ns(w['latency_ns'])}" if w["span"] else f"{_ns(w['latency_ns'])} late"),
                        "cpu": w["cpu"],
                        "complete": w["complete"],
                        "extra": ", ".join(
                            x
                            for x in (f"{w['migrations']} migrations" if w["migrations"] else "", f"{w['page_faults']} page faults" if w["page_faults"] else "")
                            if x
                        ),
                        "causes": "; ".join(f"{c} {_ns(ns)} ({ns / w['latency_ns'] * 100:.0f} %)" for c, ns in w["causes"]),
                    }
                )
            if ws:
                outliers.append({"phase": g["phase"], "worst": ws})
        probes.append({"probe": probe, "rows": rows, "chart": cause_bars(groups, f"{probe}: where the outliers' time went"), "outliers": outliers})
    warn = sorted({f"{g['probe']}, {g['phase']}" for g in ex["groups"] for c in g["causes"] if c["cause"] == "lab: capture" and (c["share"] or 0) >= 0.02})
    # (a run captured with perf record names its perf threads lab: capture itself; a user's own perf is not the lab)
    roles = {c["cause"]: role for g in ex["groups"] for c in g["causes"] if (role := c.get("role"))}
    return {
        "captures": caps,
        "probes": probes,
        "threshold": ex["threshold"],
        "seconds": ex.get("seconds"),
        "roles": sorted(roles.items()),
        "self_warning": (
            f"The kernel capture itself (lab: capture) takes 2 % or more of the outliers' time in {'; '.join(warn)}: its reader had to run inside those windows. "
            "Give the kernel more buffer (kernel.buffer_mb), capture fewer events (kernel.events), or none (kernel.capture: off) for such phases."
        )
        if warn
        else None,
    }


def _lost_where(c: CaptureSummary) -> str:
    """Where a capture's lost events were, as the report says it."""
    if not c["lost_placed"]:
        return " (the capture could not say where: every outlier of this capture is marked incomplete)"
    where = c["lost_where"]
    t0 = c["t_first_ns"] or 0
    spans = ", ".join(f"CPU {w['cpu']} {(w['start_ns'] - t0) / 1e9:.3f}–{(w['end_ns'] - t0) / 1e9:.3f} s ({w['events']:,})" for w in where[:5])
    more = f" and {c['lost_windows'] - len(where[:5])} more" if c["lost_windows"] > 5 else ""
    return f" in {c['lost_windows']} windows (from the capture's start: {spans}{more}; outliers overlapping one are marked incomplete)"


def _breakdown(tables: RunTables) -> list[Breakdown]:
    """Per program/app probe whose threads used channels: each thread's time
    split into application, blocking, runtime and messaging, per phase."""

    b = tables.breakdown
    if not len(b):
        return []
    out: list[Breakdown] = []
    phases = [p["name"] for p in tables.spec.get("phases") or []]
    for (probe,), g in b.group_by(["probe"], maintain_order=True):
        agg = g.group_by(["process", "thread", "phase", "category"]).agg(pl.col("ns").sum())
        rows: list[ShareRow] = []
        bars: list[tuple[str, dict[str, float]]] = []
        keys = agg.select("process", "thread").unique(maintain_order=True).rows()
        for proc, thread in sorted(keys):
            for ph in phases:
                a = agg.filter((pl.col("process") == proc) & (pl.col("thread") == thread) & (pl.col("phase") == ph))
                if not len(a):
                    continue
                ns = dict(zip(a["category"].to_list(), a["ns"].to_list()))
                total = sum(ns.values()) or 1
                share = {c: ns.get(c, 0) / total for c in CATEGORIES}
                label = f"{proc + ' · ' if proc else ''}{thread} · {ph}"
                bars.append((label, share))
                rows.append({"label": label, "total": _ns(total), "cells": [f"{share[c] * 100:.1f} %" for c in CATEGORIES]})
        out.append(
            {
                "probe": probe,
                "categories": CATEGORIES,
                "rows": rows,
                "per_item": _items(tables, str(probe), phases),
                "per_size": _per_size(tables, str(probe), phases),
                "size_categories": CALL_CATEGORIES,
                "channels": _chan_counts(tables, str(probe), phases),
                "chart": charts.share_bars(bars, CATEGORIES, f"{probe}: where each thread's time went", "% of the thread's time"),
            }
        )
    return out


def _items(tables: RunTables, probe: str, phases: list[str]) -> list[ItemRow]:
    """Per channel and phase: an item's put, network and delivery times (p50 / p99)."""
    it = tables.items
    if not len(it):
        return []
    it = it.filter(pl.col("probe") == probe)
    out: list[ItemRow] = []
    it = it.with_columns(pl.col("via").fill_null(""), pl.col("bytes").fill_null(-1))
    for (ch, prod, cons, via, size), g in it.group_by(["channel", "producer", "consumer", "via", "bytes"], maintain_order=True):
        for ph in phases:
            x = g.filter(pl.col("phase") == ph)
            if not len(x):
                continue

            def q(col: str) -> str:
                v = x[col].drop_nulls()
                return f"{_ns(v.quantile(0.5))} / {_ns(v.quantile(0.99))}" if len(v) else "n/a"

            b = x["net_bound_ns"].drop_nulls()
            med = b.median()
            bound = f"± {_ns(float(med))}" if len(b) and isinstance(med, (int, float)) else ("n/a" if x["net_ns"].null_count() < len(x) else "")
            path = " → ".join(p for p in (prod or "?", via, cons) if p)
            out.append(
                {
                    "channel": ch,
                    "path": path,
                    "size": _bytes(size) if size >= 0 else "?",
                    "phase": ph,
                    "n": len(x),
                    "put": q("put_ns"),
                    "net": q("net_ns"),
                    "bound": bound,
                    "raw": q("net_raw_ns"),
                    "deliver": q("deliver_ns"),
                    "total": q("total_ns"),
                }
            )
    return out


def _bytes(n: float) -> str:
    for unit, f in (("MiB", 1 << 20), ("KiB", 1 << 10)):
        if n >= f:
            return f"{n / f:g} {unit}"
    return f"{n:g} B"


def _per_size(tables: RunTables, probe: str, phases: list[str]) -> list[CallSizeRow]:
    """Per process, channel, call and item size: a call's mean time and its layers."""
    from loopscope.analysis.breakdown import CALL_CATEGORIES

    b = tables.breakdown_size
    if not len(b):
        return []
    b = b.filter(pl.col("probe") == probe)
    if b["bytes"].n_unique() < 2:
        return []
    out: list[CallSizeRow] = []
    for ph in phases:
        x = (
            b.filter(pl.col("phase") == ph)
            .group_by(["process", "channel", "call", "bytes"], maintain_order=True)
            .agg(
                pl.col("calls").sum(),
                *[(pl.col(c) * pl.col("calls")).sum() / pl.col("calls").sum() for c in ["mean_ns", *[f"{k}_ns" for k in CALL_CATEGORIES]]],
            )
            .sort(["process", "channel", "call", "bytes"])
        )
        for r in x.iter_rows(named=True):
            if r["call"] == "store" and not r["process"].startswith("hub-"):
                continue  # a consumer keeping an arrived item: inside its gets' blocking already
            out.append(
                {
                    "label": f"{r['process']} · {r['call']} {r['channel']}",
                    "size": _bytes(r["bytes"]),
                    "phase": ph,
                    "calls": r["calls"],
                    "mean": _ns(r["mean_ns"]),
                    "cells": [_ns(r[f"{k}_ns"]) for k in CALL_CATEGORIES],
                }
            )
    return out


def _chan_counts(tables: RunTables, probe: str, phases: list[str]) -> list[ChannelCountRow]:
    """The declared channels' counts per phase: what went in, came out, was lost."""
    c = tables.channels
    if not len(c):
        return []
    c = c.filter(pl.col("probe") == probe)
    out: list[ChannelCountRow] = []
    for ph in phases:
        from loopscope.analysis.chanstats import COUNTS

        x = (
            c.filter(pl.col("phase") == ph)
            .group_by(["channel", "side", "role"], maintain_order=True)
            .agg(*[pl.when(pl.col(k).is_null().all()).then(None).otherwise(pl.col(k).sum()).alias(k) for k in COUNTS])
        )
        for r in x.iter_rows(named=True):
            lost = {k: r[k] for k in ("dropped_full", "dropped_no_consumer", "skipped", "refused", "incomplete", "missing") if r.get(k)}
            moved = {k: r[k] for k in ("put", "sent", "arrived", "got", "consumed", "timeouts") if r.get(k) is not None}
            out.append(
                {
                    "phase": ph,
                    "channel": r["channel"],
                    "side": r["side"],
                    "role": r["role"],
                    "moved": ", ".join(f"{k} {v:,}" for k, v in moved.items()),
                    "lost": ", ".join(f"{k.replace('_', ' ')} {v:,}" for k, v in lost.items()) or "none",
                }
            )
    return out


def _sweeps(tables: RunTables, kinds: Registry) -> list[SweepBlock]:

    out: list[SweepBlock] = []
    for sw in sweeps.fit(tables, kinds):
        if sw["kind"].startswith("link "):
            out.append(
                {
                    "title": f"{sw['probe']} against the {sw['kind']}",
                    "chart": charts.sweep_fits(sw["fits"], f"{sw['probe']}: against the {sw['kind']}", f"{sw['kind']} (ms, one way)"),
                    "statements": [sweeps.statement(f, "ms of delay") for f in sw["fits"]],
                }
            )
            continue
        out.append(
            {
                "title": f"{sw['probe']} against {sw['kind']} load",
                "chart": charts.sweep_fits(
                    sw["fits"], f"{sw['probe']}: against the {sw['kind']} load level", f"{sw['kind']} level ({sw['unit']}; 0 = baseline)"
                ),
                "statements": [sweeps.statement(f) for f in sw["fits"]],
            }
        )
    return out


def _findings(comp: pl.DataFrame, measure_label: dict[str, str]) -> list[str]:
    out = []
    sig = comp.filter(pl.col("significant") & pl.col("metric").is_in(["p99", "mean"]))
    for (probe, measure), g in sig.group_by(["probe", "measure"], maintain_order=True):
        metric = "p99" if "p99" in g["metric"].to_list() else "mean"
        g = g.filter(pl.col("metric") == metric).sort("ratio", descending=True)
        r = g.row(0, named=True)
        label = measure_label.get(str(measure), str(measure))
        out.append(
            f"{probe} {label} {metric}: {_ns(r['baseline_ns'])} in {r['baseline_phase']} (the baseline), {_ns(r['value_ns'])} under {r['phase']} "
            f"({_ratio(r['ratio'])}, 95% CI [{_ratio(r['ratio_lo'])}, {_ratio(r['ratio_hi'])}])"
        )
    return out[:12]


def _provenance(prov: Provenance) -> list[tuple[str, str]]:
    first = next(iter(prov.hosts.values()), None)
    if first is None:
        return []
    # the machine's facts as its agent gathered them (free-form: what this kernel exposes)
    h = first.model_dump(mode="json")
    cpu = h.get("cpu") or {}
    sw = h.get("software") or {}
    git = h.get("loopscope_git") or {}
    caps = (h.get("privileges") or {}).get("capabilities") or {}
    freq = h.get("cpufreq") or {}
    return [
        ("host", str(h.get("host"))),
        ("kernel", f"{(h.get('kernel') or {}).get('release')} ({h.get('preempt') or 'preemption model unknown'})"),
        ("CPU", f"{cpu.get('model')}, {cpu.get('cpus')} CPUs (usable: {cpu.get('usable_cpus')})"),
        ("memory", f"{(h.get('memory_kib') or 0) / 1048576:.1f} GiB"),
        ("clocksource", str(h.get("clocksource") or "unknown")),
        ("frequency governor", str(freq.get("governors") or freq.get("note"))),
        ("idle driver", str(h.get("cpuidle_driver") or "none (no cpuidle)")),
        ("privileges", f"euid {(h.get('privileges') or {}).get('euid')}; " + ", ".join(f"{k} {'yes' if v else 'no'}" for k, v in caps.items())),
        ("cgroup", str(h.get("cgroup"))),
        ("tracefs", str(h.get("tracefs") or "not mounted where this host's agent looked (a network namespace mounts a sysfs of its own)")),
        ("software", ", ".join(f"{k} {v}" for k, v in sw.items() if v)),
        ("loopscope source", f"{git.get('sha') or git.get('note')}{' (modified)' if git.get('dirty') else ''}"),
        ("load average at start", str(h.get("loadavg_at_start"))),
    ]


def _loads(loads: pl.DataFrame) -> tuple[list[LoadRow], str | None]:
    if loads.is_empty():
        return [], None
    rows: list[LoadRow] = []
    for r in loads.iter_rows(named=True):
        ops = r.get("ops")
        rate = f"{ops / r['elapsed_s']:,.1f}/s" if ops is not None and r["elapsed_s"] else "n/a"
        rows.append(
            {
                "phase": r["phase"],
                "rep": r["rep"],
                "name": r["name"],
                "workers": r["workers"],
                "cpu": f"{r['cpu_util']:.2f}",
                "cpu_s": f"{r['cpu_s']:.1f}",
                "work": f"{rate} {r.get('unit') or ''}",
                "source": r.get("cpu_source", ""),
            }
        )
    return rows, charts.load_bars(loads)


def render(tables: RunTables, comp: pl.DataFrame, phases: list[str], notes: list[str], kinds: Registry, derived: Derived) -> str:
    """The page, from values: the tables, the comparisons and what analysis derived (it reads no file)."""
    t = templates.template("report.html.j2")
    run = tables.run
    spec = tables.spec
    start = run.started_utc
    end = run.ended_utc
    dur = ""
    if start and end:
        d = _dt.datetime.fromisoformat(end) - _dt.datetime.fromisoformat(start)
        dur = f"{d.total_seconds():.0f} s"
    load_rows, load_chart = _loads(tables.loads)
    lost_total = int(tables.steps["lost_records"].sum()) if len(tables.steps) else 0
    tl = derived.timeline
    clock_rows, clock_chart, clock_problems = clocks.section(tl, derived.clock, tables.provenance)
    return t.render(
        css=templates.css(),
        sweeps=_sweeps(tables, kinds),
        breakdown=_breakdown(tables),
        why=_why(derived.explain, derived.inputs),
        clocks=clock_rows,
        clock_chart=clock_chart,
        clock_problems=clock_problems,
        clock_reference=(tl or {}).get("reference"),
        clock_network=clocks.network(run.clocksync),
        title=f"loopscope · {run.name}",
        version=_version(),
        run=run,
        spec=spec,
        duration=dur,
        phases=[{"name": p["name"], "loads": ", ".join(p["loads"]) or "none"} for p in spec.get("phases") or []],
        notes=notes,
        findings=_findings(comp, labels(kinds)),
        sections=probe_sections(tables, comp, phases, derived.inputs, kinds),
        loads=load_rows,
        load_chart=load_chart,
        provenance=_provenance(tables.provenance),
        hosts=_hosts(tables.provenance),
        emulator=_emulator_rows(tables.emulator),
        emulator_info=tables.emulator,
        kernel_paths=_kernel_paths(tables.emulator),
        steps=len(run.steps),
        lost_total=lost_total,
        records_total=int(tables.steps["records"].sum()) if len(tables.steps) else 0,
        generated=_dt.datetime.now(_dt.timezone.utc).strftime("%Y-%m-%d %H:%M:%S UTC"),
        baseline=baseline_of([p for p in phases if p in set(comp["phase"].to_list())] or phases or ["baseline"]),
        min_effect=min_effect_of(comp),
        files=derived.files,
    )
