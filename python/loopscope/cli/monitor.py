"""``loopscope monitor``: watch a machine for hours or days (loopscope.monitor)."""

from __future__ import annotations

import json
import sys
from typing import Any

import click

from loopscope.errors import EXIT_FAILED, EXIT_INTERRUPTED
from loopscope.units import format_ns
from loopscope.cli.base import Duration, cli


def _period_line(m: Any) -> str:
    """One line per closed period: each probe's last period and the outliers so far."""
    from loopscope.monitor import hist

    parts = []
    for name, lv in m.live.items():
        h = lv.last_period
        if h is None or not h.get_total_count():
            parts.append(f"{name}: no values")
            continue
        parts.append(f"{name}: {h.get_total_count():,} values, p99 {format_ns(hist.quantile(h, 0.99) or 0)}, max {format_ns(h.get_max_value())}"
                     f" (run's max {format_ns(lv.max_ns)} at {str(lv.max_at_utc)[11:19]})")
    c = m.keeper.counts
    with m.keeper.lock:
        top = max(c.by_cause.items(), key=lambda kv: kv[1])[0] if c.by_cause else None
        nk = sum(c.not_kept.values())
        out = f"outliers {c.above} (kept {c.kept}, explained {c.explained}" + (f", not kept {nk}" if nk else "") + ")" + (f", most often {top}" if top else "")
    return f"period {m.period_no} · " + " · ".join(parts) + " · " + out


@cli.command("monitor")
@click.argument("spec", type=click.Path())
@click.option("-o", "--out", "out", default=None, type=click.Path(file_okay=False), help="Directory to create for the monitor [RESULTS/monitor-NAME].")
@click.option("--resume", default=None, type=click.Path(file_okay=False), help="Continue this monitor directory (the same SPEC it ran with).")
@click.option("--for", "for_ns", type=Duration(), default=None, help="Stop after this long (e.g. 24h); default: until Ctrl-C or SIGTERM.")
@click.option("--json", "as_json", is_flag=True, help="At the end, print monitor.json as one JSON line (the last line of stdout).")
def monitor_cmd(spec: str, out: str | None, resume: str | None, for_ns: int | None, as_json: bool) -> int:
    """Run SPEC's probes period after period under its loads, keep a histogram per
    period and the kernel's events around every outlier, explained as it comes.

    SPEC is an experiment file with a `monitor:` mapping (period, threshold,
    retain; docs/monitor.md); it needs no duration, phases or repetitions.
    Ctrl-C or SIGTERM closes the open period and exits 130.

    \b
    Examples:
      loopscope monitor examples/monitor.yaml --for 8h -o overnight
      loopscope monitor examples/monitor.yaml --resume overnight
    """
    from loopscope import monitor
    from loopscope.selfname import set_comm

    set_comm("ls-ctl")

    def say(msg: str) -> None:
        sys.stderr.write(msg + "\n")
        sys.stderr.flush()

    def view(m: Any) -> None:
        say(_period_line(m))

    o = monitor.start(spec, out, resume, for_ns, say, view)
    d = o.run_dir.parent.parent
    rec = monitor.status_of(d)
    if o.status != "completed":
        sys.stderr.write(f"loopscope: monitor {o.status}: {o.error}\n  what was kept is in {d}\n")
    if as_json:
        click.echo(json.dumps(rec))
    else:
        c = rec["counts"]
        assert isinstance(c, dict)
        click.echo(f"{rec['periods']} periods; outliers above the threshold: {c['outliers_above']} (kept {c['kept']}, explained {c['explained']}, not kept {c['not_kept'] or 0})")
        click.echo(str(d))
    return {"completed": 0, "interrupted": EXIT_INTERRUPTED}.get(o.status, EXIT_FAILED)
