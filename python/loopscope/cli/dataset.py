"""A directory of runs and monitors as one dataset: `runs`, `query` (docs/tables.md); its pages, `trend` and `fleet`, are ``datapages.py``
(they draw: the report's charts stay out of a listing's start-up)."""

from __future__ import annotations

import csv
import json
import sys
from typing import Any

import click

from loopscope.cli.base import _console, cli, kinds
from loopscope.dataset.query import Query
from loopscope.dataset.scan import MonitorListing, RunListing, scan
from loopscope.dataset.query import plain
from rich.table import Table
from loopscope.units import format_ns


FORMATS = click.Choice(["table", "csv", "json"])


def _open(root: str, reuse: bool = False) -> Any:
    """The dataset under ``root`` as a query (``reuse``: a page will ask it several questions)."""
    return Query(scan(root), lambda: [r for k in kinds() for r in k.records], reuse)


def _say(notes: list[str]) -> None:
    for n in notes:
        sys.stderr.write(f"loopscope: note: {n}\n")


def _emit(columns: list[str], rows: list[tuple[Any, ...]], fmt: str, title: str | None = None) -> None:

    if fmt == "csv":
        w = csv.writer(sys.stdout, lineterminator="\n")
        w.writerow(columns)
        for r in rows:
            w.writerow(["" if v is None else plain(v) for v in r])
        return

    if not sys.stdout.isatty():
        # into a pipe or a file: columns aligned by spaces, each row one line, nothing cut (rich's
        # table took 0.35 s for 200 runs, half of `runs`; awk and grep read this as they read ps)
        cells = [list(columns), *[["" if v is None else _cell(v) for v in r] for r in rows]]
        widths = [max(len(row[i]) for row in cells) for i in range(len(columns))]
        out = [title] if title else []
        out += ["  ".join(v.ljust(w) for v, w in zip(row, widths)).rstrip() for row in cells]
        sys.stdout.write("\n".join(out) + "\n")
        return
    t = Table(show_header=True, header_style="bold", title=title)
    for i, c in enumerate(columns):
        t.add_column(c, no_wrap=i == 0)
    for r in rows:
        t.add_row(*("" if v is None else _cell(v) for v in r))
    _console().print(t)


def _cell(v: object) -> str:

    if isinstance(v, float):
        # nanoseconds read best whole (4579430, not 4.57943e+06); small and fractional values keep six digits
        return f"{v:.0f}" if 1e5 <= abs(v) < 1e18 else f"{v:.6g}"
    return str(plain(v))


@cli.command("runs")
@click.argument("directory", type=click.Path())
@click.option("--format", "fmt", type=FORMATS, default="table", show_default=True, help='json: one object on one line, {"runs": [...]}.')
def runs_cmd(directory: str, fmt: str) -> int:
    """List the runs under DIRECTORY: experiment, hosts, kernel, loopscope
    version, when, status, and each probe's p99 in its baseline phase with
    its interval. Runs that cannot be read are listed with why. Monitors
    are listed as such: hosts, span, periods, outliers kept and not kept,
    and hosts lost (DIRECTORY may be one monitor's directory).

    \b
    Examples:
      loopscope runs runs/
      loopscope runs runs/ --format json | jq '.runs[] | select(.status != "completed")'
    """
    q = _open(directory)
    figures = _figures(q) if q.ds.runs else {}
    entries = []
    for r in q.ds.runs:
        e = r.to_json()
        e["p99"] = figures.get(r.run_id, {})
        entries.append(e)
    entries.sort(key=lambda e: (str(e["started_utc"] or ""), str(e["run_id"])))
    monitors = sorted((m.to_json() for m in q.ds.monitors), key=lambda e: (str(e["started_utc"] or ""), str(e["run_id"])))
    notes = q.ds.notes() + q.notes
    if fmt == "json":
        click.echo(json.dumps({"runs": [*entries, *monitors], "notes": notes}, default=str, separators=(",", ":")))
        return 0
    if entries:
        _list_runs(entries, directory, fmt)
    if monitors:
        _list_monitors(monitors, directory, fmt)
    _say(notes)
    return 0


def _list_monitors(monitors: list[MonitorListing], directory: str, fmt: str) -> None:
    cols = ["monitor", "experiment", "started (UTC)", "last period (UTC)", "status", "hosts", "kernel", "periods", "outliers kept", "not kept", "lost hosts"]
    rows = [
        (
            m["run_id"],
            m["experiment"] or "",
            (m["started_utc"] or "")[:16].replace("T", " "),
            (m["updated_utc"] or "")[:16].replace("T", " "),
            m["status"] or ("unreadable" if not m["readable"] else ""),
            ", ".join(m["hosts"]),
            m["kernel"] or "",
            m["periods"],
            f"{m['kept']:,} of {m['outliers_above']:,}",
            ", ".join(f"{k}: {v:,}" for k, v in m["not_kept"].items()) or ("0" if m["readable"] else m["why"] or ""),
            ", ".join(
                f"{x['host']} at {x['at_utc'][:19].replace('T', ' ')}" + (f" (back {x['back_utc'][11:19]})" if x.get("back_utc") else "")
                for x in m["lost_hosts"]
            ),
        )
        for m in monitors
    ]
    _emit(
        cols,
        rows,
        fmt if fmt == "csv" else "table",
        title=f"{len(monitors)} monitors in {directory} (their periods and outliers: `loopscope query` views periods, outliers)",
    )


