"""Running experiments and reading runs: `run`, `check`, `schema`, `report`, `timeline`, `explain`, `export`, `cleanup`."""

from __future__ import annotations

import json
import os
import sys
from pathlib import Path

import click

from loopscope.errors import EXIT_FAILED, EXIT_INTERRUPTED, InputError, missing_part
from loopscope.units import format_ns
from loopscope.cli.base import CpuList, Duration, Percent, _console, _default_run_dir, cli, prints  # noqa: F401
from loopscope.cli.show import _ci, _print_timer, _report, _trace_line, _trace_path  # noqa: F401


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
    from loopscope.lab import controller
    from loopscope.selfname import set_comm

    set_comm("ls-ctl")  # before the progress bar's thread starts: it takes this name

    if sys.stderr.isatty():
        from rich.console import Console
        from rich.progress import BarColumn, MofNCompleteColumn, Progress, TextColumn, TimeElapsedColumn

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
        from loopscope.report import build

        from loopscope.kinds import KINDS

        rep = build(out.run_dir, KINDS, min_effect=min_effect)
        for line in rep.summary_lines():
            click.echo(line)
        click.echo(f"report: {rep.html}")
    if out.status != "completed":
        sys.stderr.write(f"loopscope: error: run {out.status}: {out.error}\n  what was collected is kept in {out.run_dir}\n")
    click.echo(str(out.run_dir))
    return {"completed": 0, "interrupted": EXIT_INTERRUPTED}.get(out.status, EXIT_FAILED)


@cli.command("report")
@click.argument("run_dir", type=click.Path())
@click.option("--json", "as_json", is_flag=True, help="Print the comparisons as one JSON object.")
@click.option(
    "--csv",
    "csv_dir",
    type=click.Path(file_okay=False),
    default=None,
    help="Also write the summary tables as CSV into this directory (summary.csv, comparisons.csv).",
)
@click.option("--markdown", is_flag=True, help="Print the summary tables as Markdown (for a pull request) instead of the terminal summary.")
@click.option(
    "--min-effect", "min_effect", type=Percent(), default=None, help="Mark a change only when its 95 % interval lies outside 1 ± this [2%]; stated on the page."
)
@prints("loopscope.report:ReportJson")
def report_cmd(run_dir: str, as_json: bool, csv_dir: str | None, markdown: bool, min_effect: float | None) -> int:
    """Build RUN/report.html (and RUN/tables/*.parquet) from a run directory (or a monitor's directory).

    \b
    Examples:
      loopscope report runs/20261124-101500-demo
      loopscope report runs/20261124-101500-demo --markdown >> pr-comment.md
      loopscope report runs/20261124-101500-demo --csv summary/
    """
    from loopscope import progress
    from loopscope.kinds import KINDS
    from loopscope.report import build, export
    from loopscope.report.sections import labels

    if (Path(run_dir) / "monitor.json").exists():
        # a monitor's directory: its own page (docs/monitor.md)
        if as_json or csv_dir or markdown:
            raise InputError(
                f"{run_dir}: is a monitor's directory; --json, --csv and --markdown are a run's (its figures are monitor.json, periods.jsonl and outliers.jsonl)"
            )
        from loopscope.monitor import page

        click.echo(f"report: {page.build(Path(run_dir))}")
        return 0
    with progress.shown(not as_json and not markdown):
        rep = build(Path(run_dir), KINDS, min_effect=min_effect)
    if csv_dir:
        for p in export.write_csv(rep.comparisons, Path(csv_dir)):
            click.echo(f"wrote {p}", err=True)
    if markdown:
        click.echo(export.markdown(rep.comparisons, f"{rep.run.name} ({Path(run_dir).name})", labels(KINDS)), nl=False)
    elif as_json:
        click.echo(json.dumps(rep.to_json()))
    else:
        for line in rep.summary_lines():
            click.echo(line)
        click.echo(str(rep.html))
    return 0


