"""Running experiments: `run`, `check` (what `run` would refuse, and the plan), `schema` (of experiment files) and `cleanup` (what killed runs left)."""

from __future__ import annotations

import json
import os
import sys
from pathlib import Path

import click

from loopscope.errors import EXIT_FAILED, EXIT_INTERRUPTED
from loopscope.cli.base import Duration, Percent, cli
from loopscope.lab import controller
from loopscope.selfname import set_comm
from loopscope.kinds import KINDS
from loopscope.spec import json_schema
from loopscope.lab.controller import preflight
from loopscope.spec import load
from loopscope.spec.models import Experiment
from loopscope.spec.plan import KERNEL_MB_PER_S, estimate_footprint, estimate_seconds, phase_runs
from loopscope.lab import cleanup
from rich.console import Console
from rich.progress import BarColumn, MofNCompleteColumn, Progress, TextColumn, TimeElapsedColumn
from loopscope.report import build
from loopscope.monitor.plan import check as monitor_check, footprint
from loopscope.lab import rtsetup


@cli.command("run")
@click.argument("spec", type=click.Path())
@click.option("--results", default=None, help="Directory receiving the run directory [the spec's `results`, default runs/].")
@click.option("--run-dir", default=None, help="Exact run directory to create (must not exist).")
@click.option("--no-report", is_flag=True, help="Do not build the report at the end.")
@click.option("--duration", "duration_over", type=Duration(), default=None, help="Override the file's duration (per probe and phase), e.g. for a short trial.")
@click.option("--repetitions", "reps_over", type=click.IntRange(min=1, max=1000), default=None, help="Override the file's number of repetitions.")
@click.option(
    "--no-kernel-capture",
    is_flag=True,
    help="Record no kernel events (the file's `kernel: {capture: off}`): no explain, no advise, and nothing of the capture's in the way.",
)
@click.option("--min-effect", "min_effect", type=Percent(), default=None, help="The report marks a change only when its interval lies outside 1 ± this [2%].")
def run_cmd(
    spec: str,
    results: str | None,
    run_dir: str | None,
    no_report: bool,
    duration_over: int | None,
    reps_over: int | None,
    no_kernel_capture: bool,
    min_effect: float | None,
) -> int:
    """Run an experiment file: probes under each phase's loads, repeated; prints the run directory last.

    \b
    Examples:
      loopscope run examples/control-loop.yaml
      loopscope run experiment.yaml --duration 2s --repetitions 2 --no-kernel-capture
    """

    set_comm("ls-ctl")  # before the progress bar's thread starts: it takes this name

    if sys.stderr.isatty():
        bar = Progress(TextColumn("{task.description}"), BarColumn(), MofNCompleteColumn(), TimeElapsedColumn(), console=Console(stderr=True), transient=True)
        task = bar.add_task("starting", total=None)

        def say(msg: str) -> None:
            bar.console.print(msg, highlight=False)

        def tick(done: int, total: int, label: str) -> None:
            bar.update(task, completed=done, total=total, description=label)

        with bar:
            out = controller.run(
                spec, results=results, run_dir=run_dir, say=say, tick=tick, duration=duration_over, repetitions=reps_over, kernel_capture=not no_kernel_capture
            )
    else:

        def say(msg: str) -> None:
            sys.stderr.write(msg + "\n")
            sys.stderr.flush()

        out = controller.run(
            spec, results=results, run_dir=run_dir, say=say, duration=duration_over, repetitions=reps_over, kernel_capture=not no_kernel_capture
        )
    if out.status == "completed" and not no_report:
        rep = build(out.run_dir, KINDS, min_effect=min_effect)
        for line in rep.summary_lines():
            click.echo(line)
        click.echo(f"report: {rep.html}")
    if out.status != "completed":
        sys.stderr.write(f"loopscope: error: run {out.status}: {out.error}\n  what was collected is kept in {out.run_dir}\n")
    click.echo(str(out.run_dir))
    return {"completed": 0, "interrupted": EXIT_INTERRUPTED}.get(out.status, EXIT_FAILED)


