"""The ``threads`` probe's process: which threads to measure, and when.

It measures nothing itself: the lab's kernel capture records the threads,
and the ``threads`` kind (``kinds/threads.py``) finds their activations in
it after the run. This process starts the command (in a session of its
own, pinned and at SCHED_FIFO when asked) or attaches to threads already
running (a pid, a thread-name pattern, a cgroup), lists their threads from
/proc while the step runs (every ``POLL_S``, at SCHED_IDLE, so that it runs
only where nothing else wants a CPU; the command's start-up and stop are
left out of the measured window), and prints one JSON object: the threads
seen (tid → name), the measured window on the kernel's CLOCK_MONOTONIC, its
own thread ids (the lab's, told apart in attribution) and how the command
ended. It writes an empty trace so the run's tables stay whole.

Watched by a monitor (``LOOPSCOPE_WATCH_PIDS``: a watching kernel
capture's ``set_event_pid``) it puts its target there, so that the kernel
records the target's threads only: the command's own pid, written by the
command's process before it execs (every thread and process it starts then
joins by ``event-fork``), or each attached thread as it is found; and after
every listing it rewrites ``<trace>.seen.json`` (the threads seen so far and
the window up to now), which the monitor reads while the period runs.
"""

from __future__ import annotations

import json
import os
import re
import signal
import subprocess
import sys
import time
from pathlib import Path

from typing_extensions import NotRequired, TypedDict

from loopscope.errors import InputError, RunError
from loopscope.probes.common import envelope
from loopscope.probes.params import Launch, ThreadsParams
from loopscope.probes.targets import in_cgroup, named, problem, tasks

#: how often the target's threads are listed (this process is SCHED_IDLE meanwhile)
POLL_S = 0.5
#: thread-name patterns scan all of /proc: less often
SCAN_S = 2.0
#: a command settles before it is measured (its exec and start-up are the lab's doing)
SETTLE_S = 0.05
#: a monitor's watching capture: where the target's thread ids go
WATCH_ENV = "LOOPSCOPE_WATCH_PIDS"


def add_pids(tids: list[int]) -> None:
    """Threads for a monitor's watching capture to record (nothing outside a monitor)."""
    path = os.environ.get(WATCH_ENV)
    if not path or not tids:
        return
    try:
        # appended (no O_TRUNC: the kernel adds them to the list); os.open, as
        # Python's "a" seeks to the end, which tracefs refuses
        fd = os.open(path, os.O_WRONLY | os.O_APPEND)
        try:
            os.write(fd, (" ".join(str(t) for t in tids) + "\n").encode())
        finally:
            os.close(fd)
    except OSError as e:
        sys.stderr.write(f"threads: cannot add {tids} to the monitor's capture ({path}): {e}\n")


def _live(path: Path | None, seen: dict[int, str], rx: re.Pattern[str] | None, a: int, b: int) -> None:
    """The threads seen so far and the window up to ``b``, for a monitor to read while the period runs."""
    if path is None:
        return
    got = {str(t): n for t, n in sorted(seen.items()) if rx is None or rx.search(n)}
    tmp = path.with_name(path.name + ".tmp")
    tmp.write_text(json.dumps({"seen": got, "window_ns": [a, b]}) + "\n")
    os.replace(tmp, path)


class ThreadsProbeJson(TypedDict):
    """What the threads probe's process prints."""

    probe: str
    loopscope: str
    json_format: int
    seen: dict[str, str]
    window_ns: list[int]
    own_tids: list[int]
    target: str
    ended: str
    note: NotRequired[str]
    interrupted: NotRequired[bool]
    exited: NotRequired[dict[str, str]]


def check_patterns(**flags: str | None) -> None:
    """Each given regular expression compiles (InputError naming its option otherwise)."""
    for flag, rx in flags.items():
        if rx is not None:
            try:
                re.compile(rx)
            except re.error as e:
                raise InputError(f"--{flag} {rx!r}: not a regular expression ({e})") from None


def kernel_now() -> int:
    """The kernel's CLOCK_MONOTONIC (this process may sit in a time namespace)."""
    from loopscope.kernel.capture import timens_offset_ns

    return time.clock_gettime_ns(time.CLOCK_MONOTONIC) - timens_offset_ns()


def _listed(p: ThreadsParams, child: subprocess.Popen[bytes] | None, own: set[int], last_scan: list[float]) -> dict[int, str] | None:
    """The target's threads now; None when the target is gone."""
    a = p.attach
    if child is not None:
        if child.poll() is not None:
            return None  # reaped first: an exited child's /proc entry lingers until then
        return tasks(child.pid)
    assert a is not None
    if a.pid is not None:
        return tasks(a.pid) or None
    if a.cgroup is not None:
        return in_cgroup(a.cgroup)
    if time.monotonic() - last_scan[0] < SCAN_S:
        return {}
    last_scan[0] = time.monotonic()
    return named(str(a.comm), own)


def set_idle(idle: bool) -> None:
    """This thread at SCHED_IDLE (True) or back at the normal policy."""
    try:
        os.sched_setscheduler(0, os.SCHED_IDLE if idle else os.SCHED_OTHER, os.sched_param(0))
    except OSError:
        pass


