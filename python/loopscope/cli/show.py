"""How the commands print: the human-readable lines of results (the commands' grammar is in the other modules)."""

from __future__ import annotations

import json
from pathlib import Path
from typing import TYPE_CHECKING, Any, Callable, TypeVar

import click

from loopscope.cli.base import _console, _default_run_dir
from loopscope.units import format_ns
from loopscope.stats import MIN_EFFECT
from rich.table import Table

if TYPE_CHECKING:
    from loopscope.analysis.advise import Advice
    from loopscope.analysis.runcompare import CriterionResult, Differences, Row, RunData

#: a benchmark's result (a TypedDict, printed as JSON or by its own printer)
R = TypeVar("R")


def _ci(e: Any) -> str:
    lo = "open" if e.lo is None else format_ns(e.lo)
    hi = "open" if e.hi is None else format_ns(e.hi)
    return f"[{lo}, {hi}]"


def _print_timer(res: Any) -> None:

    con = _console()
    s = res.summary
    sched = res.threads[0].sched if res.threads else "?"
    title = (
        f"timer latency · interval {format_ns(res.interval_ns)} · {format_ns(res.elapsed_ns)} · "
        f"{len(res.threads)} thread{'s' if len(res.threads) != 1 else ''} · {sched} · "
        f"{'mlockall' if res.mlock_ok else 'memory not locked'}"
    )
    con.print(title)
    t = Table(show_edge=False)
    t.add_column("", style="bold")
    t.add_column("latency", justify="right")
    t.add_column("95% CI", justify="right")
    t.add_row("samples", f"{res.samples:,}", "")
    t.add_row("missed", f"{res.missed:,}", "deadlines skipped" if res.missed else "")
    if s.n:
        t.add_row("min", format_ns(s.min), "")
        t.add_row("avg", format_ns(s.mean.value), _ci(s.mean))
        t.add_row("p50", format_ns(s.p50.value), _ci(s.p50))
        t.add_row("p99", format_ns(s.p99.value), _ci(s.p99))
        t.add_row("p99.9", format_ns(s.p999.value), _ci(s.p999))
        t.add_row("max", format_ns(s.max), "")
    con.print(t)
    if len(res.threads) > 1:
        for th in res.threads:
            ts = th.summary
            cpu = f"cpu {th.cpu}" if th.cpu is not None else "any cpu"
            if ts.n:
                con.print(
                    f"  thread {th.index} (tid {th.tid}, {cpu}): p50 {format_ns(ts.p50.value)}, p99 {format_ns(ts.p99.value)}, max {format_ns(ts.max)}, missed {th.missed}"
                )
    for th in res.threads:
        if not th.sched_ok:
            con.print(f"[yellow]note:[/] thread {th.index}: {th.sched}")
        if th.cpu is not None and not th.affinity_ok:
            con.print(f"[yellow]note:[/] thread {th.index}: pinning to CPU {th.cpu} was refused")
    if not res.mlock_ok:
        con.print(f"[yellow]note:[/] {res.mlock}")
    if not res.dma_latency_ok:
        con.print(f"[yellow]note:[/] {res.dma_latency}")
    elif "held" in res.dma_latency:
        con.print(f"power management: {res.dma_latency}")
    if getattr(res, "peer_note", None):
        con.print(f"power management: {res.peer_note}")
    if res.kept_samples < res.samples:
        con.print(f"[yellow]note:[/] statistics from the first {res.kept_samples:,} of {res.samples:,} samples (memory cap)")
    con.print(f"probe overhead: one clock read, {res.overhead_ns:.0f} ns, is part of every latency")
    _trace_line(con, res)


def _trace_path(trace_path: str | None, name: str) -> str:
    if trace_path is not None:
        return trace_path
    d = _default_run_dir(name)
    made = [p for p in (d.parent, d) if not p.exists()]
    d.mkdir(parents=True, exist_ok=True)
    ctx = click.get_current_context(silent=True)
    if ctx is not None:
        ctx.call_on_close(lambda: _drop_empty(made))
    return str(d / f"{name}.lstrace")


def _drop_empty(made: list[Path]) -> None:
    """A command refused (or failed) before its probe wrote anything leaves no
    empty directory behind: those it made, deepest first, if still empty."""
    for p in reversed(made):
        try:
            p.rmdir()
        except OSError:
            pass  # not empty: the run's files are in it


def _trace_line(con: Any, res: Any) -> None:
    if res.interrupted:
        con.print("[yellow]interrupted:[/] the figures cover the time measured before Ctrl-C")
    if res.trace:
        lost = f", {res.trace_lost:,} lost" if res.trace_lost is not None else ""
        con.print(f"trace: {res.trace_records or 0:,} records{lost}")
        click.echo(res.trace)


# ---- experiments ---------------------------------------------------------------


def _report(res: R, as_json: bool, human: Callable[[R], None]) -> int:
    """A benchmark's result: one JSON object, or the human summary."""
    if as_json:
        click.echo(json.dumps(res))
    else:
        human(res)
    return 0


