"""`loopscope audit`: the real-time set-up of some CPUs, read and watched (``lab/audit.py``)."""

from __future__ import annotations

import json
import os

import click
from rich.table import Table

from loopscope.cli.base import Duration, _console, cli, prints
from loopscope.errors import InputError
from loopscope.lab.audit import AuditJson, audit
from loopscope.host.isolate import cpu_list


@cli.command("audit")
@click.option("--cpus", "cpus_text", default=None, help="The CPUs your real-time work runs on, as 1 or 1-3,5 [every CPU but the first].")
@click.option("--for", "watch_ns", type=Duration(), default="2s", show_default=True, help="How long to watch the CPUs (IRQs, softirqs, who ran there).")
@click.option("--json", "as_json", is_flag=True, help="Print one object: cpus, watched_s, capture_refused, findings.")
@prints("loopscope.lab.audit:AuditJson")
def audit_cmd(cpus_text: str | None, watch_ns: int, as_json: bool) -> int:
    """Whether the CPUs your real-time work runs on are quiet, and what to do
    where they are not. It reads the set-up (isolcpus, nohz_full, rcu_nocbs and
    whether they took; every task's and kthread's allowed CPUs; IRQ affinities;
    the workqueue mask; sched_rt_runtime_us, timer_migration, THP, swappiness;
    idle states and cpu_dma_latency; the governor; SMT and cache siblings; the
    clocksource), then watches the CPUs: the IRQs and softirqs that fired
    there, steal, busy siblings, and the tasks and kthreads that ran there (a
    kernel capture of the scheduler's switches on those CPUs; root and tracefs).
    Each finding gives its evidence and a remedy: a run-time change, or a boot
    parameter (said, never applied).

    \b
    Examples:
      loopscope audit --cpus 1
      loopscope audit --cpus 2-3 --for 10s --json
    """

    online = sorted(os.sched_getaffinity(0)) if os.geteuid() else list(range(os.cpu_count() or 1))
    cpus = cpu_list(cpus_text) if cpus_text is not None else online[1:] or online
    if cpus_text is not None and not cpus:
        raise InputError(f"--cpus {cpus_text!r}: not a CPU list; write it as 1 or 1-3,5")
    absent = [c for c in cpus if not os.path.exists(f"/sys/devices/system/cpu/cpu{c}")]
    if absent:
        raise InputError(f"--cpus: this machine has no CPU {','.join(map(str, absent))} (it has {os.cpu_count()}: 0-{(os.cpu_count() or 1) - 1})")
    if watch_ns < 100_000_000 or watch_ns > 3_600_000_000_000:
        raise InputError("--for: give from 100ms to 1h")
    res = audit(cpus, watch_ns / 1e9)
    if as_json:
        click.echo(json.dumps(res))
    else:
        _show(res)
    return 0


def _show(res: AuditJson) -> None:
    con = _console()
    cpus = ",".join(map(str, res["cpus"]))
    if res["capture_refused"]:
        con.print(f"note: who ran on the CPUs is not known: {res['capture_refused']}")
    if not res["findings"]:
        con.print(f"CPU {cpus}: nothing found in the set-up or in {res['watched_s']:.1f} s of watching")
        return
    t = Table(show_header=True, header_style="bold", title=f"CPU {cpus}, watched {res['watched_s']:.1f} s")
    for c in ("#", "check", "what", "evidence", "remedy at"):
        t.add_column(c, overflow="fold")
    for i, f in enumerate(res["findings"], 1):
        t.add_row(str(i), f["check"], f"{f['what']}: {f['why']}", f["evidence"], {"runtime": "run time", "boot": "boot", "none": "-"}[f["remedy_kind"]])
    con.print(t)
    for i, f in enumerate(res["findings"], 1):
        click.echo(f"[{i}] {f['remedy']}")
