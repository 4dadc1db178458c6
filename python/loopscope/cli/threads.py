"""``loopscope probe threads``: any program's threads, measured from the kernel.

No instrumentation: a kernel capture runs while the target does (a command
started here, or a process already running, or every thread whose name
matches), then every activation of its threads is measured and the late
ones explained (``analysis/threads.py``). A command's threads are collected
from /proc while it runs, so threads that come and go are measured too.
"""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import time
from pathlib import Path
from typing import TYPE_CHECKING

import click

from loopscope.cli.base import _console, Duration, prints
from loopscope.cli.probe import probe
from loopscope.errors import EXIT_INTERRUPTED, InputError, RunError
from loopscope.probes.targets import tasks
from loopscope.probes.threads import check_patterns, stop
from loopscope.units import format_ns
from loopscope.host.cpulimit import limits
from loopscope.probes.threads import set_idle
from loopscope.analysis.threads import matching, names_in, summarize
from loopscope.kernel import capture as C
from loopscope.kernel import store as S
from loopscope.analysis.recorded import line
from loopscope.host import scratch

if TYPE_CHECKING:
    from loopscope.analysis.explained import Cause, Parts
    from loopscope.analysis.threads import Spread, ThreadsJson

#: how often the target's threads are listed while it runs (this process is
#: SCHED_IDLE meanwhile: it only runs where nothing else wants the CPU)
POLL_S = 0.5


def _watch(
    pid: int | None, child: subprocess.Popen[bytes] | None, duration_ns: int | None, groups: dict[int, str]
) -> tuple[dict[int, str], bool, dict[int, str]]:
    """Until the duration is up or the target is gone: its threads as seen,
    whether Ctrl-C ended it, and the threads that exited while the target
    ran on; ``groups`` gets each new thread's CPU-limited cgroup, if any
    (``host.cpulimit``). It sleeps at the normal policy (the end is noticed on a
    CPU-bound machine) and lists at SCHED_IDLE."""

    seen: dict[int, str] = {}
    last: dict[int, str] = {}
    end = time.monotonic() + duration_ns / 1e9 if duration_ns else None
    try:
        while end is None or time.monotonic() < end:
            if child is not None and child.poll() is not None:
                break  # reaped first: an exited child's /proc entry lingers until then
            if pid is not None:
                set_idle(idle=True)
                now = tasks(pid)
                # the new threads' CPU-limited groups, read at SCHED_IDLE too
                groups.update(limits([t for t in now if t not in seen]))
                set_idle(idle=False)
                if not now:
                    break
                seen.update(now)
                last = now
            time.sleep(POLL_S if end is None else min(POLL_S, max(0.0, end - time.monotonic())))
    except KeyboardInterrupt:
        return seen, True, {t: n for t, n in seen.items() if last and t not in last}
    return seen, False, {t: n for t, n in seen.items() if last and t not in last}


def _stop(child: subprocess.Popen[bytes] | None) -> str:
    """Stop a command started here: how it ended ("attached" when there is none)."""
    return "attached" if child is None else stop(child)


