"""The controller: ``loopscope run SPEC``.

Preflight first (the spec, the results directory, the commands loads
need, privileges), then one agent per host (here: one, on this machine),
then the plan: for each repetition and phase, start the phase's loads, let
them warm up, run every probe in turn, stop the loads. Everything a run
produces lands in ``runs/<time>-<name>/`` with the spec, the provenance and
an index of files; the report is built from it afterwards.

However the run ends, the same ``finally`` runs: the agent is told to shut
down (or terminated), the run's cgroup is removed as a backstop, processes
still carrying the run's id are killed, ``run.json`` records how it ended,
and the state file that ``loopscope cleanup`` would use disappears. Ctrl-C
only reaches the controller (the agent runs in a session of its own), so it
is the controller that decides the order of shutdown.
"""

from __future__ import annotations

import datetime as _dt
import hashlib
import json
import os
import shutil
import signal
import subprocess
import sys
import time
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Callable

from loopscope.errors import InputError, RunError
from loopscope.lab import procs, state
from loopscope.lab.cgroup import RunGroup, remove_root_if_empty
from loopscope.spec import Experiment, load
from loopscope.spec.plan import phase_runs, probe_seconds

Say = Callable[[str], None]
Tick = Callable[[int, int, str], None]


class Interrupted(Exception):
    pass


class AgentFailure(RunError):
    """A component on a host failed, or the agent itself died."""


@dataclass
class Outcome:
    run_dir: Path
    status: str
    error: str | None = None
    notes: list[str] = field(default_factory=list)


# ---- the agent connection -------------------------------------------------------------


class AgentClient:
    """One agent process and its JSON-lines channel."""

    def __init__(self, host: str, run_id: str, log: Path) -> None:
        self.host = host
        self.log = log
        self.spawn_ns = time.monotonic_ns()
        env = procs.child_env(run_id)
        env.pop("LOOPSCOPE_PDEATHSIG", None)
        with open(log, "ab") as lf:
            self.p = subprocess.Popen(
                [sys.executable, "-m", "loopscope.agent"],
                stdin=subprocess.PIPE,
                stdout=subprocess.PIPE,
                stderr=lf,
                env=env,
                start_new_session=True,
            )
        self.next_id = 0

    def call(self, op: str, **kw: Any) -> dict[str, Any]:
        assert self.p.stdin is not None and self.p.stdout is not None
        self.next_id += 1
        msg = {"id": self.next_id, "op": op, **kw}
        try:
            self.p.stdin.write((json.dumps(msg) + "\n").encode())
            self.p.stdin.flush()
            line = self.p.stdout.readline()
        except BrokenPipeError:
            line = b""
        if not line:
            self.p.wait(timeout=10)
            tail = "\n".join("    " + l for l in procs.tail(self.log)) or "    (no output)"
            raise AgentFailure(
                f"the agent on {self.host} died during {op} ({procs.exit_text(self.p.returncode)})\n"
                f"  command: {sys.executable} -m loopscope.agent\n  last output ({self.log}):\n{tail}"
            )
        reply = json.loads(line)
        if not reply.get("ok"):
            raise AgentFailure(f"{reply.get('component', 'agent')} on {self.host}: {reply.get('error')}")
        return reply

    def close(self, timeout: float = 15.0) -> None:
        if self.p.poll() is None:
            try:
                assert self.p.stdin is not None
                self.p.stdin.write(b'{"id": 0, "op": "shutdown"}\n')
                self.p.stdin.flush()
            except (BrokenPipeError, OSError):
                pass
            try:
                self.p.wait(timeout=timeout)
            except subprocess.TimeoutExpired:
                self.p.terminate()
                try:
                    self.p.wait(timeout=timeout)
                except subprocess.TimeoutExpired:
                    self.p.kill()
                    self.p.wait()
        for f in (self.p.stdin, self.p.stdout):
            try:
                if f:
                    f.close()
            except OSError:
                pass

    def terminate(self) -> None:
        """Stop the agent now (it cleans up on SIGTERM)."""
        if self.p.poll() is None:
            self.p.send_signal(signal.SIGTERM)
            try:
                self.p.wait(timeout=15)
            except subprocess.TimeoutExpired:
                self.p.kill()
                self.p.wait()


# ---- preflight ------------------------------------------------------------------------


