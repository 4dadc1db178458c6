"""``loopscope monitor``: watch a machine for hours or days (loopscope.monitor)."""

from __future__ import annotations

import json
import sys
from typing import TYPE_CHECKING, Any

import click

from loopscope.errors import EXIT_FAILED, EXIT_INTERRUPTED
from loopscope.units import format_ns
from loopscope.cli.base import cli, Duration, prints
from loopscope.monitor import hist
from rich.console import Group
from rich.table import Table
from loopscope.monitor.start import start as start_monitor
from loopscope.rundir import monitor as monitor_record
from loopscope.selfname import set_comm
from rich.console import Console
from rich.live import Live

if TYPE_CHECKING:
    from loopscope.monitor.run import Monitor


def _period_line(m: Monitor) -> str:
    """One line per closed period: each probe's last period, and the monitor's
    outliers so far (the same counts its summary ends with, once the keeper has
    taken what it is still taking)."""

    parts = []
    for name, lv in m.live.items():
        h = lv.last_period
        if h is None or not h.get_total_count():
            parts.append(f"{name}: no values")
            continue
        parts.append(
            f"{name}: {h.get_total_count():,} values, p99 {format_ns(hist.quantile(h, 0.99) or 0)}, max {format_ns(h.get_max_value())}"
            f" (run's max {format_ns(lv.max_ns)} at {str(lv.max_at_utc)[11:19]})"
        )
    c = m.keeper.counts
    with m.keeper.lock:
        top = max(c.by_cause.items(), key=lambda kv: kv[1])[0] if c.by_cause else None
        nk = sum(c.not_kept.values())
        # counts of the whole monitor so far: the keeper may still be taking this period's last windows
        pending = max(0, c.above - c.kept - nk)
        out = (
            f"outliers so far {c.above} (kept {c.kept}, explained {c.explained}"
            + (f", not kept {nk}" if nk else "")
            + (f", {pending} still being kept" if pending else "")
            + ")"
            + (f", most often {top}" if top else "")
        )
    return f"period {m.period_no} · " + " · ".join(parts) + " · " + out


def _live_table(m: Monitor) -> Any:
    """The live view: per probe this period's p99 and max so far, the run's
    maximum and when; the counts; the last explained outliers."""

    t = Table(title=f"loopscope monitor · {m.exp.name} · period {m.period_no}", title_justify="left")
    for col in ("probe", "values", "p99 (period)", "max (period)", "run's max", "at"):
        t.add_column(col, justify="right" if col not in ("probe", "at") else "left")
    hosts = len(set(m.probe_host.values())) > 1
    for name, lv in m.live.items():
        vals = m.open_values(str(name))
        if vals is not None:
            # measuring now: its open period so far
            h = hist.new()
            hist.record(h, vals)
            label = str(name)
        else:
            # between its periods (probes take turns, or the last one closed): its last closed period, said so
            h = lv.last_period if lv.last_period is not None else hist.new()
            label = f"{name} (last period)"
        if hosts:
            label += f" @ {m.probe_host[str(name)]}"
        n = h.get_total_count()
        t.add_row(
            label,
            f"{n:,}",
            format_ns(hist.quantile(h, 0.99) or 0) if n else "-",
            format_ns(h.get_max_value()) if n else "-",
            format_ns(lv.max_ns) if lv.max_ns else "-",
            str(lv.max_at_utc or "-")[11:23],
        )
    c = m.keeper.counts
    o = Table(title="last outliers", title_justify="left")
    for col in ("probe", "latency", "top cause", "share", "kept"):
        o.add_column(col)
    with m.keeper.lock:
        last = list(m.keeper.last)[-8:]
        nk = sum(c.not_kept.values())
        line = f"outliers above the threshold {c.above:,} · kept {c.kept:,} · explained {c.explained:,} · not kept {nk:,} {dict(c.not_kept) if nk else ''}"
    for r in reversed(last):
        causes = r.get("causes") or []
        o.add_row(
            r["probe"],
            format_ns(r["latency_ns"]),
            str(r.get("top_cause") or "-"),
            f"{causes[0]['share']:.0%}" if causes else "-",
            r.get("window") or f"no ({r.get('not_kept')})",
        )
    return Group(t, line, o)


@cli.command("monitor")
@click.argument("spec", type=click.Path())
@click.option("-o", "--out", "out", default=None, type=click.Path(file_okay=False), help="Directory to create for the monitor [RESULTS/monitor-NAME].")
@click.option("--resume", default=None, type=click.Path(file_okay=False), help="Continue this monitor directory (the same SPEC it ran with).")
@click.option("--for", "for_ns", type=Duration(), default=None, help="Stop after this long (e.g. 24h); default: until Ctrl-C or SIGTERM.")
@click.option("--metrics", default=None, metavar="HOST:PORT", help="Serve Prometheus / OpenMetrics metrics here (a bare PORT binds to loopback).")
@click.option("--json", "as_json", is_flag=True, help="At the end, print monitor.json as one JSON line (the last line of stdout).")
@prints("loopscope.rundir.monitor:MonitorJson")
def monitor_cmd(spec: str, out: str | None, resume: str | None, for_ns: int | None, metrics: str | None, as_json: bool) -> int:
    """Run SPEC's probes period after period under its loads, keep a histogram per
    period and the kernel's events around every outlier, explained as it comes.

    SPEC is an experiment file with a `monitor:` mapping (period, threshold,
    retain; docs/monitor.md); it needs no duration, phases or repetitions.
    Ctrl-C or SIGTERM closes the open period and exits 130.

    \b
    Examples:
      loopscope monitor examples/monitor.yaml --for 8h -o overnight
      loopscope monitor examples/monitor.yaml --resume overnight
      loopscope monitor examples/monitor.yaml --metrics 127.0.0.1:9464
    """

    set_comm("ls-ctl")

    def say(msg: str) -> None:
        sys.stderr.write(msg + "\n")
        sys.stderr.flush()

    live: list[Any] = []

    def view(m: Monitor) -> None:
        if not sys.stderr.isatty():
            if m.period_no:
                say(_period_line(m))
            return
        if not live:
            lv = Live(console=Console(stderr=True), get_renderable=lambda: _live_table(m), refresh_per_second=1, transient=False)
            lv.start()
            live.append(lv)

    try:
        o = start_monitor(spec, out, resume, for_ns, say, view, metrics)
    finally:
        for lv in live:
            lv.stop()
    d = o.run_dir.parent.parent
    rec = monitor_record.read(d)
    if o.status != "completed":
        sys.stderr.write(f"loopscope: monitor {o.status}: {o.error}\n  what was kept is in {d}\n")
    if as_json:
        click.echo(json.dumps(rec))
    else:
        c = rec["counts"]
        assert isinstance(c, dict)
        click.echo(
            f"{rec['periods']} periods; outliers above the threshold: {c['outliers_above']} (kept {c['kept']}, explained {c['explained']}, not kept {c['not_kept'] or 0})"
        )
        click.echo(str(d))
    return {"completed": 0, "interrupted": EXIT_INTERRUPTED}.get(o.status, EXIT_FAILED)