def watch(
    p: ThreadsParams, child: subprocess.Popen[bytes] | None, duration_ns: int, live: Path | None = None, a: int = 0
) -> tuple[dict[int, str], bool, int, dict[int, str], bool]:
    """Until the step's time is up or the target is gone: its threads as seen,
    whether the target went away first, and when the measured window ends on
    the kernel's clock: when the last sleep was due to end (what this
    process does once awake, listing and stopping, is left out), or when the
    target was found gone; the threads that exited while it ran on; and
    whether Ctrl-C (SIGINT) cut it short, the window then ending there with
    what was seen until then kept. It sleeps at the normal policy (so that the end
    of the step is noticed on a CPU-bound machine) and lists at SCHED_IDLE
    (so that the listing runs only where nothing else wants a CPU). ``live``:
    where a monitor reads what was seen so far (``_live``)."""
    seen: dict[int, str] = {}
    last: dict[int, str] = {}
    own = {int(t) for t in os.listdir("/proc/self/task")}
    end = time.monotonic() + duration_ns / 1e9
    last_scan = [0.0]
    gone = False
    b = kernel_now()
    cut = False
    rx = re.compile(p.threads) if p.threads is not None else None
    try:
        while time.monotonic() < end:
            set_idle(idle=True)
            now = _listed(p, child, own, last_scan)
            set_idle(idle=False)
            if now is None:
                gone = True
                b = kernel_now()
                break
            if child is None:
                add_pids([t for t in now if t not in seen])  # a command's threads join by event-fork
            seen.update(now)
            if now:
                last = now
            _live(live, seen, rx, a, kernel_now())
            nap = min(POLL_S, max(0.0, end - time.monotonic()))
            b = kernel_now() + int(nap * 1e9)
            time.sleep(nap)
    except KeyboardInterrupt:
        set_idle(idle=False)
        cut, b = True, kernel_now()
    if rx is not None:
        seen = {t: n for t, n in seen.items() if rx.search(n)}
    return seen, gone, b, {t: n for t, n in seen.items() if last and t not in last}, cut


def _start(p: ThreadsParams) -> subprocess.Popen[bytes]:
    assert p.command is not None
    env = {**os.environ, **p.env}
    env.pop("LOOPSCOPE_PDEATHSIG", None)
    env.pop("LOOPSCOPE_COMM", None)
    env.pop(WATCH_ENV, None)

    def pre() -> None:
        from loopscope.lineage import die_with_parent

        die_with_parent(parent=os.getppid())
        add_pids([os.getpid()])  # before exec: every thread it starts is recorded
        if p.cpu:
            os.sched_setaffinity(0, p.cpu)
        if p.priority:
            os.sched_setscheduler(0, os.SCHED_FIFO, os.sched_param(p.priority))

    try:
        return subprocess.Popen(
            p.command,
            env=env,
            stdin=subprocess.DEVNULL,
            stdout=sys.stderr.fileno(),
            stderr=sys.stderr.fileno(),
            start_new_session=True,
            preexec_fn=pre,
            cwd=p.cwd,
        )
    except FileNotFoundError:
        raise InputError(f"threads: cannot start {p.command[0]!r}: no such file on this host") from None
    except subprocess.SubprocessError as e:
        raise RunError(f"threads: cannot start {p.command[0]!r}: {e}") from None
    except OSError as e:
        raise RunError(f"threads: cannot start {p.command[0]!r}: {e.strerror}") from None


def stop(child: subprocess.Popen[bytes]) -> str:
    """Stop a command started in a session of its own (SIGINT, then SIGKILL after 2 s): how it ended."""
    if child.poll() is None:
        os.killpg(child.pid, signal.SIGINT)
        try:
            child.wait(timeout=2)
        except subprocess.TimeoutExpired:
            os.killpg(child.pid, signal.SIGKILL)
            child.wait()
        return f"stopped (exit {child.returncode})"
    return f"exited ({child.returncode})"


def launched(p: ThreadsParams, launch: Launch) -> ThreadsProbeJson:
    """One step: start or attach, list the threads for the step's time, say which and when."""
    if launch.trace:
        from loopscope.trace import api as trace_api

        Path(launch.trace).parent.mkdir(parents=True, exist_ok=True)
        trace_api.open(Path(launch.trace), groups=["loopscope"]).close()
    if p.attach is not None and (why := problem(p.attach.pid, p.attach.comm, p.attach.cgroup)):
        raise InputError(why)
    child = _start(p) if p.command is not None else None
    interrupted = False
    try:
        if child is not None:
            time.sleep(SETTLE_S)
        a = kernel_now()
        live = Path(launch.trace).with_suffix(".seen.json") if launch.trace and os.environ.get(WATCH_ENV) else None
        seen, gone, b, exited, interrupted = watch(p, child, launch.duration_ns, live, a)
        ended = stop(child) if child is not None else ("gone" if gone else "attached")
    finally:
        if child is not None and child.poll() is None:
            os.killpg(child.pid, signal.SIGKILL)
            child.wait()
    stamp = envelope("threads")
    target = (
        " ".join(p.command)
        if p.command
        else (
            f"pid {p.attach.pid}"
            if p.attach and p.attach.pid
            else f"comm {p.attach.comm!r}"
            if p.attach and p.attach.comm
            else f"cgroup {p.attach.cgroup if p.attach else ''}"
        )
    )
    out: ThreadsProbeJson = {
        **stamp,  # type: ignore[typeddict-item]
        "seen": {str(t): n for t, n in sorted(seen.items())},
        "window_ns": [a, b],
        "own_tids": sorted(int(t) for t in os.listdir("/proc/self/task")),
        "target": target,
        "ended": ended,
    }
    if exited:
        out["exited"] = {str(t): n for t, n in sorted(exited.items())}
        out["note"] = "exited while the step ran: " + ", ".join(f"{n} ({t})" for t, n in sorted(exited.items()))
    if not seen:
        out["note"] = f"no thread of {target}{f' matching {p.threads!r}' if p.threads else ''} was seen while the step ran"
    if interrupted:
        out["interrupted"] = True
    return out
