"""Application calibration: a program's CPU time and the system calls it is made of.

Carlinet et al. 2000 modelled an application as system calls (states) with
transition probabilities and the time spent in the execution environment
between calls, so its CPU need can be carried from one node to another.
``calibrate`` runs the program ``runs`` times untraced and takes each run's
user and system CPU time from ``wait4`` (the program and the children it
waited for), then a few more runs with the raw_syscalls tracepoints on
(a tracefs instance of its own, filtered to the program's pid and every
thread and child it forks) for its structure: per call its count per run, its duration (mean, p50, p99), the
transition probabilities from each call to the next on the same thread,
and the time between calls. Traced runs are not timed: tracing costs CPU.

The app model (JSON, ``FORMAT``/``VERSION``) keeps every run's user and
system time, so a prediction is a distribution, not a mean; and the node
model it was calibrated against (``node``), so ``model predict`` knows where
it comes from. A run that fails, runs that use too little CPU to measure
(``MIN_CPU_MS``), or a trace that lost events are clear errors or stated in
the model (``trace.lost_events``), never a silently incomplete model; so
is a program that leaves processes running when it exits (a daemon, a
child it did not wait for): their CPU time would be missing from wait4's.
"""

from __future__ import annotations

import os
import re
import shlex
import subprocess
import tempfile
import time
from collections import Counter, defaultdict
from pathlib import Path
from typing import Any, Callable

from typing_extensions import TypedDict

import numpy as np
from pydantic import BaseModel, ConfigDict, Field

from loopscope.errors import InputError, RunError
from loopscope.model.node import NodeModel
from loopscope.kernel.capture import tracefs

FORMAT = "loopscope-app-model"
VERSION = 1
MIN_CPU_MS = 20.0


class _Part(BaseModel):
    # a newer minor version's fields are kept as they are
    model_config = ConfigDict(extra="allow")


class Summary(_Part):
    """A distribution of CPU times per run (ns)."""

    mean_ns: float
    var_ns2: float = 0.0
    p95_ns: float
    p99_ns: float
    min_ns: float
    max_ns: float


class CpuTimes(_Part):
    total: Summary
    user: Summary
    system: Summary


class Runs(_Part):
    """Each timed run's CPU and wall time (wait4), ns."""

    user_ns: list[float]
    sys_ns: list[float]
    wall_ns: list[float] = Field(default_factory=list)


class CallState(_Part):
    """One kind of system call of the program: how often per run, how long on CPU, what follows it, what it moved."""

    per_run: float
    dur_mean_ns: float | None = None
    dur_p50_ns: float | None = None
    dur_p99_ns: float | None = None
    dur_trim_mean_ns: float | None = None
    next: dict[str, float] = Field(default_factory=dict)
    bytes_mean: float | None = None
    #: [mean bytes, fraction of calls] per power-of-two size class
    bytes_classes: list[list[float]] | None = None


class CallStructure(_Part):
    """The program's system calls as the traced runs saw them (none when not traced: ``note`` says so)."""

    runs: int = 0
    states: dict[str, CallState] = Field(default_factory=dict)
    note: str | None = None
    calls_per_run: float | None = None
    threads_per_run: float | None = None
    gap_mean_ns: float | None = None
    gap_p50_ns: float | None = None
    gap_p99_ns: float | None = None
    tool: str | None = None
    lost_events: int | None = None
    names_known: bool | None = None
    calls_switched_out: float | None = None


class NodeRef(_Part):
    """The node model (and its condition) the app was calibrated against."""

    path: str | None = None
    created: str | None = None
    condition: str | None = None


class AppModel(_Part):
    """What an app model file holds (``FORMAT``, ``VERSION``)."""

    format: str = FORMAT
    version: int = VERSION
    created: str | None = None
    loopscope: dict[str, str | int] = Field(default_factory=dict)
    command: list[str] = Field(default_factory=list)
    environment: str
    node: NodeRef = Field(default_factory=NodeRef)
    cpus: list[int] | None = None
    runs: Runs
    cpu: CpuTimes | None = None
    syscalls: CallStructure = Field(default_factory=CallStructure)


