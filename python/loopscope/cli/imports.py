"""``loopscope import``: the traces users already have.

``import FILE`` turns a trace-cmd ``trace.dat`` or a ``perf.data`` of
tracepoints into a run directory whose kernel capture is loopscope's own
format (``kernel/imported.py``); ``loopscope threads RUN`` then measures its
threads (``cli/runthreads.py``). This module loads no table library: an
import starts in the time of its run record's types.
"""

from __future__ import annotations

import json
from pathlib import Path

import click

from loopscope.cli.base import _console, cli, prints
from loopscope.errors import InputError
from loopscope.kernel import imported as I


@cli.command("import")
@click.argument("file", type=click.Path(dir_okay=False))
@click.option("-o", "--out", "out", type=click.Path(file_okay=False), default=None, help="The run directory to make [runs/<time>-import-<file name>].")
@click.option("--host", default=None, help="The host the recording is of [the file's host name, else 'imported'].")
@click.option("--json", "as_json", is_flag=True, help="Print exactly one JSON object, on one line.")
@click.option(
    "--perf-reader",
    type=click.Choice(["walk", "sorted"]),
    default="walk",
    show_default=True,
    help="A perf.data's records: walked in file order where their layout allows, or all through the linux-perf-data crate's sorted reader (slower; to compare or fall back).",
)
@prints("loopscope.kernel.imported:Imported")
def import_cmd(file: str, out: str | None, host: str | None, as_json: bool, perf_reader: str) -> int:
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
        res = I.import_file(src, dest, host, sorted_reader=perf_reader == "sorted")
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
