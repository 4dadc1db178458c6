"""How the cause zoo scores a case: what explain says of the injected phase's
outliers against the declared cause, rtla's rule on the same outliers, the
program's own lateness against loopscope's, and the remedy ``advise`` offers
proven by its follow-up."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path
from typing import Callable
from loopscope.analysis.explained import ExplainDoc, Group

from loopscope.kernel import store as S
from loopscope.rundir import RunDir
from loopscope.bench.zoocase import Case, CaseResult, RemedyTried
import numpy as np
import polars as pl
from loopscope.analysis.explain import windows_of
from loopscope.analysis.threads import thread_activations, thread_names
from loopscope.kinds import KINDS
from loopscope import report
from loopscope.analysis.attribution import family
import yaml


def _group(res: ExplainDoc, phase: str) -> Group | None:
    return next((g for g in res["groups"] if (g["probe"] == "t" or g["probe"].startswith("t ")) and g["phase"] == phase), None)


def _share(g: Group | None, labels: list[str]) -> float:
    if not g:
        return 0.0
    return sum(c["share"] or 0.0 for c in g.get("all_causes", []) if c["cause"] in labels)


def score(case: Case, res: ExplainDoc) -> CaseResult:
    """What explain said of the case's phases, against the declared cause."""
    labels = [case.expected, *case.also]
    inj, base = _group(res, "injected"), _group(res, "baseline")
    causes = inj.get("all_causes", []) if inj else []
    # the expected cause and the labels counted with it are one cause here
    merged: dict[str, float] = {}
    for c in causes:
        key = case.expected if c["cause"] in labels else c["cause"]
        merged[key] = merged.get(key, 0.0) + (c["share"] or 0.0)
    ranked = sorted(merged.items(), key=lambda kv: -kv[1])
    rank = next((i + 1 for i, (k, _) in enumerate(ranked) if k == case.expected), None)
    return {
        "name": case.name,
        "expected": case.expected,
        "injected": case.what,
        "top_cause": ranked[0][0] if ranked else None,
        "top_share": ranked[0][1] if ranked else None,
        "expected_share": merged.get(case.expected, 0.0),
        "expected_rank": rank,
        "baseline_expected_share": _share(base, labels),
        "unexplained_share": merged.get("unexplained", 0.0),
        "outliers": inj["outliers"] if inj else 0,
        "baseline_outliers": base["outliers"] if base else 0,
        "causes": [{"cause": k, "share": v} for k, v in ranked[:6]],
        "skipped": None,
    }


def duration_error_us(run_dir: Path, log: Path, label: str = "load: bursts") -> float | None:
    """The median, over the injected phase's outliers that a burst overlaps
    or explain gives the label, of |time explain gives the label − the
    bursts' overlap with the outlier's window|, in µs (None: no such outlier).
    Where a burst was running when the probe's timer fired (the window's
    start), that timer's interrupt (and the soft interrupts after it) ran
    inside the burst's span by the injector's clock: the overlap leaves it
    out, as explain names it apart."""
    p = run_dir / "tables" / "attribution.parquet"
    if not p.exists() or not log.exists():
        return None
    b = np.array([[int(x) for x in ln.split()] for ln in log.read_text().splitlines() if len(ln.split()) == 2], dtype=np.int64).reshape(-1, 2)
    a = pl.read_parquet(p).filter((pl.col("phase") == "injected") & ((pl.col("probe") == "t") | pl.col("probe").str.starts_with("t ")))
    irq = pl.col("cause").str.starts_with("softirq: ") | (pl.col("cause") == "timer interrupt")
    per = a.group_by("id").agg(
        pl.col("t_ns").first(),
        pl.col("latency_ns").first(),
        pl.col("ns").filter(pl.col("cause") == label).sum().alias("named"),
        pl.col("ns").filter(irq).sum().alias("tick"),
    )
    errs = []
    for t, lat, named, tick in per.select("t_ns", "latency_ns", "named", "tick").iter_rows():
        lo, hi = int(t), int(t) + int(lat)
        overlap = int(np.clip(np.minimum(b[:, 1], hi) - np.maximum(b[:, 0], lo), 0, None).sum()) if len(b) else 0
        if overlap and ((b[:, 0] <= lo) & (b[:, 1] > lo)).any():
            # the probe's own timer fired inside the burst: its interrupt is in the injector's clock, and explain names it
            overlap = max(0, overlap - int(tick or 0))
        if overlap or named:
            errs.append(abs(int(named or 0) - overlap))
    return float(np.median(errs)) / 1e3 if errs else None


def self_and_kernel_p99(run_dir: Path, comm: str, phase: str) -> tuple[int | None, int | None]:
    """A phase's p99 lateness of the measured program by its own clock (the
    intervals it logged, deadline to its work's end) and by loopscope from
    the kernel alone (the timer lateness of its threads named ``comm``*, in
    that phase's steps)."""
    run = RunDir(run_dir).record()
    caps = [c for c in run.captures if c.data]
    spans = [(s.spawn_mono_ns, s.end_mono_ns) for s in run.steps if s.phase == phase]
    if not caps or not spans:
        return None, None
    w, _ = windows_of(run_dir, run, KINDS, caps)
    own = w.filter(pl.col("phase").cast(pl.String) == phase)["latency_ns"]
    st = S.open_capture(run_dir, caps[0])
    act = thread_activations(st, [t for t, n in thread_names(st).items() if n.startswith(comm)])
    inside = pl.any_horizontal([pl.col("on_ns").is_between(a, b) for a, b in spans])
    kernel = act.filter(inside & pl.col("complete"))["timer_lateness_ns"].drop_nulls()

    def p99(x: pl.Series) -> int | None:
        q = x.quantile(0.99, "linear") if len(x) else None
        return int(q) if q is not None else None

    return p99(own), p99(kernel)


