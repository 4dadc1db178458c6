"""What a run's directory becomes besides its report (``report.py``): `timeline`, `explain`, `export perfetto` (the experiment itself runs in ``lab.py``)."""

from __future__ import annotations

import json
from pathlib import Path

import click

from loopscope.errors import InputError, missing_part
from loopscope.units import format_ns
from loopscope.cli.base import cli, prints
from loopscope import progress
from loopscope.kinds import KINDS
from loopscope import timeline
from loopscope.rundir import RunDir
from loopscope.report import perfetto
from loopscope.analysis import explain
from loopscope.analysis.explained import opened
from loopscope.analysis.recorded import line
from loopscope.cli.threads import parts_line
from loopscope.trace import reader


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

    rd = RunDir.open(run_dir).path

    with progress.shown(not as_json):
        progress.step("timeline: estimating the clocks and placing every record")
        out = timeline.build(rd, use=use)
    if as_json:
        click.echo(json.dumps(out, default=float))
        return 0
    for text in timeline.summary_lines(out):
        click.echo(text)
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

    why = missing_part("perfetto", "perfetto", "export perfetto")
    if why:
        raise InputError(why)
    src = Path(run_dir)
    if src.is_file():
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