def _session_left(sid: int) -> list[int]:
    """Processes still in session ``sid`` (what a program left behind)."""
    out = []
    for d in os.listdir("/proc"):
        if not d.isdigit():
            continue
        try:
            with open(f"/proc/{d}/stat") as f:
                st = f.read()
        except OSError:
            continue
        fields = st[st.rfind(")") + 2 :].split()
        if len(fields) > 3 and int(fields[3]) == sid:
            out.append(int(d))
    return out


def _run_once(cmd: list[str], cwd: str | None, env: dict[str, str] | None, cpus: list[int] | None = None) -> RunCpu:
    t0 = time.monotonic_ns()
    # stderr to a file, not a pipe: a child left running would hold a pipe open
    with tempfile.TemporaryFile() as errf:
        try:
            p = subprocess.Popen(
                cmd,
                cwd=cwd,
                env=env,
                stdin=subprocess.DEVNULL,
                stdout=subprocess.DEVNULL,
                stderr=errf,
                start_new_session=True,
                preexec_fn=(lambda: os.sched_setaffinity(0, cpus)) if cpus else None,
            )
        except OSError as e:
            raise InputError(f"cannot start {cmd[0]!r}: {e.strerror}") from None
        _, status, ru = os.wait4(p.pid, 0)
        errf.seek(0)
        err = errf.read()
    p.returncode = os.waitstatus_to_exitcode(status)
    wall = time.monotonic_ns() - t0
    left = _session_left(p.pid)
    if left:
        import signal

        for q in left:
            try:
                os.kill(q, signal.SIGKILL)
            except ProcessLookupError:
                pass
        raise InputError(
            f"{shlex.join(cmd)} left {len(left)} process(es) running after it exited (pids {', '.join(map(str, left[:5]))}, now killed): "
            "their CPU time is not in what wait4 reports, so the model would miss it; calibrate a program that waits for its children"
        )
    if p.returncode != 0:
        tail = err.decode(errors="replace").strip()[-400:]
        raise RunError(f"{shlex.join(cmd)} failed with exit code {p.returncode}" + (f": {tail}" if tail else ""))
    return {"user_ns": int(ru.ru_utime * 1e9), "sys_ns": int(ru.ru_stime * 1e9), "wall_ns": wall}


class RunCpu(TypedDict):
    """One run of the program: its user and system CPU time and its wall time (ns)."""

    user_ns: int
    sys_ns: int
    wall_ns: int


def run_many(
    cmd: list[str],
    runs: int,
    cwd: str | None = None,
    env: dict[str, str] | None = None,
    say: Callable[[str], None] = lambda s: None,
    cpus: list[int] | None = None,
    min_cpu_ms: float = MIN_CPU_MS,
) -> dict[str, list[int]]:
    out: dict[str, list[int]] = {"user_ns": [], "sys_ns": [], "wall_ns": []}
    for i in range(runs):
        try:
            r = _run_once(cmd, cwd, env, cpus)
        except RunError as e:
            raise RunError(f"run {i + 1} of {runs}: {e}") from None
        out["user_ns"].append(r["user_ns"])
        out["sys_ns"].append(r["sys_ns"])
        out["wall_ns"].append(r["wall_ns"])
    cpu = np.asarray(out["user_ns"]) + np.asarray(out["sys_ns"])
    if cpu.mean() / 1e6 < min_cpu_ms:
        raise InputError(
            f"{shlex.join(cmd)} uses {cpu.mean() / 1e6:.1f} ms of CPU per run: too little to measure (CPU time is kept in ticks of a few ms); "
            f"give it at least {min_cpu_ms:g} ms of work per run"
        )
    return out