def _list_runs(entries: list[RunListing], directory: str, fmt: str) -> None:
    cols = ["run", "experiment", "started (UTC)", "status", "hosts", "kernel", "version", "reps", "p99 [95 % CI]"]
    rows = []
    for e in entries:
        p99 = " · ".join(f"{p} {_with_ci(f['value_ns'], f['lo_ns'], f['hi_ns'])}" for p, f in e["p99"].items())
        rows.append(
            (
                e["run_id"],
                e["experiment"] or "",
                (e["started_utc"] or "")[:16].replace("T", " "),
                e["status"] or ("unreadable" if not e["readable"] else ""),
                ", ".join(e["hosts"]),
                e["kernel"] or "",
                e["version"] or "",
                e["repetitions"] or "",
                p99 or (e["why"] or ""),
            )
        )
    if fmt == "csv":
        _emit(cols, rows, "csv")
    else:
        _emit(cols, rows, "table", title=f"{len(entries)} runs in {directory} (p99: each probe's first measure in the run's baseline phase)")


def _ns(v: float | None) -> str:

    return "?" if v is None else format_ns(float(v))


def _with_ci(v: float | None, lo: float | None, hi: float | None) -> str:
    """``125 µs [120, 142]``: the interval in the value's unit."""
    if v is None:
        return "?"
    div, unit = (1e6, "ms") if v >= 1e6 else ((1e3, "µs") if v >= 1e3 else (1.0, "ns"))
    ci = f" [{float(lo) / div:.3g}, {float(hi) / div:.3g}]" if lo is not None and hi is not None else ""
    return f"{v / div:.3g} {unit}{ci}"


def _figures(q: Any) -> dict[str, dict[str, dict[str, object]]]:
    """Each run's p99 of each probe's first measure in its baseline phase."""
    if "comparisons" not in q.views:
        return {}
    a = q.run(
        "SELECT run_id, probe, measure, value_ns, lo_ns, hi_ns FROM (SELECT *, row_number() OVER (PARTITION BY run_id, probe ORDER BY rowid) AS k "
        "FROM (SELECT *, row_number() OVER () AS rowid FROM summary WHERE metric = 'p99' AND phase = baseline_phase)) WHERE k = 1"
    )
    out: dict[str, dict[str, dict[str, object]]] = {}
    for run_id, probe, measure, v, lo, hi in a.rows:
        out.setdefault(run_id, {})[probe] = {"measure": measure, "value_ns": v, "lo_ns": lo, "hi_ns": hi}
    return out


@cli.command("query")
@click.argument("directory", type=click.Path())
@click.argument("sql")
@click.option("--format", "fmt", type=FORMATS, default="table", show_default=True, help='json: one object on one line, {"columns": [...], "rows": [[...]]}.')
def query_cmd(directory: str, sql: str, fmt: str) -> int:
    """Run SQL (DuckDB) over the runs under DIRECTORY, in place.

    Views: runs (run_id, experiment, host, kernel, version, started_utc,
    path, …), probes, summary (run_id, host, probe, measure, phase, metric,
    value_ns, lo_ns, hi_ns, …), comparisons, attribution, records (every
    sample: run_id, host, probe, measure, t_ns, value_ns, …) and one per
    table (timer, sched, rr, steps, …). Every view starts with run_id,
    experiment, host, kernel, loopscope_version, started_utc. docs/tables.md
    lists the columns.

    \b
    Examples:
      loopscope query runs/ "SELECT host, median(value_ns) FROM summary WHERE metric = 'p99' GROUP BY host"
      loopscope query runs/ "SELECT kernel, count(*) FROM runs GROUP BY kernel" --format csv
      loopscope query runs/ "SELECT cause, sum(ns) FROM attribution GROUP BY cause ORDER BY 2 DESC LIMIT 5"
    """

    q = _open(directory)
    a = q.run(sql)
    notes = q.ds.notes() + a.notes
    if fmt == "json":
        click.echo(json.dumps({"columns": a.columns, "rows": [[plain(v) for v in r] for r in a.rows], "notes": notes}, separators=(",", ":")))
        return 0
    _emit(a.columns, a.rows, fmt)
    _say(notes)
    return 0