@cli.command("schema")
def schema_cmd() -> int:
    """Print the JSON Schema of experiment files (for editors).

    \b
    Examples:
      loopscope schema > experiment.schema.json
    """

    click.echo(json.dumps(json_schema(KINDS), indent=2))
    return 0


def _mb(x: float) -> str:
    return f"{x / 1000:.1f} GB" if x >= 1000 else (f"{x:.0f} MB" if x >= 10 else f"{x:.1f} MB")


@cli.command("check")
@click.argument("spec", type=click.Path())
def check_cmd(spec: str) -> int:
    """Check an experiment file as `run` would before it starts (the file, the
    hosts, CPUs, commands, privileges, tunings, the results directory) and
    print its plan, starting nothing. Exits 2 with the messages `run` would give.

    \b
    Examples:
      loopscope check examples/demo.yaml
    """

    exp = load(spec, KINDS)
    notes, _ = preflight(exp, spec, Path(exp.results), None)
    for n in notes:
        click.echo(f"note: {n}", err=True)
    if exp.monitor is not None:
        monitor_check(exp, spec)
        first, *rest = footprint(exp)
        click.echo(f"{spec}: valid · {first}")
        for line in rest:
            click.echo(line)
        _rt_setup(exp)
        return 0
    runs = phase_runs(exp)
    est = estimate_seconds(exp)
    about = f"{est / 60:.0f} min" if est >= 120 else f"{est:.0f} s"
    click.echo(f"{spec}: valid · {len(exp.probes)} probes × {len(exp.phases or [])} phases × {exp.repetitions} repetitions · at most about {about}")
    fp = estimate_footprint(exp, KINDS)
    click.echo(
        f"  disk: about {_mb(fp.disk_mb[0])}–{_mb(fp.disk_mb[1])} (kernel capture {_mb(fp.kernel_mb[0])}–{_mb(fp.kernel_mb[1])} at "
        f"{KERNEL_MB_PER_S[0]:g}–{KERNEL_MB_PER_S[1]:g} MB/s, quiet to busy; probe traces {_mb(fp.traces_mb)}"
        + (f", not counting {', '.join(fp.unsized)}, whose traces grow with what they measure" if fp.unsized else "")
        + ")"
    )
    if fp.buffers_mib:
        click.echo(
            f"  memory: kernel ring buffers {fp.buffers_mib} MiB ({fp.buffer_mib_per_cpu} MiB per CPU × {os.cpu_count() or 1} CPUs), held while the run lasts"
        )
    for pr in runs:
        loads = ", ".join(pr.phase.loads) or "no load"
        click.echo(f"  rep {pr.rep} · {pr.phase.name} ({loads}): {', '.join(p.name or p.kind for p in exp.probes)}")
    _rt_setup(exp)
    return 0


def _rt_setup(exp: Experiment) -> None:
    """The real-time set-up of the CPUs the probes are pinned to, as ``audit`` reads it (no watch: check starts nothing)."""
    here = {h.name for h in exp.hosts if not h.remote}
    cpus = sorted({c for p in exp.probes if (getattr(p, "host", None) or exp.hosts[0].name) in here for c in (getattr(p, "cpu", None) or [])})
    if not cpus:
        return
    found = rtsetup.setup(cpus, rtsetup.tasks())
    said = ",".join(map(str, cpus))
    click.echo(f"  the probes' CPU {said}: {len(found)} findings of the set-up (`loopscope audit --cpus {said}` watches them too, with the remedies)")
    for f in found:
        click.echo(f"    {f['check']}: {f['what']}")


@cli.command("cleanup")
@click.option("--dry-run", is_flag=True, help="Only say what would be removed.")
def cleanup_cmd(dry_run: bool) -> int:
    """Remove what killed runs left behind: processes, cgroups, state files.

    \b
    Examples:
      loopscope cleanup --dry-run
      loopscope cleanup
    """

    actions = cleanup.run(dry_run=dry_run)
    for a in actions:
        click.echo(a)
    if not actions:
        click.echo("nothing to clean up")
    return 0