def structure(parsed: list[dict[str, Any]]) -> dict[str, Any]:
    """Traced runs -> states, transitions, per-state durations and gaps."""
    counts: Counter[str] = Counter()
    trans: dict[str, Counter[str]] = defaultdict(Counter)
    durs: dict[str, list[float]] = defaultdict(list)
    sizes: dict[str, list[int]] = defaultdict(list)
    gaps: list[float] = []
    threads = 0
    for p in parsed:
        for calls in p["threads"].values():
            threads += 1
            prev = None
            prev_end = None
            for name, t, d, *nb in calls:
                counts[name] += 1
                durs[name].append(d * 1e6)
                if nb and nb[0] is not None:
                    sizes[name].append(nb[0])
                if prev is not None:
                    trans[prev][name] += 1
                if prev_end is not None:
                    gaps.append(max(0.0, (t - prev_end) * 1e6))
                prev, prev_end = name, t + d
            if prev is not None:
                trans[prev]["(end)"] += 1
    n = max(1, len(parsed))
    states = {}
    for name, c in counts.most_common():
        d = np.asarray(durs[name])
        tot = sum(trans[name].values())
        trim = d[d <= np.percentile(d, 90)]
        states[name] = {
            "per_run": c / n,
            "dur_mean_ns": float(d.mean()),
            "dur_p50_ns": float(np.percentile(d, 50)),
            "dur_p99_ns": float(np.percentile(d, 99)),
            "dur_trim_mean_ns": float(trim.mean()) if len(trim) else float(d.mean()),
            "next": {k: v / tot for k, v in trans[name].most_common()} if tot else {},
        }
        if sizes[name]:
            states[name].update(size_classes(np.asarray(sizes[name], dtype=float)))
    g = np.asarray(gaps) if gaps else np.zeros(1)
    return {
        "states": states,
        "calls_per_run": sum(counts.values()) / n,
        "threads_per_run": threads / n,
        "gap_mean_ns": float(g.mean()),
        "gap_p50_ns": float(np.percentile(g, 50)),
        "gap_p99_ns": float(np.percentile(g, 99)),
    }


def size_classes(b: np.ndarray) -> dict[str, object]:
    """Bytes moved per call: the mean, and the calls in power-of-two classes
    (each: its mean size and the fraction of calls), which is what a node's
    cost-by-size curve is read at."""
    cls = np.floor(np.log2(np.maximum(b, 1.0))).astype(int)
    out = []
    for c in np.unique(cls):
        sel = b[cls == c]
        out.append([float(sel.mean()), len(sel) / len(b)])
    return {"bytes_mean": float(b.mean()), "bytes_classes": out}


def syscall_names() -> dict[int, str]:
    """This architecture's system-call numbers → names, from the kernel's
    uapi header (linux-libc-dev)."""
    arch = os.uname().machine
    cands = [
        f"/usr/include/{arch}-linux-gnu/asm/unistd_64.h",
        "/usr/include/asm/unistd_64.h",
        f"/usr/include/{arch}-linux-gnu/asm/unistd.h",
        "/usr/include/asm-generic/unistd.h",
    ]
    for c in cands:
        try:
            with open(c) as f:
                text = f.read()
        except OSError:
            continue
        names = {int(n): name for name, n in re.findall(r"#define\s+__NR_(\w+)\s+(\d+)\b", text)}
        if names:
            return names
    return {}


_EV = re.compile(
    r"^\s*.+-(\d+)\s+\[\d+\]\s+\S+\s+([0-9]+\.[0-9]+): (?:sys_(enter|exit): NR (\d+)(?: = (-?\d+))?|sched_switch: .*prev_pid=(\d+) .*next_pid=(\d+))"
)

# Calls whose return value is the number of bytes they moved (their cost grows with it).
DATA_CALLS = frozenset(
    {
        "read",
        "pread64",
        "readv",
        "preadv",
        "preadv2",
        "write",
        "pwrite64",
        "writev",
        "pwritev",
        "pwritev2",
        "sendto",
        "sendmsg",
        "send",
        "recvfrom",
        "recvmsg",
        "recv",
    }
)


