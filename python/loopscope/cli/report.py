"""`loopscope report`: a run's page and tables (``loopscope.report``), or a
monitor's pages. Its own module, apart from the other commands on a run
(``runs.py``), so that it imports what a report needs and nothing else:
not the lab, the Perfetto export or the terminal's tables."""

from __future__ import annotations

import json
from pathlib import Path

import click

from loopscope import progress
from loopscope.cli.base import Percent, cli, prints
from loopscope.errors import InputError
from loopscope.kinds import KINDS
from loopscope.monitor import page
from loopscope.report import build, export
from loopscope.report.sections import labels


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

    if (Path(run_dir) / "monitor.json").exists():
        # a monitor's directory: its own page (docs/monitor.md)
        if as_json or csv_dir or markdown:
            raise InputError(
                f"{run_dir}: is a monitor's directory; --json, --csv and --markdown are a run's (its figures are monitor.json, periods.jsonl and outliers.jsonl)"
            )

        for built in page.build_all(Path(run_dir)):
            click.echo(f"{'fleet' if built.name == 'fleet.html' else 'report'}: {built}")
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
