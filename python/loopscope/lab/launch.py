"""Agents started by the launchers fleets already run.

An ``exec`` host is reached through a command that runs a process on it
with its standard input and output: ``srun --nodelist=n1 --ntasks=1``,
``kubectl exec -i -n rt POD --``, ``docker exec -i NAME``, ``ip netns exec
NS``, ``ssh -T HOST``. loopscope appends the agent's command to it and
speaks the agent's JSON lines over the launcher's stdio, exactly as with a
local agent; the launcher is a child of this controller (in a session of
its own, carrying the run's id), so stopping it, or its dying, ends the
channel, and the agent, reading end-of-input, stops everything it started.

The agent's command is a small POSIX shell line, the one thing assumed on
the host besides Python: it picks the interpreter (``python:`` when given;
else the one ``loopscope hosts install`` put under ``install_dir``, one
directory per version; else this controller's own interpreter's path, right
where the host shares this machine's or a cluster's file system) and puts
the run's id in the agent's environment, which no launcher is trusted to
pass on. ssh hosts run the same line.

Nothing else crosses: the agent's files come home through its own channel
(``host/packing.py``), so neither side needs scp, a shared file system or
``kubectl cp``. ``preflight`` runs each launcher once, all in parallel,
before anything starts: a launcher that is not installed, that fails, or
whose output is not loopscope's answer stops the run with exit 2, naming
the host, the command and its last lines of output.
"""

from __future__ import annotations

import shlex
import shutil
import subprocess
import sys
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path
from typing import TYPE_CHECKING, Any

from loopscope.errors import InputError
from loopscope.host import procs
import loopscope
from loopscope import protocol as P
from loopscope.host.packing import decode, unpack

if TYPE_CHECKING:
    from loopscope.spec.models import Host

#: what the preflight's interpreter prints first on its answer line
MARK = "loopscope-here"


def version() -> str:

    return str(loopscope.__version__)


def _dir(path: str) -> str:
    """``path`` for the host's shell: a leading ``~/`` is the host's home."""
    if path == "~":
        return '"$HOME"'
    if path.startswith("~/"):
        return '"$HOME"/' + shlex.quote(path[2:])
    return shlex.quote(path)


def pick_python(host: Host) -> str:
    """Shell that sets ``$p`` to the interpreter the host's agent runs with."""
    if host.python:
        return f"p={shlex.quote(host.python)}"
    d = f"{_dir(host.install_dir.rstrip('/') or '/')}/{shlex.quote(version())}/bin/python"
    return f'p={d}; [ -x "$p" ] || p={shlex.quote(sys.executable)}'


def installed_python(host: Host) -> str:
    """Shell: the interpreter ``hosts install`` puts on the host (``$p``)."""
    return f"p={_dir(host.install_dir.rstrip('/') or '/')}/{shlex.quote(version())}/bin/python"


def agent_line(host: Host, run_id: str) -> str:
    """The shell line that starts the host's agent."""
    return f'{pick_python(host)}; LOOPSCOPE_RUN={shlex.quote(run_id)} exec "$p" -m loopscope.agent'


def check_line(host: Host) -> str:
    """The shell line whose last output line says which loopscope the host would run."""
    probe = f"import sys, loopscope, loopscope._native; print({MARK!r}, loopscope.__version__, sys.executable)"
    return f'{pick_python(host)}; exec "$p" -c {shlex.quote(probe)}'


def launcher(host: Host) -> list[str]:
    """An exec host's launcher (its entry was checked to have one)."""
    if not host.launcher:
        raise InputError(f"exec host {host.name!r} needs a launcher")
    return host.launcher


def argv(host: Host | list[str], line: str) -> list[str]:
    """The launcher's command (a host's, or one given) with a shell line appended."""
    return [*(host if isinstance(host, list) else launcher(host)), "sh", "-c", line]


def launcher_env(run_id: str | None) -> dict[str, str]:
    """The launcher's environment: the run's id (so ``cleanup`` finds it), no
    parent-death pid (the agent's parent on the host is the launcher's daemon
    there, not this controller)."""
    env = procs.child_env(run_id or "preflight")
    env.pop("LOOPSCOPE_PDEATHSIG", None)
    return env


def tail_text(text: str, n: int = 8) -> str:
    lines = [l for l in text.splitlines() if l.strip()][-n:]
    return "\n".join("    " + l for l in lines) or "    (no output)"


def check_answer(name: str, launcher: str, rc: int | None, out: str) -> str | None:
    """What is wrong with a host, from its launcher's run of ``check_line``
    (``launcher``: its command as the user wrote it)."""
    lines = [l for l in out.splitlines() if l.strip()]
    last = lines[-1] if lines else ""
    head = f"host {name}: the launcher `{launcher}`"
    if rc is None:
        return f"{head} did not answer within its time; last output:\n{tail_text(out)}"
    if rc != 0 or not last.startswith(MARK + " "):
        what = "failed" if rc != 0 else "printed something that is not loopscope" if lines else "ended without running loopscope"
        hint = ""
        if "No module named 'loopscope'" in out or rc in (126, 127):
            hint = "\n  loopscope is not on that host: `loopscope hosts install EXPERIMENT` puts this controller's there, or set `python:`"
        return f"{head} {what} ({procs.exit_text(rc)}); last output:\n{tail_text(out)}{hint}"
    _, got, exe = (last.split(" ", 2) + ["", ""])[:3]
    if got != version():
        return f"host {name}: its loopscope is {got} ({exe}) and this controller's is {version()}: `loopscope hosts install EXPERIMENT` puts this one there"
    return None


def preflight(hosts: list[Host], timeout: float = 60.0) -> dict[str, str]:
    """Each exec host's launcher run once, in parallel: what is wrong, by host."""
    problems: dict[str, str] = {}
    todo = []
    for h in hosts:
        exe = launcher(h)[0]
        if shutil.which(exe) is None:
            problems[h.name] = f"host {h.name}: its launcher {exe!r} is not installed or not on PATH (launcher: {shlex.join(launcher(h))})"
        else:
            todo.append(h)

    def one(h: Host) -> tuple[str, str | None]:
        cmd = argv(h, check_line(h))
        try:
            r = subprocess.run(cmd, stdin=subprocess.DEVNULL, capture_output=True, timeout=timeout, env=launcher_env(None), start_new_session=True)
            return h.name, check_answer(h.name, shlex.join(launcher(h)), r.returncode, (r.stdout + r.stderr).decode(errors="replace"))
        except subprocess.TimeoutExpired as e:
            out = ((e.stdout or b"") + (e.stderr or b"")).decode(errors="replace")
            return h.name, check_answer(h.name, shlex.join(launcher(h)), None, out)
        except OSError as e:
            return h.name, f"host {h.name}: its launcher {shlex.join(launcher(h))} could not start: {e.strerror}"

    if todo:
        with ThreadPoolExecutor(max_workers=min(32, len(todo))) as pool:
            for name, why in pool.map(one, todo):
                if why:
                    problems[name] = why
    return problems


def fetch(agent: Any, base: str, into: Path, remove: bool = True) -> int:
    """Bring the host's run directory home through its agent: the number of files."""

    packed = agent.ask(P.PackFiles(path=base), timeout=600)
    chunks: list[bytes] = []
    offset = 0
    while True:
        got = agent.ask(P.ReadPacked(offset=offset), timeout=120)
        b = decode(got.data)
        chunks.append(b)
        offset += len(b)
        if got.eof or not b:
            break
    n = unpack(chunks, packed.sha256, into)
    agent.ask(P.DropFiles(remove=remove), timeout=60)
    return n
