"""`loopscope trace …`: inspecting trace files."""

from __future__ import annotations

import json
import os
import sys

import click

from loopscope.errors import InputError
from loopscope.cli.base import CpuList, Duration, _console, _default_run_dir, cli, prints  # noqa: F401
from loopscope.cli.show import _ci, _print_timer, _report, _trace_line, _trace_path  # noqa: F401
from loopscope.trace import narrate, reader
import polars as pl


@cli.group()
def trace() -> None:
    """Inspect trace files."""


def _existing(path: str) -> str:
    if not os.path.exists(path):
        raise InputError(f"{path}: no such file")
    return path


@trace.command("info")
@click.argument("file", type=click.Path())
@click.option("--json", "as_json", is_flag=True, help="Print one JSON object.")
@prints("loopscope.trace.narrate:TraceInfoJson")
def trace_info(file: str, as_json: bool) -> int:
    """Entities, counts, time span, lost records and damage of a trace.

    \b
    Examples:
      loopscope trace info app.lstrace
      loopscope trace info runs/20261124-101500-demo/hosts/local/steps/r01-idle/timer.lstrace --json
    """

    inf = reader.info(_existing(file))
    if as_json:
        click.echo(json.dumps(narrate.info_json(inf)))
    else:
        for line in narrate.info_lines(inf):
            click.echo(line)
    return 0


@trace.command("dump")
@click.argument("file", type=click.Path())
@click.option("--entity", default=None, help="Only this entity (group/name).")
@click.option("--limit", type=click.IntRange(min=0), default=None, help="At most this many records.")
@click.option("--file-order", is_flag=True, help="Keep file order (per thread) instead of sorting by time.")
@click.option(
    "--format",
    "fmt",
    type=click.Choice(["text", "csv", "jsonl"]),
    default="text",
    show_default=True,
    help="text: one narrated line per record; csv and jsonl: the records' columns (docs/trace-format.md), payloads as hex.",
)
def trace_dump(file: str, entity: str | None, limit: int | None, file_order: bool, fmt: str) -> int:
    """Narrate a trace, one record per line, or write its records as CSV or JSON lines.

    \b
    Examples:
      loopscope trace dump run.lstrace --limit 20
      loopscope trace dump run.lstrace --entity probe/wakeup --format csv > wakeups.csv
    """

    df, inf = reader.read_with_info(_existing(file), sort=not file_order)
    df = narrate.select(df, inf, entity)
    out = sys.stdout
    if fmt != "text":
        rows = df if limit is None else df.head(limit)
        rows = rows.with_columns(
            *(pl.col(c).cast(pl.String) for c in rows.columns if rows.schema[c] in (pl.Categorical, pl.Enum) or isinstance(rows.schema[c], pl.Enum)),
            pl.col("payload").bin.encode("hex").alias("payload"),
        )
        out.write(rows.write_csv() if fmt == "csv" else rows.write_ndjson())
        out.flush()
        if inf.lost_records:
            sys.stderr.write(f"loopscope: warning: {inf.lost_records:,} records of {file} were lost when it was written (trace info says where)\n")
        return 0
    for line in narrate.dump_lines(df, inf, limit):
        out.write(line + "\n")
    out.flush()
    return 0


# ---- bench ---------------------------------------------------------------------
