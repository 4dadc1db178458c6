"""Starting, watching and describing the processes of a run.

Every process the lab starts gets the run's id in its environment
(``LOOPSCOPE_RUN``), so that it can be found again even without cgroups,
writes its output to a log file in the run directory, and enters its own
cgroup when there is one. loopscope's own children also ask the kernel to
kill them when their parent dies (``LOOPSCOPE_PDEATHSIG=<the parent's pid>``,
see ``loopscope.lineage``). When a component
fails, ``describe_failure`` gives its command, exit code and last lines.
"""

from __future__ import annotations

import os
import shlex
import signal
import subprocess
import time
from collections.abc import Iterator
from contextlib import contextmanager
from dataclasses import dataclass, field
from pathlib import Path

from loopscope.host.cgroup import RunGroup


def tail(path: Path, n: int = 12) -> list[str]:
    try:
        with open(path, "rb") as f:
            f.seek(0, os.SEEK_END)
            size = f.tell()
            f.seek(max(0, size - 16384))
            lines = f.read().decode(errors="replace").splitlines()
    except OSError:
        return []
    return [l for l in lines if l.strip()][-n:]


def exit_text(code: int | None) -> str:
    if code is None:
        return "still running"
    if code < 0:
        try:
            return f"killed by {signal.Signals(-code).name}"
        except ValueError:
            return f"killed by signal {-code}"
    return f"exit code {code}"


@dataclass
class Child:
    name: str
    kind: str
    argv: list[str]
    popen: subprocess.Popen[bytes]
    log: Path
    group: Path | None
    started_ns: int = field(default_factory=time.monotonic_ns)

    @property
    def pid(self) -> int:
        return self.popen.pid

    def command(self) -> str:
        return shlex.join(self.argv)

    def describe_failure(self, what: str | None = None) -> str:
        lines = tail(self.log)
        last = "\n".join("    " + l for l in lines) if lines else "    (no output)"
        return (
            f"{what or f'{self.kind} {self.name} failed'}\n  command: {self.command()}\n  {exit_text(self.popen.returncode)}; last output ({self.log}):\n{last}"
        )


def child_env(run_id: str, extra: dict[str, str] | None = None) -> dict[str, str]:
    env = dict(os.environ)
    env["LOOPSCOPE_RUN"] = run_id
    env["LOOPSCOPE_PDEATHSIG"] = str(os.getpid())  # the children of this process die with it
    env.update(extra or {})
    return env


# The CPUs this process could use when it started. Its children get them
# back even when the process has been moved off some since: a monitor moves
# its agents off the probes' CPUs (their polars threads had run there), and
# the probes those agents start must still reach those CPUs.
START_CPUS: set[int] = os.sched_getaffinity(0) if hasattr(os, "sched_getaffinity") else set()


@contextmanager
def start_cpus() -> Iterator[None]:
    """The calling thread on ``START_CPUS`` while it forks (a child inherits its mask)."""
    try:
        now = os.sched_getaffinity(0)
    except (OSError, AttributeError):
        yield
        return
    widen = bool(START_CPUS) and now != START_CPUS
    if widen:
        try:
            os.sched_setaffinity(0, START_CPUS)
        except OSError:
            widen = False
    try:
        yield
    finally:
        if widen:
            os.sched_setaffinity(0, now)


def spawn(name: str, kind: str, argv: list[str], log: Path, group: Path | None, env: dict[str, str], stdout_pipe: bool = False) -> Child:
    log.parent.mkdir(parents=True, exist_ok=True)
    full = RunGroup.wrap(group, argv) if group is not None else argv
    with open(log, "ab") as logf, start_cpus():
        p = subprocess.Popen(full, stdin=subprocess.DEVNULL, stdout=subprocess.PIPE if stdout_pipe else logf, stderr=logf, env=env, close_fds=True)
    return Child(name, kind, argv, p, log, group)


def stop(children: list[Child], grace: float = 3.0) -> None:
    """SIGTERM, wait up to ``grace`` seconds, then SIGKILL what is left."""
    for c in children:
        if c.popen.poll() is None:
            try:
                c.popen.send_signal(signal.SIGTERM)
            except ProcessLookupError:
                pass
    end = time.monotonic() + grace
    for c in children:
        left = max(0.0, end - time.monotonic())
        try:
            c.popen.wait(timeout=left)
        except subprocess.TimeoutExpired:
            c.popen.kill()
            c.popen.wait()


def terminate_pid(pid: int, grace: float = 1.5) -> None:
    """SIGTERM ``pid``, then SIGKILL if it is still there after ``grace`` s."""
    try:
        os.kill(pid, signal.SIGTERM)
    except ProcessLookupError:
        return
    end = time.monotonic() + grace
    while time.monotonic() < end:
        if not Path(f"/proc/{pid}").exists():
            return
        time.sleep(0.05)
    try:
        os.kill(pid, signal.SIGKILL)
    except ProcessLookupError:
        pass


def pids_of_run(run_id: str) -> list[int]:
    """Processes whose environment carries ``LOOPSCOPE_RUN=run_id``."""
    needle = f"LOOPSCOPE_RUN={run_id}".encode()
    out = []
    me = os.getpid()
    for d in Path("/proc").iterdir():
        if not d.name.isdigit() or int(d.name) == me:
            continue
        try:
            env = (d / "environ").read_bytes()
        except OSError:
            continue
        if needle in env.split(b"\0"):
            out.append(int(d.name))
    return out


def process_start_time(pid: int) -> int | None:
    """The kernel's start time of ``pid`` (clock ticks since boot), to tell a
    live process from a later one that reused its pid."""
    try:
        stat = Path(f"/proc/{pid}/stat").read_text()
    except OSError:
        return None
    return int(stat.rsplit(")", 1)[1].split()[19])


def alive(pid: int, start_time: int | None) -> bool:
    st = process_start_time(pid)
    return st is not None and (start_time is None or st == start_time)


def threads_of(group: Path | None, pids: list[int]) -> list[int]:
    """The thread ids of a load: its cgroup's, and its processes' own (without a cgroup, or beside it)."""
    out: set[int] = set()
    if group is not None:
        try:
            out |= {int(x) for x in (Path(group) / "cgroup.threads").read_text().split()}
        except (OSError, ValueError):
            pass
    for pid in pids:
        try:
            out |= {int(t) for t in os.listdir(f"/proc/{pid}/task")}
        except OSError:
            pass
    return sorted(out)
