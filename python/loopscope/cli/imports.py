"""``loopscope import`` and ``loopscope threads``: the traces users already have.

``import FILE`` turns a trace-cmd ``trace.dat`` or a ``perf.data`` of
tracepoints into a run directory whose kernel capture is loopscope's own
format (``kernel/imported.py``); ``threads RUN`` measures the threads of any
run's capture (imported or recorded) the way ``probe threads`` does live
(``analysis/threads.py``), with the same JSON.
"""

from __future__ import annotations

import json
import re
from pathlib import Path

import click

from loopscope.cli.base import _console, cli, prints
from loopscope.errors import InputError
from loopscope.kernel import imported as I
from loopscope.analysis.limits import groups_of
from loopscope.analysis.recorded import RECORD_SCHEDULER, need_scheduler
from loopscope.analysis.threads import summarize, thread_names
from loopscope.cli.threads import print_threads
from loopscope.kernel import store as S
from loopscope.probes.threads import check_patterns
from loopscope.rundir import RunDir


@cli.command("import")
@click.argument("file", type=click.Path(dir_okay=False))
@click.option("-o", "--out", "out", type=click.Path(file_okay=False), default=None, help="The run directory to make [runs/<time>-import-<file name>].")
@click.option("--host", default=None, help="The host the recording is of [the file's host name, else 'imported'].")
@click.option("--json", "as_json", is_flag=True, help="Print exactly one JSON object, on one line.")
@prints("loopscope.kernel.imported:Imported")
def import_cmd(file: str, out: str | None, host: str | None, as_json: bool) -> int:
    """Read a trace-cmd trace.dat (versions 6 and 7) or a perf.data of
    kernel tracepoints into a run directory; then `loopscope threads RUN`
    and `loopscope explain RUN` work on it.

    \b
    A useful recording has sched_switch and sched_wakeup (or sched_waking);
    irq, irq_vectors, timer (hrtimer_start, hrtimer_expire_entry) and
    sched_stat_runtime events sharpen the causes. Examples:
      trace-cmd record -e sched -e irq -e timer -- ./my-program   # or trace-cmd extract
      perf sched record -- ./my-program
      loopscope import trace.dat -o runs/night-of-the-spike
      loopscope threads runs/night-of-the-spike --comm my-program
    """

    src = Path(file)
    if not src.exists():
        raise InputError(f"{file}: no such file")
    dest = Path(out) if out else I.default_dir(src)
    existed = dest.exists()
    if existed and dest.is_dir() and any(dest.iterdir()):
        raise InputError(f"{dest}: exists and is not empty; give a new directory with -o")
    try:
        res = I.import_file(src, dest, host)
    except BaseException:
        I.remove_partial(dest)  # nothing half-imported is left (an empty directory given stays)
        if existed:
            dest.mkdir(exist_ok=True)
        raise
    if as_json:
        click.echo(json.dumps(res))
        return 0
    con = _console()
    con.print(
        f"{res['format']} version {res['version']}: {res['kernel_events']:,} events, {res['lost_kernel_events']:,} lost "
        f"({res['lost_windows']} loss windows{f', {u} of them of unknown size' if (u := res['lost_unknown_windows']) else ''}), {res['segments']} segment(s), in {res['seconds']:.2f} s ({res['events_per_s'] / 1e6:.1f} M events/s)"
    )
    for n in res["notes"]:
        con.print(f"  note: {n}")
    click.echo(res["run_dir"])
    return 0


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