@cli.command("timeline")
@click.argument("run_dir", type=click.Path())
@click.option(
    "--probes",
    "use",
    type=click.Choice(["all", "pairs"]),
    default="all",
    show_default=True,
    help="Clock-sync probes the estimate uses: all, or only coded pairs whose gap survived.",
)
@click.option("--json", "as_json", is_flag=True, help="Print the clocks and checks as one JSON object.")
@prints("loopscope.timeline:TimelineDoc")
def timeline_cmd(run_dir: str, use: str, as_json: bool) -> int:
    """Put every record of every host on the reference host's clock: RUN/timeline.parquet.

    \b
    Examples:
      loopscope timeline runs/20261124-101500-control-loop
      loopscope timeline runs/20261124-101500-control-loop --json
    """
    from loopscope import timeline

    from loopscope.rundir import RunDir

    rd = RunDir.open(run_dir).path
    from loopscope import progress

    with progress.shown(not as_json):
        progress.step("timeline: estimating the clocks and placing every record")
        out = timeline.build(rd, use=use)
    if as_json:
        click.echo(json.dumps(out, default=float))
        return 0
    for line in timeline.summary_lines(out):
        click.echo(line)
    click.echo(str(rd / "timeline.parquet"))
    return 0


@cli.group("export")
def export_group() -> None:
    """Write a run in another tool's format."""


@export_group.command("perfetto")
@click.argument("run_dir", metavar="RUN_OR_TRACE", type=click.Path())
@click.option(
    "-o", "--output", type=click.Path(dir_okay=False), default=None, help="Output file [RUN/trace.perfetto-trace, or FILE.perfetto-trace beside a trace]."
)
def export_perfetto(run_dir: str, output: str | None) -> int:
    """A Perfetto trace: a run's global timeline (a track per host and thread,
    slices, instants, counters, clocks, the kernel around the outliers), or one
    .lstrace file alone on its own clock.

    \b
    Examples:
      loopscope export perfetto runs/20261124-101500-demo
      loopscope export perfetto app.lstrace -o app.perfetto-trace
    """
    from loopscope import progress, timeline
    from loopscope.report import perfetto
    from loopscope.rundir import RunDir

    why = missing_part("perfetto", "perfetto", "export perfetto")
    if why:
        raise InputError(why)
    src = Path(run_dir)
    if src.is_file():
        from loopscope.trace import reader

        try:
            reader.check(src)
        except InputError:
            raise
        except Exception as e:  # noqa: BLE001 - any reason it is not a trace is said the same way
            raise InputError(f"{src}: not a loopscope trace ({e}); give a .lstrace file or a run directory") from None
        out = Path(output) if output else src.with_suffix(".perfetto-trace")
        c = perfetto.export_trace(src, out)
    else:
        rd = RunDir.open(run_dir).path
        out = Path(output) if output else rd / "trace.perfetto-trace"
        with progress.shown():
            if not (rd / "timeline.parquet").exists() or (rd / "timeline.parquet").stat().st_mtime < (rd / "run.json").stat().st_mtime:
                progress.step("export: building the global timeline")
                timeline.build(rd)
            progress.step("export: writing the Perfetto trace")
            c = perfetto.export(rd, out)
    click.echo(
        f"{c['slices']:,} slices, {c['instants']:,} instants, {c['counters']:,} counter values on {c['tracks']} tracks ({c['bytes'] / 1e6:.1f} MB)"
        + (f"; {c['kernel_slices']:,} kernel slices around the outliers" if c.get("kernel_slices") else "")
        + (f"; not drawn: {c['not_placed']:,} records without a global time" if c["not_placed"] else "")
        + (f", {c['histograms']:,} histogram snapshots" if c["histograms"] else "")
    )
    click.echo(f"open it at https://ui.perfetto.dev: {out}")
    return 0