@probe.command("threads", context_settings={"ignore_unknown_options": True, "allow_interspersed_args": False})
@click.option("--pid", type=int, default=None, help="Measure this running process's threads.")
@click.option("--comm", default=None, help="Measure every thread whose name matches this regular expression.")
@click.option("--threads", "threads_re", default=None, help="Of the target's threads, only those whose name matches this regular expression.")
@click.option("--duration", "-d", type=Duration(), default=None, help="How long to watch [a command: until it exits; --pid/--comm: 10 s].")
@click.option("--json", "as_json", is_flag=True, help="Print exactly one JSON object, on one line.")
@click.argument("command", nargs=-1, type=click.UNPROCESSED)
@prints("loopscope.analysis.threads:ThreadsJson")
def probe_threads(pid: int | None, comm: str | None, threads_re: str | None, duration: int | None, as_json: bool, command: tuple[str, ...]) -> int:
    """How late each thread of a program ran, and why, from kernel events
    alone: give a running process (--pid), thread names (--comm) or a
    command (after --). Needs root and tracefs.

    \b
    Examples:
      loopscope probe threads -d 10s -- cyclictest -m -p 80 -i 1000
      loopscope probe threads --pid 4242 -d 30s --threads 'worker.*' --json
    """

    if sum(x is not None and x != () for x in (pid, comm, command or None)) != 1:
        raise InputError("give one target: --pid P, --comm REGEX, or a command after --")
    check_patterns(comm=comm, threads=threads_re)
    if pid is not None and not Path(f"/proc/{pid}").exists():
        raise InputError(f"--pid {pid}: no such process on this host")
    _, _, refused = C.available()
    if refused:
        raise RunError(f"probe threads needs a kernel capture: {refused}", component="kernel capture")
    with scratch.directory("threads") as d:
        cap = C.Capture(Path(d) / "kernel", name=f"loopscope-threads{os.getpid()}")
        meta = cap.start()
        if meta.refused:
            raise RunError(f"probe threads: {meta.refused}", component="kernel capture")
        child = None
        try:
            if command:
                try:
                    # its output is the user's, on stderr: stdout is this command's (--json)
                    child = subprocess.Popen(list(command), start_new_session=True, stdout=sys.stderr.fileno())
                except OSError as e:
                    raise InputError(f"cannot start {command[0]!r}: {e.strerror}") from None
            target = child.pid if child is not None else pid
            # measured: from when the command settled (its exec, its start-up are ours) to before it is stopped
            time.sleep(0.05 if child is not None else 0)
            off = C.timens_offset_ns()
            a = time.clock_gettime_ns(time.CLOCK_MONOTONIC) - off
            groups: dict[int, str] = {}
            seen, interrupted, exited = _watch(target, child, duration or (None if child is not None else 10_000_000_000), groups)
            b = time.clock_gettime_ns(time.CLOCK_MONOTONIC) - off
            ended = _stop(child)
            cap.drain("end")
        finally:
            if child is not None and child.poll() is None:
                os.killpg(child.pid, signal.SIGKILL)
                child.wait()
            cap.stop()
        st = S.open_dir(Path(d) / "kernel")
        names = {**names_in(st.load(st.t_first or 0, st.t_last or 0)), **seen}
        chosen = matching(names, comm=comm, threads=threads_re, tids=set(seen) if target is not None else None)
        if not chosen:
            what = f"--comm {comm!r}" if comm else f"pid {target}"
            raise InputError(f"no thread of {what}{f' matching --threads {threads_re!r}' if threads_re else ''} ran while the capture recorded")
        if target is None:
            groups.update(limits([t for t in chosen if t not in groups]))
        # this process's own threads (its /proc polling, the capture's reader) are the lab's
        own = {t: "lab: probe" for t in tasks(os.getpid())} | {t: "lab: capture" for t in cap.tids}
        res = summarize(st, chosen, own, (a, b), groups)
        res["exited"] = [{"tid": t, "comm": n} for t, n in sorted(exited.items()) if t in chosen]
    if as_json:
        click.echo(json.dumps(res))
    else:
        print_threads(res, f"target {ended}")
    return EXIT_INTERRUPTED if interrupted else 0


def parts_line(p: Parts) -> str:
    """The outliers' two parts in a line: which holds the headline time, each with its causes."""

    def causes(cs: list[Cause]) -> str:
        return ", ".join(f"{c['cause']} {(c['share'] or 0) * 100:.0f} %" for c in cs[:3]) or "nothing"

    pre = p["before_wakeup_share"]
    return (
        f"{pre * 100:.0f} % before the wake-up ({causes(p['before'])}), {(1 - pre) * 100:.0f} % after it ({causes(p['after'])}); "
        f"most of the time is {p['headline']}"
    )


def print_threads(res: ThreadsJson, where: str) -> None:
    """The threads' figures as lines of text (``probe threads``, ``threads``)."""
    con = _console()

    def s(x: Spread | None) -> str:
        return f"p50 {format_ns(x['p50'])}, p99 {format_ns(x['p99'])}, max {format_ns(x['max'])}" if x else "n/a"

    con.print(f"{len(res['threads'])} thread(s), {where}; {res['kernel_events']:,} kernel events, {res['lost_kernel_events']:,} lost")

    for u in res.get("not_recorded") or []:
        con.print(f"  note: {line(u)}")
    for x in res.get("exited") or []:
        con.print(f"  note: thread {x['comm']} ({x['tid']}) exited while the target ran on: its figures end there")
    for t in res["threads"]:
        con.print(
            f"[bold]{t['comm']}[/] ({t['tid']}): {t['activations']:,} activations ({t['incomplete']} incomplete), {t['preemptions']} preemptions, {t['migrations']} migrations"
        )
        con.print(f"  wake-up latency {s(t['wakeup_latency_ns'])}; timer lateness {s(t['timer_lateness_ns'])}; run time {s(t['runtime_ns'])}")
        if t["causes"]:
            con.print("  its late wake-ups' time: " + ", ".join(f"{c['cause']} {c['share'] * 100:.0f} %" for c in t["causes"][:4]))
        if (parts := t.get("parts")) is not None:
            con.print(f"  {parts_line(parts)}")
