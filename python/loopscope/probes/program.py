"""Any program as a probe: run it with a trace to write, and measure what it logged.

The user's program is instrumented with loopscope's trace API (C:
``ls_open(NULL, NULL)``; Python: ``loopscope.trace.api.open()``), which
takes its file from ``LOOPSCOPE_TRACE``. This
front end sets that variable, starts the program in a session of its own
(so a terminal's Ctrl-C reaches it once, through here) with loopscope's
interpreter first on its PATH (``python3 my.py`` can import loopscope),
pins it when asked,
and either stops it when the probe's time is up (SIGINT, then SIGTERM, then
SIGKILL, each after a grace period) or waits for it to exit. Its standard
output and error go to this process's standard error (the run's log); this
process prints one JSON object: how the program ended, its wall, user and
system CPU time (``wait4``), and per interval it logged (``group/name``) a
latency summary with confidence intervals, per event its count, the trace's
records and losses. Every interval becomes a record the run's tables,
phase comparisons and outlier attribution treat like a built-in probe's.

A program that exits non-zero on its own fails the probe (the run says so
with the program's last lines); one that never opened its trace is not an
error (its time is still measured) but is said, and an empty trace is left
so that the run's tables stay whole.
"""

from __future__ import annotations

import os
import select
import signal
import subprocess
import sys
import time
from pathlib import Path
from typing import Any

from typing_extensions import NotRequired, TypedDict

import numpy as np

from loopscope.errors import InputError, RunError
from loopscope.probes.common import Envelope, envelope
from loopscope.probes.params import Launch, ProgramParams

GRACE_S = 5.0
STOP_CODES = {0, 130, 143, -signal.SIGINT, -signal.SIGTERM}


def _wait(pid: int, fd: int, timeout_s: float | None) -> tuple[int, Any] | None:
    """Wait for the program on its pidfd (no polling: the probe must not
    add wake-ups of its own); reap it with its resource usage."""
    if timeout_s is None or timeout_s > 0:
        r, _, _ = select.select([fd], [], [], timeout_s)
        if not r:
            return None
    _, status, ru = os.wait4(pid, 0)
    return os.waitstatus_to_exitcode(status), ru


def _stop(pid: int, fd: int) -> tuple[tuple[int, Any], str]:
    for sig, grace in ((signal.SIGINT, GRACE_S), (signal.SIGTERM, 2.0), (signal.SIGKILL, None)):
        try:
            os.kill(pid, sig)
        except ProcessLookupError:
            pass
        got = _wait(pid, fd, grace)
        if got is not None:
            return got, signal.Signals(sig).name
    raise AssertionError("unreachable")


class IntervalJson(TypedDict):
    """One interval entity the program logged: its summary (ns)."""

    entity: str
    n: int
    min_ns: int
    p50_ns: int
    p99_ns: int
    max_ns: int
    avg_ns: float
    ci95_ns: dict[str, list[float | None]]


class TraceSummary(TypedDict):
    records: int
    lost_records: int
    intervals: list[IntervalJson]
    events: dict[str, int]
    memory_locked: str | None


class ProgramJson(Envelope, TraceSummary):
    """What ``loopscope probe program --json`` prints: how the program ended, its cost, its trace's summary."""

    command: list[str]
    pid: int
    exit: str
    stopped: str
    until: str
    wall_ns: int
    user_cpu_ns: int
    sys_cpu_ns: int
    max_rss_kib: int
    wrote_trace: bool
    trace: str
    note: NotRequired[str]


def _child_env(p: ProgramParams, trace: Path) -> dict[str, str]:
    """The program's environment: the probe's, its own ``env``, and where its trace goes."""
    env, mlock = p.env, p.mlock
    # ``python3`` in the command is the interpreter loopscope runs under, so
    # ``import loopscope`` works in the program.
    path = os.pathsep.join([os.path.dirname(sys.executable), os.environ.get("PATH", "")])
    child_env = {**os.environ, "PATH": path, **(env or {}), "LOOPSCOPE_TRACE": str(trace.resolve())}
    child_env.pop("LOOPSCOPE_PDEATHSIG", None)
    if mlock:
        child_env["LOOPSCOPE_MLOCKALL"] = "1"  # loopscope's library locks the program's memory when it opens the trace
    # its trace writer at SCHED_IDLE, as the lab's own probes' are, unless the program's env says otherwise
    child_env.setdefault("LOOPSCOPE_WRITER_IDLE", "1")
    child_env.pop("LOOPSCOPE_COMM", None)  # the program is the user's: it keeps its own name
    return child_env


def _start(command: list[str], child_env: dict[str, str], cpus: list[int] | None, cwd: str | None) -> subprocess.Popen[bytes]:
    """The program started in a session of its own, on ``cpus``, dying with this probe; a clear error when it cannot start."""

    def pre() -> None:
        from loopscope.lineage import die_with_parent

        die_with_parent(parent=os.getppid())  # this probe, whatever its own environment names
        if cpus:
            os.sched_setaffinity(0, cpus)

    try:
        child = subprocess.Popen(
            command,
            env=child_env,
            stdin=subprocess.DEVNULL,
            stdout=sys.stderr.fileno(),
            stderr=sys.stderr.fileno(),
            start_new_session=True,
            preexec_fn=pre,
            cwd=cwd,
        )
    except FileNotFoundError:
        raise InputError(f"program: cannot start {command[0]!r}: no such file on this host (give a path, or install it)") from None
    except PermissionError:
        raise InputError(f"program: cannot start {command[0]!r}: not executable") from None
    except OSError as e:
        raise RunError(f"program: cannot start {command[0]!r}: {e.strerror}") from None
    return child