def parse_ftrace(text: str, names: dict[int, str], sched: str = "") -> dict[str, object]:
    """raw_syscalls lines of a tracefs instance (and, from ``sched``, every
    sched_switch of the machine) -> per thread, its calls in order (name,
    start ms, on-CPU duration ms, bytes moved or None): the time a call
    spent switched out (it slept, or was preempted) is taken off, so what
    is left is its CPU time; the bytes are the return value of the calls
    that move data (``DATA_CALLS``), 0 when they failed.
    Switches come from an instance without the pid filter: the filter would
    keep a thread's switch out (it runs then) and drop its switch back in."""
    events: list[tuple[float, int, Any]] = []
    for order, chunk in enumerate((sched, text)):
        for line in chunk.splitlines():
            m = _EV.match(line)
            if m:
                events.append((float(m.group(2)) * 1e3, order, m))
    events.sort(key=lambda e: (e[0], e[1]))
    threads: dict[int, list[tuple[str, float, float, int | None]]] = defaultdict(list)
    open_: dict[int, list[float]] = {}  # tid -> [nr, start, off-CPU so far]
    out_at: dict[int, float] = {}
    switched = 0
    for t, _, m in events:
        if m.group(6) is not None:
            prev, nxt = int(m.group(6)), int(m.group(7))
            if prev in open_:
                out_at[prev] = t
            if nxt in out_at:
                open_[nxt][2] += t - out_at.pop(nxt)
                switched += 1
            continue
        tid, kind, nr = int(m.group(1)), m.group(3), int(m.group(4))
        if kind == "enter":
            open_[tid] = [nr, t, 0.0]
            out_at.pop(tid, None)
        elif tid in open_ and open_[tid][0] == nr:
            _, t0, off = open_.pop(tid)
            if tid in out_at:  # its switch back in was not seen: count to the exit as off-CPU
                off += t - out_at.pop(tid)
            name = names.get(nr, f"nr{nr}")
            nbytes = max(0, int(m.group(5))) if name in DATA_CALLS and m.group(5) is not None else None
            threads[tid].append((name, t0, max(0.0, t - t0 - off), nbytes))
    return {"threads": threads, "comms": [], "lost": 0, "calls_switched_out": switched}


def _tracefs_run(cmd: list[str], cwd: str | None, env: dict[str, str] | None, cpus: list[int] | None, names: dict[int, str]) -> dict[str, Any]:
    """One run with the raw_syscalls tracepoints on, in a tracefs instance of
    its own, filtered to the program's pid and every process it forks."""

    root = tracefs()
    if root is None or not (root / "instances").is_dir():
        raise InputError(
            "tracefs is not available (it needs root): the system-call structure comes from its raw_syscalls tracepoints; run as root or pass --traced-runs 0"
        )
    inst = root / "instances" / f"loopscope-app-{os.getpid()}"
    sw = root / "instances" / f"loopscope-app-{os.getpid()}-sched"
    made: list[Path] = []
    try:
        for d in (inst, sw):
            try:
                d.mkdir()
            except OSError as e:
                raise InputError(f"cannot create the tracefs instance {d}: {e.strerror}; run as root or pass --traced-runs 0") from None
            made.append(d)
            (d / "buffer_size_kb").write_text("32768")
            (d / "trace_clock").write_text("mono")
        (inst / "options" / "event-fork").write_text("1")
        for ev in ("raw_syscalls/sys_enter", "raw_syscalls/sys_exit"):
            (inst / "events" / ev / "enable").write_text("1")
        (sw / "events" / "sched" / "sched_switch" / "enable").write_text("1")
        r, w = os.pipe()
        pid = os.fork()
        if pid == 0:  # the program: wait until its pid is being traced, then become it
            try:
                os.close(w)
                os.read(r, 1)
                if cpus:
                    os.sched_setaffinity(0, cpus)
                if cwd:
                    os.chdir(cwd)
                devnull = os.open(os.devnull, os.O_RDWR)
                for fd in (0, 1, 2):
                    os.dup2(devnull, fd)
                os.execvpe(cmd[0], cmd, env if env is not None else dict(os.environ))
            finally:
                os._exit(127)
        os.close(r)
        (inst / "set_event_pid").write_text(str(pid))
        (sw / "tracing_on").write_text("1")
        (inst / "tracing_on").write_text("1")
        os.write(w, b"x")
        os.close(w)
        _, status, _ = os.wait4(pid, 0)
        (inst / "tracing_on").write_text("0")
        (sw / "tracing_on").write_text("0")
        code = os.waitstatus_to_exitcode(status)
        if code != 0:
            raise RunError(f"traced run: {shlex.join(cmd)} failed with exit code {code}")
        lost = 0
        for d in made:
            for cpu in (d / "per_cpu").iterdir():
                m = re.search(r"overrun:\s*(\d+)", (cpu / "stats").read_text())
                lost += int(m.group(1)) if m else 0
        out = parse_ftrace((inst / "trace").read_text(errors="replace"), names, (sw / "trace").read_text(errors="replace"))
        out["lost"] = lost
        return out
    finally:
        for d in made:
            try:
                (d / "tracing_on").write_text("0")
            except OSError:
                pass
            try:
                d.rmdir()
            except OSError:
                pass