def run_time_ratio(run_dir: Path) -> float | None:
    """The injected phase's median span of the probe over the baseline's: how much longer the same work took."""
    run = RunDir(run_dir).record()
    w, _ = windows_of(run_dir, run, KINDS, [c for c in run.captures if c.data])
    med = {str(p): v for p, v in w.filter(pl.col("span")).group_by(pl.col("phase").cast(pl.String)).agg(pl.col("latency_ns").median()).iter_rows()}
    return med["injected"] / med["baseline"] if med.get("baseline") and med.get("injected") is not None else None


def rule_top(run_dir: Path, phase: str) -> str | None:
    """rtla's rule over a phase's outliers of the case's probe: the label it
    blames most, each outlier weighted by its length (as explain's shares
    are), threads grouped by name as explain groups them."""
    p = run_dir / "tables" / "attribution.parquet"
    if not p.exists():
        return None
    a = pl.read_parquet(p).filter((pl.col("phase") == phase) & ((pl.col("probe") == "t") | pl.col("probe").str.starts_with("t ")))
    if "rule" not in a.columns or not len(a):
        return None
    per = a.group_by("id").agg(pl.col("rule").first(), pl.col("latency_ns").first()).drop_nulls("rule")
    if not len(per):
        return None
    per = per.with_columns(family("rule"))
    top = per.group_by("rule").agg(pl.col("latency_ns").sum()).sort("latency_ns", descending=True)
    return str(top["rule"][0])


def remedy_of(case: Case, run_dir: Path, reps: int, say: Callable[[str], None]) -> RemedyTried:
    """``loopscope advise`` on the case's run, as a user would run it, then
    its follow-up experiment: the remedy offered for the expected cause, and
    the remedy phase's p99 over the injected phase's, with its interval."""
    fu = run_dir.parent / f"{run_dir.name}-follow-up.yaml"
    a = subprocess.run([sys.executable, "-m", "loopscope.cli", "advise", str(run_dir), "--json", "-o", str(fu)], capture_output=True, text=True, timeout=600)
    if a.returncode != 0:
        return {"offered": None, "ratio_p99": None, "ci95": None, "significant": False, "why": a.stderr.strip()[-300:]}
    j = json.loads(a.stdout.strip().splitlines()[-1])
    mine = [r for r in j["advice"] if r["phase"] == "injected" and r["cause"] in (case.expected, *case.also)]
    offered = mine[0]["remedy"] if mine else None
    out: RemedyTried = {"offered": offered, "ratio_p99": None, "ci95": None, "significant": False, "tunings": []}
    if mine and not mine[0].get("runtime"):
        # a follow-up would try only the other causes' remedies: it proves nothing of this one
        return {**out, "why": f"the remedy for {mine[0]['cause']} is a change to the program ({mine[0]['knob']}): no run-time tuning proves it"}
    if not j.get("follow_up"):
        return {**out, "why": "no remedy a phase can apply at run time"}
    spec = yaml.safe_load(fu.read_text())
    rem = next((p for p in spec.get("phases") or [] if p.get("compare_with") == "injected"), None)
    if rem is None:
        return {**out, "why": "advise offered no remedy for the injected phase"}
    out["tunings"] = rem.get("tunings") or []
    say(f"  {case.name}: the follow-up ({offered or 'remedies of the other causes'}) …")
    fd = next(run_dir.parent / f"remedy-{i}" for i in range(1, 10_000) if not (run_dir.parent / f"remedy-{i}").exists())
    # the run as a user runs it; of its report, only the comparisons (report.analyse: no explain, no page)
    r = subprocess.run(
        [sys.executable, "-m", "loopscope.cli", "run", str(fu), "--run-dir", str(fd), "--repetitions", str(reps), "--no-report"],
        capture_output=True,
        text=True,
        timeout=900,
    )
    if r.returncode != 0:
        return {**out, "why": f"the follow-up run failed: {r.stderr.strip()[-300:]}"}
    c = report.analyse(fd, KINDS).filter(
        (pl.col("phase") == rem["name"]) & (pl.col("metric") == "p99") & ((pl.col("probe") == "t") | pl.col("probe").str.starts_with("t "))
    )
    # a program probe has a row per interval: the one the case attributes (zoo-table logs loop/work and loop/cycle)
    if "measure" in c.columns:
        mine_only = c.filter(pl.col("measure").is_in((case.probe or {}).get("attribute") or []))
        c = mine_only if len(mine_only) else c
    if not len(c):
        return {**out, "why": "the follow-up has no p99 of the remedy phase"}
    row = c.row(0, named=True)
    return {
        **out,
        "ratio_p99": row["ratio"],
        "ci95": [row["ratio_lo"], row["ratio_hi"]],
        "significant": bool(row["significant"] and row["ratio"] < 1),
        "against": row["baseline_phase"],
        "run": str(fd),
    }
