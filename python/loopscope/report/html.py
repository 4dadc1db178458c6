"""Rendering the report page (Jinja2 template ``report.html.j2``)."""

from __future__ import annotations

import datetime as _dt
import math
from pathlib import Path
from typing import Any

import jinja2
import polars as pl

from loopscope.report import charts
from loopscope.units import format_ns

HERE = Path(__file__).resolve().parent

DESCRIBE = {
    "timer": "Wake-up latency of a periodic thread on absolute deadlines: how late each wake-up ran (cyclictest's measurement).",
    "sched": "A thread alternating sleep and work next to busy threads (seeds/001): its wake-up delay past each deadline, and how long each burst of work took (the same work in every phase, sized once on the idle machine; its time alone is the reference).",
    "syscall": "Cost of each system call, timed in batches until the 95% confidence interval is within the target of the mean (seeds/004).",
}
MEASURE_LABEL = {"latency": "wake-up latency", "wake_delay": "wake-up delay", "burst": "burst completion time"}


def _ns(x: float | None) -> str:
    return "n/a" if x is None or not math.isfinite(x) else format_ns(x)


def _ratio(x: float | None) -> str:
    if x is None or not math.isfinite(x):
        return "n/a"
    # Near 1 two decimals would hide a small but significant change.
    return f"{x:.3f}×" if abs(x - 1) < 0.01 else f"{x:.2f}×"


def _cell(r: dict[str, Any]) -> dict[str, Any]:
    base = r["phase"] == r["baseline_phase"]
    return {
        "value": _ns(r["value_ns"]),
        "ci": f"[{_ns(r['value_lo_ns'])}, {_ns(r['value_hi_ns'])}]",
        "ratio": "baseline" if base else _ratio(r["ratio"]),
        "ratio_ci": "" if base else f"[{_ratio(r['ratio_lo'])}, {_ratio(r['ratio_hi'])}]",
        "sig": (not base) and bool(r["significant"]),
        "up": (not base) and bool(r["significant"]) and r["ratio"] > 1,
        "p": "" if base or r["p_value"] is None else (f"{r['p_value']:.1e}" if r["p_value"] < 1e-3 else f"{r['p_value']:.3f}"),
    }


def _probe_sections(tables: Any, comp: pl.DataFrame, phases: list[str]) -> list[dict[str, Any]]:
    out = []
    for probe in comp["probe"].unique(maintain_order=True).to_list():
        c = comp.filter(pl.col("probe") == probe)
        kind = c["kind"][0]
        sec: dict[str, Any] = {"name": probe, "kind": kind, "describe": DESCRIBE.get(kind, ""), "charts": [], "tables": []}
        cal = (tables.run.get("calibration") or {}).get(probe)
        if kind == "sched" and cal:
            sec["describe"] += f" Here the burst is {cal['work_iters']:,} iterations, {_ns(cal['alone_ns'])} alone."
        present = [p for p in phases if p in set(c["phase"].to_list())]
        if kind in ("timer", "sched"):
            src = tables.timer if kind == "timer" else tables.sched
            src = src.filter(pl.col("probe") == probe)
            for measure in c["measure"].unique(maintain_order=True).to_list():
                col = {"latency": "latency_ns", "wake_delay": "wake_delay_ns", "burst": "burst_ns"}[measure]
                frame = src.select("rep", "phase", "t_ns", pl.col(col).alias("value"))
                label = MEASURE_LABEL.get(measure, measure)
                sec["charts"].append(charts.ecdf(frame, present, f"{probe}: {label}, distribution by phase", label))
                sec["charts"].append(charts.over_time(frame, present, f"{probe}: {label} over time", label))
                metrics = c.filter(pl.col("measure") == measure)["metric"].unique(maintain_order=True).to_list()
                rows = []
                for ph in present:
                    cells = {}
                    for m in metrics:
                        r = c.filter((pl.col("measure") == measure) & (pl.col("phase") == ph) & (pl.col("metric") == m))
                        if not r.is_empty():
                            cells[m] = _cell(r.row(0, named=True))
                    first = c.filter((pl.col("measure") == measure) & (pl.col("phase") == ph)).row(0, named=True)
                    rows.append({"phase": ph, "loads": first["loads"], "n": first["n"], "reps": first["reps"], "cells": cells})
                sec["tables"].append({"title": label, "metrics": metrics, "rows": rows})
        else:
            sec["charts"].append(charts.syscall_bars(c, present, f"{probe}: cost per call by phase"))
            calls = c["measure"].unique(maintain_order=True).to_list()
            rows = []
            for call in calls:
                cells = {}
                for ph in present:
                    r = c.filter((pl.col("measure") == call) & (pl.col("phase") == ph))
                    if not r.is_empty():
                        cells[ph] = _cell(r.row(0, named=True))
                rows.append({"call": call, "cells": cells})
            sec["syscall"] = {"phases": present, "rows": rows}
        out.append(sec)
    return out