def comparison(
    runs: list[RunData],
    rows: list[Row],
    diff: Differences,
    criteria: list[CriterionResult],
    output: str | None,
    total: list[Row],
    min_effect: float = MIN_EFFECT,
    strict: bool = False,
) -> None:
    """`loopscope compare`'s terminal table: the p99, p999, max and missed rows of the measures shown, significant ones marked."""

    con = _console()
    con.print(
        f"baseline {runs[0].label}; {sum(r.significant for r in total)} of {len(total)} rows significant (Holm-corrected, 95 %, the interval outside 1 ± {min_effect * 100:g} %; "
        "the table shows each probe's main measures, --json and -o all)"
    )
    con.print("pooled over repetitions: quantiles and the mean of every repetition's samples together; max the largest sample of any; missed deadlines added")
    if any(r.within_run for r in rows):
        con.print(
            "note: a run has one repetition: its intervals are taken over segments of it, so they hold its drift but not the variation between runs; "
            "record repetitions: 3 or more for a gate to trust"
        )
    for k, v in diff["facts"].items():
        con.print(f"differs: {k}: " + " · ".join(f"{lab} {val}" for lab, val in v.items()))
    for lab in diff["spec_diff"]:
        con.print(f"differs: the experiment file ({runs[0].label} → {lab}; the page and --json show the diff)")
    t = Table(show_header=True, header_style="bold")
    for c in ("run", "probe", "phase", "measure", "metric", "baseline", "value", "ratio [95% CI]"):
        t.add_column(c, justify="right" if c in ("baseline", "value", "ratio [95% CI]") else "left")
    for r in rows:
        if r.metric not in ("p99", "p999", "max", "missed"):
            continue
        missed = r.metric == "missed"

        def fmt(x: float | None, missed: bool = missed) -> str:
            return "n/a" if x is None else (f"{x * 100:.3g} %" if missed else format_ns(x))

        ci = f" [{r.ci95[0]:.2f}, {r.ci95[1]:.2f}]" if r.ci95 else ""
        ratio = "n/a" if r.ratio is None else f"{r.ratio:.2f}x{ci}{' *' if r.significant else ''}"
        t.add_row(r.run, r.probe, r.phase, r.measure, r.metric, fmt(r.baseline), fmt(r.value), ratio)
    con.print(t)
    for crit in criteria:
        word = {"fail": "FAIL", "pass": "pass", "inconclusive": "INCONCLUSIVE" if strict else "inconclusive"}[crit["outcome"]]
        why = crit["rows"] if crit["outcome"] == "fail" else (crit["undecided"] if crit["outcome"] == "inconclusive" else [])
        per = ", ".join(f"{p} {o}" for p, o in crit["probes"].items())
        con.print(
            f"{word}: {crit['expr']}" + (f" ({per})" if per else "") + (f": {'; '.join(why[:3])}{' …' if len(why) > 3 else ''}" if why else ""),
            markup=False,
            highlight=False,
        )
    if output:
        click.echo(output)


def advice(rows: list[Advice], follow: Path | None) -> None:
    """`loopscope advise`'s table, then each row's command whole on a line of
    its own (a table cell cuts or folds it: it could not be copied), then the
    follow-up's command, never wrapped. Rows that say the same of one phase
    for several probes (a pipeline's stages, mostly) are one row naming them
    all, with the range of their shares (``--json`` keeps one row each)."""

    con = _console()
    if not rows:
        con.print("no cause took 5 % or more of any probe's outliers: nothing to advise")
    merged: dict[tuple[object, ...], list[Advice]] = {}
    for r in rows:
        merged.setdefault((r["phase"], r["cause"], r["remedy"], r["command"], r["reboot"], r["left_out"]), []).append(r)
    t = Table(show_header=True, header_style="bold")
    for c in ("#", "probe", "phase", "cause", "share", "remedy", "reboot", "in the follow-up"):
        t.add_column(c, overflow="fold")
    rows_of: dict[str, list[int]] = {}  # each command once, with the rows it serves
    for i, group in enumerate(merged.values(), 1):
        r = group[0]
        lo, hi = min(x["share"] for x in group) * 100, max(x["share"] for x in group) * 100
        t.add_row(
            str(i),
            ", ".join(dict.fromkeys(x["probe"] for x in group)),
            r["phase"],
            r["cause"],
            f"{hi:.0f} %" if round(lo) == round(hi) else f"{lo:.0f}–{hi:.0f} %",
            r["remedy"],
            {True: "yes", False: "no", None: ""}[r["reboot"]],
            "yes" if r["left_out"] is None else f"no: {r['left_out']}",
        )
        if r["command"]:
            rows_of.setdefault(r["command"], []).append(i)
    con.print(t)
    for cmd, ns in rows_of.items():
        click.echo(f"[{', '.join(map(str, ns))}] {cmd}")
    if follow:
        click.echo(f"follow-up experiment (its last phase applies the run-time remedies): loopscope run {follow}")
        click.echo(str(follow))
