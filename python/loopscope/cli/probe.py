"""`loopscope probe …`: every probe as a command of its own (the experiment's kinds and the lab's helpers).

This module holds the group and the probes that measure one machine (timer,
sched, syscall, program, and the lab's launch); those that go over a network
are ``netprobe.py``."""

from __future__ import annotations

import json
import shlex

from typing import Any

import click

from loopscope.errors import EXIT_INTERRUPTED, InputError
from loopscope.units import format_ns
from loopscope.cli.base import PROBE_COMMANDS, CpuList, Duration, LazyGroup, _console, _default_run_dir, cli, prints  # noqa: F401
from loopscope.cli.params import build, options
from loopscope.probes.params import ProgramParams, SchedParams, SyscallParams, TimerParams
from loopscope.cli.show import _ci, _print_timer, _report, _trace_line, _trace_path  # noqa: F401
from loopscope.probes import timer
from loopscope.probes import sched
from rich.table import Table
from pydantic import ValidationError
from loopscope.probes import launch
from loopscope.probes.params import Launch
from loopscope.probes import syscall
from loopscope.probes import program


class _Probes(LazyGroup):
    modules = PROBE_COMMANDS


@cli.group(cls=_Probes)
def probe() -> None:
    """Measure the machine with one probe, standalone."""


@probe.command("timer")
@options(TimerParams)
@click.option("--duration", "-d", type=Duration(), default="10s", show_default=True, help="How long to measure (10s, 500ms, 2m).")
@click.option("--trace", "trace_path", type=click.Path(dir_okay=False), default=None, help="Trace file [default: runs/<time>-timer/timer.lstrace].")
@click.option("--json", "as_json", is_flag=True, help="Print exactly one JSON object.")
@prints("loopscope.probes.timer:TimerJson")
def probe_timer(duration: int, trace_path: str | None, as_json: bool, **params: object) -> int:
    """Timer wake-up latency on absolute deadlines (what cyclictest measures).

    Every wake-up goes into the trace as an interval from its deadline to when
    the thread ran; deadlines that passed while a wake-up was late are counted
    as missed. The options are the experiment file's fields of a timer probe.

    \b
    Examples:
      loopscope probe timer -i 1000 -d 10s
      loopscope probe timer -i 200 -d 1m -t 2 --cpu 0,1 -p 80 --trace timer.lstrace
      loopscope probe timer --dma-latency-us 0 --cpu 1
    """

    res = timer.run(build(TimerParams, params), duration, _trace_path(trace_path, "timer"))
    if as_json:
        click.echo(json.dumps(res.to_json()))
    else:
        _print_timer(res)
    return EXIT_INTERRUPTED if res.interrupted else 0


@probe.command("sched")
@options(SchedParams)
@click.option("--duration", "-d", type=Duration(), default="10s", show_default=True, help="How long to measure.")
@click.option("--work-iters", type=click.IntRange(min=1), default=None, help="Burst size from an earlier --calibrate-only run (with --alone-ns).")
@click.option("--alone-ns", type=click.IntRange(min=1), default=None, help="The burst's time alone from that run.")
@click.option("--calibrate-only", is_flag=True, help="Only size the burst and time it alone; print that and stop.")
@click.option("--trace", "trace_path", type=click.Path(dir_okay=False), default=None, help="Trace file [default: runs/<time>-sched/sched.lstrace].")
@click.option("--json", "as_json", is_flag=True, help="Print exactly one JSON object.")
@prints("loopscope.probes.sched:SchedJson")
def probe_sched(
    duration: int, work_iters: int | None, alone_ns: int | None, calibrate_only: bool, trace_path: str | None, as_json: bool, **params: object
) -> int:
    """Scheduler responsiveness: a thread alternating sleep and work next to busy threads (Paul et al. 2003).

    \b
    Examples:
      loopscope probe sched -d 10s
      loopscope probe sched -d 30s --busy-threads 2 --cpu 0
    """

    p = build(SchedParams, params)
    res = sched.run(
        p,
        duration,
        work_iters=work_iters,
        alone_ns=alone_ns,
        calibrate_only=calibrate_only,
        trace_path=None if calibrate_only else _trace_path(trace_path, "sched"),
    )
    if as_json:
        click.echo(json.dumps(res.to_json()))
    else:
        _print_sched(res)
    return EXIT_INTERRUPTED if res.interrupted else 0


def _print_sched(res: Any) -> None:

    con = _console()
    con.print(
        f"scheduler responsiveness · {res.busy_threads} busy threads · sleep {format_ns(res.sleep_ns)} / work {format_ns(res.work_ns)} · {res.cycles:,} cycles"
    )
    t = Table(show_edge=False)
    t.add_column("")
    for c in ("p50", "p99", "max", "avg (95% CI)"):
        t.add_column(c, justify="right")
    for name, s in (("wake-up delay", res.wake), ("extra completion", res.extra)):
        if s.n:
            t.add_row(name, format_ns(s.p50.value), format_ns(s.p99.value), format_ns(s.max), f"{format_ns(s.mean.value)} {_ci(s.mean)}")
    con.print(t)
    con.print(
        f"burst alone: {format_ns(res.alone_ns)} (fastest of 21, before the busy threads started); total extra time over the run: {format_ns(res.total_extra_ns)}"
    )
    _trace_line(con, res)


