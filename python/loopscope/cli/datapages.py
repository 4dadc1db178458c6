"""The dataset's pages: `trend` (a probe's figure over runs and monitors'
periods) and `fleet` (every monitor under a directory on one page). Apart
from ``dataset.py`` because they draw (the report's charts and templates),
which `runs` and `query` need not load."""

from __future__ import annotations

import json
import sys
from pathlib import Path
from typing import TYPE_CHECKING

import click

from loopscope.cli.base import cli, kinds, Percent, prints
from loopscope.cli.dataset import _emit, _ns, _open, _say
from loopscope.dataset.trend import trend
from loopscope.errors import InputError
from loopscope.report import fleet as fleet_page
from loopscope.report.trend import page

if TYPE_CHECKING:
    from loopscope.dataset.trend import TrendJson


@cli.command("trend")
@click.argument("directory", type=click.Path())
@click.option("--probe", required=True, help="The probe (by name, as the experiments call it).")
@click.option(
    "--metric",
    type=click.Choice(["p50", "p99", "p999", "max", "mean"]),
    default="p99",
    show_default=True,
    help="The figure of each run (pooled over its repetitions as its report pools them).",
)
@click.option("--measure", default=None, help="The probe's measure when it has several (an rr probe's rtt or fwd, a syscall probe's call) [its main one].")
@click.option("--phase", default=None, help="The phase [each run's baseline phase].")
@click.option("--by", type=click.Choice(["host", "kernel"]), default=None, help="One series per host or per kernel.")
@click.option(
    "--min-effect",
    "min_effect",
    type=Percent(),
    default="2%",
    show_default=True,
    help="Mark a run ▲/▼ only when its interval clears the previous run's by more than this.",
)
@click.option("-o", "--output", type=click.Path(dir_okay=False), default=None, help="Write the trend's page (HTML) here.")
@click.option("--json", "as_json", is_flag=True, help="Print one object: the trend's points.")
@prints("loopscope.dataset.trend:TrendJson")
def trend_cmd(
    directory: str, probe: str, metric: str, measure: str | None, phase: str | None, by: str | None, min_effect: float, output: str | None, as_json: bool
) -> int:
    """A metric of one probe over the runs under DIRECTORY, each run's value
    with its 95 % interval, in the order they started, as a table and (-o)
    a page in the report's style.

    \b
    Examples:
      loopscope trend runs/ --probe timer --metric p99
      loopscope trend runs/ --probe timer --metric p99 --by kernel -o trend.html
    """

    q = _open(directory)
    main = {k.name: k.records[0][1].strip("'") for k in kinds() if k.records}
    t = trend(q, probe, metric, by, measure, phase, main, min_effect)
    if output:
        Path(output).write_text(page(t, Path(directory)))
    notes = q.ds.notes() + q.notes + t.notes
    if as_json:
        out: TrendJson = {
            "probe": t.probe,
            "measure": t.measure,
            "metric": t.metric,
            "by": t.by,
            "phase": t.phase,
            "min_effect": t.min_effect,
            "points": [p.to_json() for p in t.points],
            "missing": t.missing,
            "notes": notes,
        }
        click.echo(json.dumps(out, separators=(",", ":")))
        return 0
    cols = ["run", "started (UTC)", *([by] if by else []), "phase", metric, "95 % CI", "reps", ""]
    rows = [
        (
            p.run_id,
            p.started_utc.strftime("%Y-%m-%d %H:%M:%S") if p.started_utc else "",
            *([p.series] if by else []),
            p.phase,
            _ns(p.value_ns),
            f"[{_ns(p.lo_ns)}, {_ns(p.hi_ns)}]" if p.lo_ns is not None else "no interval",
            p.reps or "",
            p.change,
        )
        for p in t.points
    ]
    _emit(cols, rows, "table", title=f"{t.probe} {t.measure} {t.metric}" + (f" by {by}" if by else "") + f": {len(t.points)} points")
    for m in t.missing:
        sys.stderr.write(f"loopscope: note: without this figure: {m}\n")
    _say(notes)
    if output:
        click.echo(output)
    return 0


@cli.command("fleet")
@click.argument("directory", type=click.Path())
@click.option("-o", "--output", default=None, type=click.Path(dir_okay=False), help="The page to write [DIRECTORY/fleet.html].")
def fleet_cmd(directory: str, output: str | None) -> int:
    """One page for every monitor under DIRECTORY: hosts × hours, each cell
    the period maximum coloured by its outlier's top cause; the causes
    ranked over the fleet, by host and by kernel; the worst outliers with
    their kept windows' causes.

    \b
    Examples:
      loopscope fleet monitors/
      loopscope fleet monitors/ -o /tmp/fleet.html
    """
    q = _open(directory, reuse=True)
    if not any(m.readable for m in q.ds.monitors):
        raise InputError(
            f"{directory}: holds no readable monitor (a directory with a monitor.json, in it or one level below); `loopscope runs {directory}` lists what it holds"
        )
    out = Path(output) if output else Path(directory) / "fleet.html"
    out.write_text(fleet_page.page(q, Path(directory)))
    _say(q.ds.notes() + q.notes)
    click.echo(str(out))
    return 0