def preflight(exp: Experiment, file: str, results: Path, run_dir: Path | None) -> list[str]:
    """Check what can be checked before anything starts; InputError for what
    makes the run impossible, notes for what will run degraded."""
    problems: list[str] = []
    notes: list[str] = []
    for i, ld in enumerate(exp.loads):
        if ld.kind == "command":
            if ld.level.percent is not None:
                problems.append(f"{file}: loads.{i}.level: a command load's level is a number of copies, not a duty cycle [got {ld.level}]")
            if shutil.which(ld.command[0]) is None:
                problems.append(f"{file}: loads.{i}.command: {ld.command[0]!r} is not installed or not on PATH")
    cpus = set(os.sched_getaffinity(0))
    for i, p in enumerate(exp.probes):
        for c in getattr(p, "cpu", None) or []:
            if c not in cpus:
                problems.append(f"{file}: probes.{i}.cpu: CPU {c} is not available; use one of {sorted(cpus)}")
        if getattr(p, "priority", None) is not None and os.geteuid() != 0:
            notes.append(f"probes.{i}.priority: SCHED_FIFO needs CAP_SYS_NICE; the probe will say if it ran SCHED_OTHER")
        if getattr(p, "dma_latency_us", None) is not None and not os.access("/dev/cpu_dma_latency", os.W_OK):
            notes.append(f"probes.{i}.dma_latency_us: /dev/cpu_dma_latency is not writable; the probe will report it")
    if run_dir is not None and run_dir.exists():
        problems.append(f"{run_dir}: the run directory already exists; nothing was overwritten (choose another --run-dir or remove it)")
    target = run_dir.parent if run_dir is not None else results
    probe = target
    while not probe.exists() and probe != probe.parent:
        probe = probe.parent
    if not os.access(probe, os.W_OK):
        problems.append(f"{target}: the results directory is not writable (set `results:` in {file} or pass --results)")
    if problems:
        raise InputError("\n".join(problems) if len(problems) == 1 else f"{len(problems)} problems, nothing was run:\n  " + "\n  ".join(problems))
    return notes


def new_run_dir(results: Path, name: str) -> Path:
    stamp = _dt.datetime.now().strftime("%Y%m%d-%H%M%S")
    d = results / f"{stamp}-{name}"
    n = 1
    while d.exists():
        n += 1
        d = results / f"{stamp}-{name}-{n}"
    return d


# ---- the run ----------------------------------------------------------------------------


def _write_json(p: Path, v: Any) -> None:
    tmp = p.with_suffix(p.suffix + ".tmp")
    tmp.write_text(json.dumps(v, indent=1, default=str) + "\n")
    tmp.replace(p)


def write_index(run_dir: Path) -> None:
    """index.json: every file of the run with its size and SHA-256."""
    files = []
    for f in sorted(run_dir.rglob("*")):
        if f.is_file() and f.name != "index.json":
            h = hashlib.sha256()
            with open(f, "rb") as fh:
                for block in iter(lambda: fh.read(1 << 20), b""):
                    h.update(block)
            files.append({"path": str(f.relative_to(run_dir)), "bytes": f.stat().st_size, "sha256": h.hexdigest()})
    _write_json(run_dir / "index.json", {"files": files})


def _sleep(seconds: float) -> None:
    end = time.monotonic() + seconds
    while time.monotonic() < end:
        time.sleep(min(0.1, end - time.monotonic()))