@cli.command("explain")
@click.argument("run_dir", type=click.Path())
@click.option(
    "--quantile",
    type=click.FloatRange(0.5, 0.99999),
    default=0.99,
    show_default=True,
    help="Records above this quantile of their probe and phase are attributed.",
)
@click.option("--json", "as_json", is_flag=True, help="Print the result as one JSON object.")
@prints("loopscope.analysis.explained:ExplainDoc")
def explain_cmd(run_dir: str, quantile: float, as_json: bool) -> int:
    """Why the outliers were late: each one's window split into causes from the run's kernel capture.

    \b
    Examples:
      loopscope explain runs/20261124-101500-control-loop
      loopscope explain runs/20261124-101500-control-loop --quantile 0.999 --json
    """
    from loopscope import progress
    from loopscope.analysis import explain
    from loopscope.analysis.explained import opened
    from loopscope.analysis.recorded import line
    from loopscope.cli.threads import parts_line
    from loopscope.kinds import KINDS
    from loopscope.rundir import RunDir

    rd = RunDir.open(run_dir).path

    with progress.shown(not as_json):
        out = explain.explain(rd, KINDS, quantile=quantile)
    if out is None:
        raise InputError(f"{run_dir}: the run has no kernel capture (kernel.capture was off, or tracefs or the privileges were missing: see its notes)")
    imported = not out["groups"] and all(c.read == "imported" for c in RunDir.open(run_dir).record().captures if c.data)
    if imported:
        out.setdefault("not_explained", []).append(
            f"an imported recording has no probe records, so explain has no outliers of its own; "
            f"`loopscope threads {run_dir} --comm NAME` measures any thread in it and explains its late wake-ups"
        )
    if as_json:
        click.echo(json.dumps(out, default=float))
        return 0
    for entry in out["captures"]:
        c = opened(entry)
        if c is None:
            click.echo(f"{entry.get('host')}: {entry.get('error')}")
            continue
        cost = ""
        if c["perf_cpu_share"] is not None:
            cost = f"; perf used {c['perf_cpu_share'] * 100:.1f} % of a CPU"
        elif c["reader_cpu_share"] is not None:
            cost = f"; the reader used {c['reader_cpu_share'] * 100:.1f} % of a CPU, {c['reads_during_windows'] or 0} of its reads inside windows"
        size = f", {c['bytes_on_disk'] / 1e6:.1f} MB on disk ({c['bytes_per_s'] / 1e6:.2f} MB/s)" if c["bytes_per_s"] else ""
        click.echo(f"kernel of {', '.join(c['covers'])}: {c['events']:,} events, {c['lost_events']:,} lost{size}{cost}")
        for p in c["problems"]:
            click.echo(f"  capture: {p}")
        for u in c["not_recorded"]:
            click.echo(f"  note: {line(u)}")
    for g in out["groups"]:
        top = ", ".join(f"{x['cause']} {(x['share'] or 0) * 100:.0f} %" for x in g["causes"][:4] if (x["share"] or 0) >= 0.005)
        top += f" · lab {g['lab_share'] * 100:.1f} %, loads {g['load_share'] * 100:.0f} %, system {g['system_share'] * 100:.0f} %"
        flag = "" if g["complete"] else f" (incomplete: {'; '.join(g['incomplete_why'])})"
        click.echo(f"  {g['probe']} · {g['phase']}: {g['outliers']} outliers above {format_ns(g['threshold_ns'])}: {top}{flag}")
        if "parts" in g:
            click.echo(f"    {parts_line(g['parts'])}")
    for why in out.get("not_explained", []):
        click.echo(f"  note: {why}")
    table = rd / "tables" / "attribution.parquet"
    click.echo(f"attributed in {out.get('seconds', 0.0):.1f} s" + (f"; {table}" if out["groups"] and table.exists() else ""))
    return 0


@cli.command("schema")
def schema_cmd() -> int:
    """Print the JSON Schema of experiment files (for editors).

    \b
    Examples:
      loopscope schema > experiment.schema.json
    """
    from loopscope.kinds import KINDS
    from loopscope.spec import json_schema

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
    from loopscope.kinds import KINDS
    from loopscope.lab.controller import preflight
    from loopscope.spec import load
    from loopscope.spec.plan import KERNEL_MB_PER_S, estimate_footprint, estimate_seconds, phase_runs

    exp = load(spec, KINDS)
    notes, _ = preflight(exp, spec, Path(exp.results), None)
    for n in notes:
        click.echo(f"note: {n}", err=True)
    if exp.monitor is not None:
        from loopscope.monitor.plan import check as monitor_check, footprint

        monitor_check(exp, spec)
        first, *rest = footprint(exp)
        click.echo(f"{spec}: valid · {first}")
        for line in rest:
            click.echo(line)
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
    return 0


@cli.command("cleanup")
@click.option("--dry-run", is_flag=True, help="Only say what would be removed.")
def cleanup_cmd(dry_run: bool) -> int:
    """Remove what killed runs left behind: processes, cgroups, state files.

    \b
    Examples:
      loopscope cleanup --dry-run
      loopscope cleanup
    """
    from loopscope.lab import cleanup

    actions = cleanup.run(dry_run=dry_run)
    for a in actions:
        click.echo(a)
    if not actions:
        click.echo("nothing to clean up")
    return 0


# ---- trace ---------------------------------------------------------------------