def run(p: ProgramParams, trace_path: str, time_ns: int | None) -> ProgramJson:
    """Run the program with LOOPSCOPE_TRACE set: until ``time_ns`` is up
    (``until: duration``), or until it exits, failing after ``time_ns``
    when given (``until: exit``)."""
    command, until, cpus, cwd, mlock = p.command, p.until, p.cpu, p.cwd, p.mlock
    duration_ns, timeout_ns = (time_ns, None) if until == "duration" else (None, time_ns)
    if not command:
        raise InputError("program: no command given (loopscope probe program [options] -- CMD ARGS)")
    if until == "duration" and not duration_ns:
        raise InputError("program: --until duration needs --duration")
    if cwd is not None and not Path(cwd).is_dir():
        raise InputError(f"program: working directory {cwd} does not exist on this host")
    trace = Path(trace_path)
    trace.parent.mkdir(parents=True, exist_ok=True)
    trace.unlink(missing_ok=True)
    t0 = time.monotonic_ns()
    child = _start(command, _child_env(p, trace), cpus, cwd)
    fd = os.pidfd_open(child.pid)
    stopped = "exit"
    try:
        if until == "duration":
            got = _wait(child.pid, fd, duration_ns / 1e9)  # type: ignore[operator]
            if got is None:
                got, sig = _stop(child.pid, fd)
                stopped = f"duration ({sig})"
        else:
            got = _wait(child.pid, fd, timeout_ns / 1e9 if timeout_ns else None)
            if got is None:
                _stop(child.pid, fd)
                raise RunError(f"program {command[0]!r} did not exit within {timeout_ns / 1e9:g} s (timeout); it was stopped")  # type: ignore[operator]
    except KeyboardInterrupt:
        got, sig = _stop(child.pid, fd)
        stopped = f"interrupted ({sig})"
    finally:
        os.close(fd)
        child.returncode = 0  # reaped by wait4 above; keep Popen from trying again
    t1 = time.monotonic_ns()
    code, ru = got
    from loopscope.host.procs import exit_text

    if stopped == "exit" and code != 0:
        raise RunError(f"program {command[0]!r} failed: {exit_text(code)} (its output is in the probe's log)")
    if stopped != "exit" and code not in STOP_CODES:
        raise RunError(f"program {command[0]!r} ended with {exit_text(code)} when stopped (expected to exit on SIGINT)")
    wrote = trace.exists() and trace.stat().st_size > 0
    if not wrote:
        from loopscope.trace import api as trace_api

        trace_api.open(trace, groups=["loopscope"]).close()
    sm, stamp = summary(trace), envelope("program")
    out: ProgramJson = {
        "probe": stamp["probe"],
        "loopscope": stamp["loopscope"],
        "json_format": stamp["json_format"],
        "command": command,
        "pid": child.pid,
        "exit": exit_text(code),
        "stopped": stopped,
        "until": until,
        "wall_ns": t1 - t0,
        "user_cpu_ns": int(ru.ru_utime * 1e9),
        "sys_cpu_ns": int(ru.ru_stime * 1e9),
        "max_rss_kib": ru.ru_maxrss,
        "wrote_trace": wrote,
        "trace": str(trace),
        "records": sm["records"],
        "lost_records": sm["lost_records"],
        "intervals": sm["intervals"],
        "events": sm["events"],
        "memory_locked": sm["memory_locked"],
    }
    if not wrote:
        out["note"] = (
            "the program wrote no trace: open one with ls_open(NULL, NULL) (C), loopscope.trace.api.open() (Python), which take their path from LOOPSCOPE_TRACE"
        )
    if mlock and out["memory_locked"] != "mlockall":
        why = out["memory_locked"] or "it opened no trace, so loopscope's library never ran to lock it"
        out["note"] = "; ".join(filter(None, [out.get("note"), f"mlock was asked but the program's memory is not locked: {why}"]))
    return out


def summary(trace: Path) -> TraceSummary:
    """Per interval entity a latency summary; per event entity a count."""
    import polars as pl

    from loopscope.stats import summarize
    from loopscope.trace import reader

    df, info = reader.read_with_info(trace, sort=False)
    out: TraceSummary = {"records": info.records, "lost_records": info.lost_records, "intervals": [], "events": {}, "memory_locked": info.memory_locked}
    if not len(df):
        return out
    df = df.with_columns((pl.col("group").cast(pl.String) + "/" + pl.col("name").cast(pl.String)).alias("entity"), pl.col("kind").cast(pl.String))
    df = df.filter(~pl.col("entity").str.starts_with("loopscope/") & ~pl.col("entity").str.starts_with("chan/"))
    for (ent,), g in df.filter(pl.col("kind") == "interval").group_by("entity", maintain_order=True):
        s = summarize(g["dur_ns"].to_numpy().astype(np.int64))
        out["intervals"].append(
            {
                "entity": ent,
                "n": s.n,
                "min_ns": int(s.min),
                "p50_ns": int(s.p50.value),
                "p99_ns": int(s.p99.value),
                "max_ns": int(s.max),
                "avg_ns": round(s.mean.value, 1),
                "ci95_ns": {"avg": [s.mean.lo, s.mean.hi], "p50": [s.p50.lo, s.p50.hi], "p99": [s.p99.lo, s.p99.hi]},
            }
        )
    for (ent,), g in df.filter(pl.col("kind") != "interval").group_by("entity", maintain_order=True):
        out["events"][ent] = len(g)
    return out


def launched(p: ProgramParams, launch: Launch) -> ProgramJson:
    """The program as an agent starts it: until its time is up, or until it exits (that time is then its timeout)."""
    if launch.trace is None:
        raise InputError("program: a program probe needs a trace path (its LOOPSCOPE_TRACE)")
    return run(p, launch.trace, launch.duration_ns)