def execute(exp: Experiment, spec_text: str, run_dir: Path, say: Say, notes: list[str], tick: Tick | None = None) -> Outcome:
    run_id = run_dir.name
    run_dir.mkdir(parents=True)
    base = run_dir.resolve()  # what the agent is given: it may not share our cwd
    scratch = base / "scratch"
    scratch.mkdir()
    (run_dir / "spec.yaml").write_text(spec_text)
    _write_json(run_dir / "spec.json", exp.model_dump(mode="json"))
    run = {
        "run_id": run_id,
        "name": exp.name,
        "status": "running",
        "started_utc": _dt.datetime.now(_dt.timezone.utc).isoformat(),
        "controller_pid": os.getpid(),
        "command": sys.argv,
        "notes": notes,
        "steps": [],
        "loads": [],
        "timings": {},
    }
    _write_json(run_dir / "run.json", run)
    state.register(run_id, {"run_id": run_id, "run_dir": str(base), "controller_pid": os.getpid(), "controller_start": procs.process_start_time(os.getpid())})
    agent: AgentClient | None = None
    cgroup: str | None = None
    out = Outcome(run_dir, "running", notes=notes)
    prev_int = signal.getsignal(signal.SIGINT)
    prev_term = signal.getsignal(signal.SIGTERM)

    def interrupted(signum: int, frame: object) -> None:
        raise Interrupted(signal.Signals(signum).name)

    signal.signal(signal.SIGINT, interrupted)
    signal.signal(signal.SIGTERM, interrupted)
    try:
        agent = AgentClient("localhost", run_id, run_dir / "agent.log")
        hello = agent.call("hello", run_id=run_id, run_dir=str(base))
        cgroup = hello.get("cgroup")
        run["timings"]["agent_spawn_mono_ns"] = agent.spawn_ns
        run["timings"]["agent_ready_mono_ns"] = time.monotonic_ns()
        run["agent"] = {"host": "localhost", "pid": hello["pid"], "cgroup": cgroup, "cgroup_note": hello["cgroup_note"]}
        state.update(run_id, agent_pid=hello["pid"], agent_start=procs.process_start_time(hello["pid"]), cgroup=cgroup)
        _write_json(run_dir / "provenance.json", {"controller": {"pid": os.getpid(), "argv": sys.argv, "cwd": os.getcwd()}, "hosts": {"localhost": hello["provenance"]}})
        if cgroup is None:
            notes.append(f"loads and probes are not in cgroups ({hello['cgroup_note']}); CPU use comes from /proc and clean-up relies on process ids")
        # Size the sched probes' bursts once, on the idle machine, so every
        # phase runs the same work against the same reference.
        calib: dict[str, dict[str, Any]] = {}
        for probe in exp.probes:
            if probe.kind == "sched":
                say(f"calibrating {probe.name} (idle)")
                r = agent.call("run_probe", probe=probe.model_dump(mode="json"), step_dir=str(base / "steps" / "calibration"), scratch_dir=str(scratch), duration_ns=int(probe_seconds(exp, probe) * 1e9), calibrate=True)
                calib[probe.name or ""] = {"work_iters": r["result"]["work_iters"], "alone_ns": r["result"]["alone_ns"]}
        run["calibration"] = calib
        plan = phase_runs(exp)
        total = len(plan) * len(exp.probes)
        done = 0
        for pr in plan:
            step_dir = base / "steps" / pr.key
            step_dir.mkdir(parents=True, exist_ok=True)
            loads = [exp.load(n).model_dump(mode="json") for n in pr.phase.loads]
            if loads:
                say(f"[{done}/{total}] rep {pr.rep} · {pr.phase.name}: starting {', '.join(n for n in pr.phase.loads)}")
                agent.call("start_loads", step_dir=str(step_dir), scratch_dir=str(scratch), loads=loads)
            if exp.warmup:
                _sleep(exp.warmup / 1e9)
            for probe in exp.probes:
                dur = int(probe_seconds(exp, probe) * 1e9)
                label = f"rep {pr.rep} · {pr.phase.name} · {probe.name} ({dur / 1e9:g} s)"
                if tick is not None:
                    tick(done, total, label)
                else:
                    say(f"[{done}/{total}] {label}")
                pspec = {**probe.model_dump(mode="json"), **calib.get(probe.name or "", {})}
                r = agent.call("run_probe", probe=pspec, step_dir=str(step_dir), scratch_dir=str(scratch), duration_ns=dur)
                if "first_probe_spawn_mono_ns" not in run["timings"]:
                    run["timings"]["first_probe_spawn_mono_ns"] = r["spawn_mono_ns"]
                run["steps"].append(
                    {
                        "rep": pr.rep,
                        "phase": pr.phase.name,
                        "loads": list(pr.phase.loads),
                        "probe": probe.name,
                        "kind": probe.kind,
                        "trace": str(Path(r["trace"]).relative_to(base)),
                        "json": str((step_dir / f"{probe.name}.json").relative_to(base)),
                        "command": r["command"],
                        "cpu_usec": r["cpu_usec"],
                        "spawn_mono_ns": r["spawn_mono_ns"],
                        "end_mono_ns": r["end_mono_ns"],
                    }
                )
                done += 1
                _write_json(run_dir / "run.json", run)
                if tick is not None:
                    tick(done, total, label)
            if loads:
                lr = agent.call("stop_loads")
                for ld in lr["loads"]:
                    run["loads"].append({"rep": pr.rep, "phase": pr.phase.name, **ld})
        out.status = "completed"
    except Interrupted as e:
        out.status, out.error = "interrupted", f"interrupted by {e}"
    except AgentFailure as e:
        out.status, out.error = "failed", str(e)
    finally:
        signal.signal(signal.SIGINT, signal.SIG_IGN)
        signal.signal(signal.SIGTERM, signal.SIG_IGN)
        try:
            if agent is not None:
                if out.status == "running":
                    out.status, out.error = "failed", out.error or "the controller stopped unexpectedly"
                if out.status == "completed":
                    agent.close()
                else:
                    agent.terminate()
            if cgroup:
                RunGroup.remove(Path(cgroup))
                remove_root_if_empty(Path(cgroup))
            for pid in procs.pids_of_run(run_id):
                try:
                    os.kill(pid, signal.SIGKILL)
                except ProcessLookupError:
                    pass
            shutil.rmtree(scratch, ignore_errors=True)
            run["status"] = out.status
            run["error"] = out.error
            run["ended_utc"] = _dt.datetime.now(_dt.timezone.utc).isoformat()
            _write_json(run_dir / "run.json", run)
            write_index(run_dir)
            state.unregister(run_id)
        finally:
            signal.signal(signal.SIGINT, prev_int)
            signal.signal(signal.SIGTERM, prev_term)
    return out


def run(spec_path: str, *, results: str | None = None, run_dir: str | None = None, say: Say = lambda s: None, tick: Tick | None = None) -> Outcome:
    exp = load(spec_path)
    text = Path(spec_path).read_text()
    res = Path(results or exp.results)
    rd = Path(run_dir) if run_dir else None
    notes = preflight(exp, spec_path, res, rd)
    for n in notes:
        say(f"note: {n}")
    target = rd or new_run_dir(res, exp.name)
    try:
        target.parent.mkdir(parents=True, exist_ok=True)
    except OSError as e:
        raise InputError(f"{target.parent}: cannot create the results directory: {e.strerror}") from None
    return execute(exp, text, target, say, notes, tick)