def _findings(comp: pl.DataFrame) -> list[str]:
    out = []
    sig = comp.filter(pl.col("significant") & pl.col("metric").is_in(["p99", "mean"]))
    for (probe, measure), g in sig.group_by(["probe", "measure"], maintain_order=True):
        metric = "p99" if "p99" in g["metric"].to_list() else "mean"
        g = g.filter(pl.col("metric") == metric).sort("ratio", descending=True)
        r = g.row(0, named=True)
        label = MEASURE_LABEL.get(str(measure), str(measure))
        out.append(
            f"{probe} {label} {metric}: {_ns(r['baseline_ns'])} at baseline, {_ns(r['value_ns'])} under {r['phase']} "
            f"({_ratio(r['ratio'])}, 95% CI [{_ratio(r['ratio_lo'])}, {_ratio(r['ratio_hi'])}])"
        )
    return out[:12]


def _provenance(prov: dict[str, Any]) -> list[tuple[str, str]]:
    h = next(iter((prov.get("hosts") or {}).values()), {})
    if not h:
        return []
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
        ("clocksource", str(h.get("clocksource"))),
        ("frequency governor", str(freq.get("governors") or freq.get("note"))),
        ("idle driver", str(h.get("cpuidle_driver"))),
        ("privileges", f"euid {(h.get('privileges') or {}).get('euid')}; " + ", ".join(f"{k} {'yes' if v else 'no'}" for k, v in caps.items())),
        ("cgroup", str(h.get("cgroup"))),
        ("tracefs", str(h.get("tracefs"))),
        ("software", ", ".join(f"{k} {v}" for k, v in sw.items() if v)),
        ("loopscope source", f"{git.get('sha') or git.get('note')}{' (modified)' if git.get('dirty') else ''}"),
        ("load average at start", str(h.get("loadavg_at_start"))),
    ]


def _loads(loads: pl.DataFrame) -> tuple[list[dict[str, Any]], str | None]:
    if loads.is_empty():
        return [], None
    rows = []
    for r in loads.iter_rows(named=True):
        ops = r.get("ops")
        rate = f"{ops / r['elapsed_s']:,.1f}/s" if ops is not None and r["elapsed_s"] else "n/a"
        rows.append(
            {
                "phase": r["phase"], "rep": r["rep"], "name": r["name"], "workers": r["workers"], "cpu": f"{r['cpu_util']:.2f}",
                "cpu_s": f"{r['cpu_s']:.1f}", "work": f"{rate} {r.get('unit') or ''}", "source": r.get("cpu_source", ""),
            }
        )
    return rows, charts.load_bars(loads)


def render(tables: Any, comp: pl.DataFrame, phases: list[str], notes: list[str]) -> str:
    env = jinja2.Environment(loader=jinja2.FileSystemLoader(str(HERE)), autoescape=jinja2.select_autoescape(["html", "j2"]))
    t = env.get_template("report.html.j2")
    run = tables.run
    spec = tables.spec
    start = run.get("started_utc")
    end = run.get("ended_utc")
    dur = ""
    if start and end:
        d = _dt.datetime.fromisoformat(end) - _dt.datetime.fromisoformat(start)
        dur = f"{d.total_seconds():.0f} s"
    load_rows, load_chart = _loads(tables.loads)
    lost_total = int(tables.steps["lost_records"].sum()) if len(tables.steps) else 0
    return t.render(
        title=f"loopscope · {run.get('name')}",
        run=run,
        spec=spec,
        duration=dur,
        phases=[{"name": p["name"], "loads": ", ".join(p["loads"]) or "none"} for p in spec.get("phases") or []],
        notes=notes,
        findings=_findings(comp),
        sections=_probe_sections(tables, comp, phases),
        loads=load_rows,
        load_chart=load_chart,
        provenance=_provenance(tables.provenance),
        steps=len(run.get("steps") or []),
        lost_total=lost_total,
        records_total=int(tables.steps["records"].sum()) if len(tables.steps) else 0,
        generated=_dt.datetime.now(_dt.timezone.utc).strftime("%Y-%m-%d %H:%M:%S UTC"),
    )