@probe.command("launch", hidden=True)
@click.argument("launch_json")
def probe_launch(launch_json: str) -> int:
    """Run a probe as an agent starts it: one Launch (kind, typed parameters, the step's duration and trace) as JSON; prints its one JSON object."""

    try:
        lc = Launch.model_validate_json(launch_json)
    except ValidationError as e:
        raise InputError(f"launch: {e.errors()[0]['msg']} at {'.'.join(str(x) for x in e.errors()[0]['loc'])}") from None
    out, interrupted = launch.run(lc)
    click.echo(json.dumps(out))
    return EXIT_INTERRUPTED if interrupted else 0


@probe.command("syscall")
@options(SyscallParams)
@click.option("--trace", "trace_path", type=click.Path(dir_okay=False), default=None, help="Trace file [default: runs/<time>-syscall/syscall.lstrace].")
@click.option("--json", "as_json", is_flag=True, help="Print exactly one JSON object.")
@prints("loopscope.probes.syscall:SyscallJson")
def probe_syscall(trace_path: str | None, as_json: bool, **params: object) -> int:
    """Cost of each system call, in batches until its 95% CI is within --target-pct % (Carlinet et al. 2000).

    \b
    Examples:
      loopscope probe syscall
      loopscope probe syscall --calls getpid,read,write --json
    """

    p = build(SyscallParams, params)
    res = syscall.run(p, None, _trace_path(trace_path, "syscall"))
    if as_json:
        click.echo(json.dumps(res.to_json()))
    else:
        con = _console()
        con.print(f"system-call cost · batches of {p.batch} · until the 95% CI is within {p.target_pct:g}% of the mean")
        t = Table(show_edge=False)
        for head, j in (("call", "left"), ("mean", "right"), ("95% CI", "right"), ("batches", "right"), ("", "left")):
            t.add_column(head, justify=j)  # type: ignore[arg-type]
        for c in res.calls:
            t.add_row(c.name, format_ns(c.mean_ns), f"±{format_ns(c.ci_half_ns)}", f"{c.batches:,}", "" if c.converged else "[yellow]not converged (cap)[/]")
        con.print(t)
        con.print(f"probe overhead: two clock reads per batch, {res.clock_read_ns * 2 / p.batch:.2f} ns per call, included")
        _trace_line(con, res)
    return EXIT_INTERRUPTED if res.interrupted else 0


@probe.command("program", context_settings={"ignore_unknown_options": True, "allow_interspersed_args": False})
@click.option(
    "--duration",
    "-d",
    type=Duration(),
    default=None,
    help="Stop the program (SIGINT) after this long; with --until exit, the time it may take before it is stopped and the probe fails.",
)
@click.option(
    "--until",
    type=click.Choice(["duration", "exit"]),
    default=None,
    help="End the probe when the duration is up [default when --duration is given] or when the program exits [otherwise].",
)
@click.option("--cpu", "cpus", type=CpuList(), default=None, help="Pin the program to these CPUs.")
@click.option("--env", "env", multiple=True, help="NAME=VALUE for the program's environment (repeatable).")
@click.option("--cwd", type=click.Path(file_okay=False), default=None, help="The program's working directory [this one].")
@click.option("--mlock", is_flag=True, help="Lock the program's memory (mlockall) when it opens its trace: loopscope's library does it (LOOPSCOPE_MLOCKALL=1).")
@click.option(
    "--trace",
    "trace_path",
    type=click.Path(dir_okay=False),
    default=None,
    help="Trace file the program writes (its LOOPSCOPE_TRACE) [default: runs/<time>-program/program.lstrace].",
)
@click.option("--json", "as_json", is_flag=True, help="Print exactly one JSON object.")
@click.argument("command", nargs=-1, required=True, type=click.UNPROCESSED)
@prints("loopscope.probes.program:ProgramJson")
def probe_program(
    duration: int | None,
    until: str | None,
    cpus: list[int] | None,
    env: tuple[str, ...],
    cwd: str | None,
    mlock: bool,
    trace_path: str | None,
    as_json: bool,
    command: tuple[str, ...],
) -> int:
    """Run an instrumented program (after --) as a probe: it writes its own
    trace (LOOPSCOPE_TRACE); every interval it logs is summarised here and,
    in a run, compared across phases and attributed like a built-in probe's.

    \b
    Examples:
      loopscope probe program -d 10s -- ./my-app
      loopscope probe program --cpu 1 --trace app.lstrace -- python3 app.py --fast
    """

    extra = {}
    for e in env:
        k, eq, v = e.partition("=")
        if not eq or not k:
            raise InputError(f"--env {e!r}: expected NAME=VALUE")
        extra[k] = v
    mode = until or ("duration" if duration else "exit")
    p = build(ProgramParams, {"command": list(command), "until": mode, "env": extra, "cpu": cpus, "cwd": cwd, "mlock": mlock})
    res = program.run(p, _trace_path(trace_path, "program"), duration)
    if as_json:
        click.echo(json.dumps(res))
        return 0
    con = _console()
    con.print(
        f"{shlex.join(command)}: {res['exit']}, stopped at {res['stopped']}; {res['wall_ns'] / 1e9:.3f} s wall, {res['user_cpu_ns'] / 1e9:.3f} s user, {res['sys_cpu_ns'] / 1e9:.3f} s system"
    )
    for iv in res["intervals"]:
        con.print(f"  {iv['entity']}: {iv['n']:,} intervals, p50 {format_ns(iv['p50_ns'])}, p99 {format_ns(iv['p99_ns'])}, max {format_ns(iv['max_ns'])}")
    for ent, n in res["events"].items():
        con.print(f"  {ent}: {n:,} events")
    con.print(f"trace: {res['trace']} ({res['records']:,} records, {res['lost_records']} lost)")
    if res.get("note"):
        con.print(f"note: {res['note']}")
    return 0
