"""What the agent starts and reads back: the command line of a probe (as
its kind says) and of each worker of a load, a probe's environment, the
first line a probe prints and the JSON a load's log ends with, a process's
CPU time, and a phase's tunings on a load's threads. The agent's request
handling (``agent.server``) is about order and clean-up; this is about the
processes themselves.
"""

from __future__ import annotations

import json
import os
import sys
import time
from pathlib import Path
from typing import Any

from loopscope.errors import RunError
from loopscope.host import procs
from loopscope.units import parse_rate


class Failure(RunError):
    """A component failed; ``detail`` says which, with command and output."""

    def __init__(self, component: str, detail: str) -> None:
        super().__init__(detail, component=component)
        self.detail = detail


def probe_argv(p: dict[str, object], duration_ns: int, trace: Path, scratch: Path, calibrate: bool = False) -> list[str]:
    """The command line that runs probe ``p`` (a dumped probe spec, or a
    helper's: a pipeline stage, an echo server, a clock-sync probe), as its
    kind says (``loopscope.kinds``)."""
    from loopscope.kinds import KINDS  # at the first probe, not at start: a fleet's agents start side by side

    argv = KINDS.argv(p, duration_ns, trace, scratch, calibrate)
    if argv is None:
        raise Failure(f"probe {p.get('name')}", f"unknown probe kind {p['kind']!r}")
    return argv


def load_argvs(ld: dict[str, Any], scratch: Path) -> list[list[str]]:
    """One command line per worker process of load ``ld`` (a dumped load spec)."""
    level = ld["level"]
    percent = isinstance(level, str) and level.endswith("%")
    n = len(os.sched_getaffinity(0)) if percent else int(level)
    if ld["kind"] == "command":
        return [list(ld["command"])] * n
    if ld["kind"] == "sink":
        # The receiving end of a network load sent to this host.
        # Its trace goes to the scratch directory (removed with the run's
        # scratch), never to the runs/ folder of the directory it was started in.
        a = [sys.executable, "-m", "loopscope.cli", "probe", "recv", "--bind", ld["bind"], "--trace", str(scratch / f"{ld['name']}.lstrace")]
        return [a + (["--tcp"] if ld["protocol"] == "tcp" else ["--no-packet-records", "--rcvbuf-mib", "8"])]
    a = [sys.executable, "-m", "loopscope.loads.worker", ld["kind"]]
    if percent:
        a += ["--duty", str(float(level[:-1]) / 100)]
    if ld["kind"] in ("io", "mix"):
        a += ["--dir", ld.get("dir") or str(scratch / ld["name"])]
    if ld["kind"] == "io" and ld.get("fsync"):
        a.append("--fsync")
    if ld["kind"] == "memory":
        a += ["--count", str(ld["count"])]
    if ld["kind"] == "net":
        a += ["--protocol", ld["protocol"], "--size", str(ld["size"])]
        if ld["rate"] != "unlimited":
            v, unit = parse_rate(ld["rate"])
            a += ["--rate-bps", str(v if unit == "bps" else v * ld["size"] * 8)]
        if ld.get("dest"):
            a += ["--dest", ld["dest"]]
    return [a] * n


def probe_env(run_id: str, kind: str, session: dict[str, str]) -> dict[str, str]:
    """A probe process's environment: the session's settings (``Hello.probe_env``),
    and its kind's name for itself (clock-sync probes: ls-sync), else
    ``ls-probe``, the name of a probe's own main thread (start-up, waiting,
    writing its results; its measuring threads name themselves). Attribution
    calls it ``lab: probe``."""
    from loopscope.kinds import KINDS

    return procs.child_env(run_id, {**session, "LOOPSCOPE_COMM": KINDS.comms.get(kind) or "ls-probe"})


def read_line(child: procs.Child, timeout: float) -> str:
    """The first line a probe prints ('' if it exits or stays silent)."""
    import select

    assert child.popen.stdout is not None
    fd = child.popen.stdout.fileno()
    end = time.monotonic() + timeout
    buf = b""
    while not buf.endswith(b"\n"):
        r, _, _ = select.select([fd], [], [], max(0.0, end - time.monotonic()))
        if not r:
            break
        b = os.read(fd, 1)
        if not b:
            child.popen.wait()
            break
        buf += b
    return buf.decode(errors="replace").strip()


def proc_cpu_s(pid: int) -> float:
    try:
        f = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()
        return (int(f[11]) + int(f[12])) / os.sysconf("SC_CLK_TCK")
    except (OSError, IndexError, ValueError):
        return 0.0


def last_json(log: Path) -> dict[str, object] | None:
    for line in reversed(procs.tail(log, 50)):
        if line.startswith("{"):
            try:
                got = json.loads(line)
            except json.JSONDecodeError:
                return None
            return got if isinstance(got, dict) else None
    return None


POLICIES = {"fifo": os.SCHED_FIFO, "rr": os.SCHED_RR, "other": os.SCHED_OTHER}


def tune_threads(ld: dict[str, Any], tids: list[int]) -> dict[str, Any]:
    """A phase's placement and scheduling tunings on every thread of a load
    (after its start, so they override what the program set for itself)."""
    done, failed = 0, []
    for tid in tids:
        try:
            if ld.get("cpus"):
                os.sched_setaffinity(tid, ld["cpus"])
            if ld.get("sched"):
                pol = ld["sched"]["policy"]
                os.sched_setscheduler(tid, POLICIES[pol], os.sched_param(ld["sched"].get("priority") or 0 if pol != "other" else 0))
            done += 1
        except ProcessLookupError:
            pass  # the thread ended meanwhile
        except OSError as e:
            failed.append(f"thread {tid}: {e.strerror}")
    if failed:
        raise Failure(f"load {ld['name']}", f"the phase's tunings could not be applied to load {ld['name']}: {'; '.join(failed[:3])}")
    return {"threads": done, "cpus": ld.get("cpus"), "sched": ld.get("sched")}
