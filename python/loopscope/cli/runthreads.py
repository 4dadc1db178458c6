"""``loopscope threads RUN``: the threads of a run's kernel capture.

It measures the threads of any run's capture (imported by ``loopscope
import``, or recorded) the way ``probe threads`` does live
(``analysis/threads.py``), with the same JSON.
"""

from __future__ import annotations

import json
import re

import click

from loopscope.cli.base import cli, prints
from loopscope.errors import InputError
from loopscope.analysis.limits import groups_of
from loopscope.analysis.recorded import RECORD_SCHEDULER, need_scheduler
from loopscope.analysis.threads import summarize, thread_names
from loopscope.cli.threads import print_threads
from loopscope.kernel import store as S
from loopscope.probes.threads import check_patterns
from loopscope.rundir import RunDir


@cli.command("threads")
@click.argument("run_dir", type=click.Path(file_okay=False))
@click.option("--comm", default=None, help="Measure every thread whose name matches this regular expression.")
@click.option("--tid", "tids", type=int, multiple=True, help="Measure this thread (repeat for more).")
@click.option("--threads", "threads_re", default=None, help="Of those, only the threads whose name matches this regular expression.")
@click.option("--host", default=None, help="The capture of this host [the run's only one].")
@click.option("--json", "as_json", is_flag=True, help="Print exactly one JSON object, on one line.")
@prints("loopscope.analysis.threads:ThreadsJson")
def threads_cmd(run_dir: str, comm: str | None, tids: tuple[int, ...], threads_re: str | None, host: str | None, as_json: bool) -> int:
    """How late each thread ran, and why, from a run's kernel capture
    (a run of loopscope's, or one made by `loopscope import`).

    \b
    Examples:
      loopscope threads runs/20261126-101500-import-trace --comm 'cyclictest'
      loopscope threads runs/20261126-101500-import-trace --tid 4242 --json
    """

    if comm is None and not tids:
        raise InputError("give the threads: --comm REGEX or --tid N")
    check_patterns(comm=comm, threads=threads_re)
    rd = RunDir.open(run_dir)
    caps = [c for c in rd.record().captures if c.data]
    if host is not None:
        caps = [c for c in caps if c.host == host or host in c.covers]
    if not caps:
        raise InputError(f"{run_dir}: no kernel capture{f' of host {host}' if host else ''} (record with kernel capture on, or import a trace.dat / perf.data)")
    if len(caps) > 1:
        raise InputError(f"{run_dir}: captures of {', '.join(c.host for c in caps)}; choose one with --host")
    st = S.open_capture(rd.path, caps[0])
    seen = set(st.by_event())
    need_scheduler(seen, run_dir, "threads")
    if not {"sched_wakeup", "sched_waking"} & seen:
        raise InputError(
            f"{run_dir}: its capture has no sched_wakeup or sched_waking events, so no thread's activations can be measured; "
            f"record them with {RECORD_SCHEDULER}"
        )
    names = thread_names(st)
    chosen = {
        t: n for t, n in names.items() if (not tids or t in tids) and (comm is None or re.search(comm, n)) and (threads_re is None or re.search(threads_re, n))
    }
    for t in tids:
        if t not in names:
            raise InputError(f"--tid {t}: no such thread ran in the capture")
    if not chosen:
        what = f"--comm {comm!r}" if comm else "the --tid given"
        raise InputError(f"no thread matching {what}{f' and --threads {threads_re!r}' if threads_re else ''} ran in the capture")
    res = summarize(st, chosen, groups=groups_of(caps[0].cpu_limits, st))
    if as_json:
        click.echo(json.dumps(res))
    else:
        print_threads(res, f"in {rd.path.name}")
    return 0