def trace_runs(cmd: list[str], runs: int, cwd: str | None, env: dict[str, str] | None, cpus: list[int] | None = None) -> dict[str, object]:
    if runs == 0:
        return {
            "runs": 0,
            "states": {},
            "note": "not traced (--traced-runs 0): the system-call mix is unknown, so system time is scaled by all the node's calls alike",
        }
    names = syscall_names()
    parsed = [_tracefs_run(cmd, cwd, env, cpus, names) for _ in range(runs)]
    st = structure(parsed)
    lost = sum(p["lost"] for p in parsed)
    st.update(
        {
            "runs": runs,
            "tool": "tracefs raw_syscalls sys_enter/sys_exit and sched_switch, filtered to the program's pid and its forks (event-fork), "
            "CLOCK_MONOTONIC, µs stamps; call durations are on-CPU (switched-out time taken off)",
            "lost_events": lost,
            "names_known": bool(names),
            "calls_switched_out": sum(p.get("calls_switched_out", 0) for p in parsed) / runs,
        }
    )
    if not st["states"]:
        raise RunError(f"the raw_syscalls tracepoints recorded no system call of {shlex.join(cmd)}: the model would be empty")
    return st


def _summary(x: np.ndarray) -> dict[str, float]:
    return {
        "mean_ns": float(x.mean()),
        "var_ns2": float(x.var(ddof=1)) if len(x) > 1 else 0.0,
        "p95_ns": float(np.percentile(x, 95)),
        "p99_ns": float(np.percentile(x, 99)),
        "min_ns": float(x.min()),
        "max_ns": float(x.max()),
    }


def environment_of(cmd: list[str]) -> str:
    """Which execution environment the program's user time is spent in."""
    exe = os.path.basename(cmd[0])
    return "cpython" if re.match(r"^python[0-9.]*$", exe) else "compiled"


def calibrate(
    cmd: list[str],
    runs: int,
    traced_runs: int,
    node: NodeModel | None,
    node_path: str | None,
    condition: str,
    cwd: str | None = None,
    env_kind: str | None = None,
    say: Callable[[str], None] = lambda s: None,
    cpus: list[int] | None = None,
) -> AppModel:
    from loopscope.probes.common import envelope

    if not cmd:
        raise InputError("calibrate app: give the program after --, e.g. loopscope calibrate app -- python3 work.py")
    if runs < 2:
        raise InputError(f"--runs: at least 2 [got {runs}]")
    say(f"running {shlex.join(cmd)} {runs} times")
    r = run_many(cmd, runs, cwd, cpus=cpus)
    say(f"tracing {traced_runs} more runs")
    st = trace_runs(cmd, traced_runs, cwd, None, cpus)
    u, s = np.asarray(r["user_ns"], dtype=float), np.asarray(r["sys_ns"], dtype=float)
    return AppModel.model_validate(
        {
            "format": FORMAT,
            "version": VERSION,
            "created": time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime()),
            "loopscope": envelope("app-model"),
            "command": cmd,
            "environment": env_kind or environment_of(cmd),
            "node": {"path": os.path.abspath(node_path) if node_path else None, "created": node.created if node else None, "condition": condition},
            "cpus": cpus,
            "runs": r,
            "cpu": {"total": _summary(u + s), "user": _summary(u), "system": _summary(s)},
            "syscalls": st,
        }
    )


def read(path: str) -> AppModel:
    """An app model, its format and version checked, each part against its model."""
    from loopscope.model import read_model

    return read_model(path, AppModel, "app model", FORMAT, VERSION, "loopscope calibrate app")
