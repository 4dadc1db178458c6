"""The agent: runs loads and probes on its host for the controller.

It speaks JSON lines on stdin/stdout (``docs/agent-protocol.md``): one
request per line with an ``id`` and an ``op``, one reply per request with the
same ``id`` and ``ok``. It never listens on a port. Ops:

- ``hello``: host facts (provenance), the cgroup it will use;
- ``start_loads``: start each load's workers in the load's cgroup and check
  they survive their start;
- ``run_probe``: run one probe as a process (``loopscope probe …
  --json``), wait for it, return its JSON, and check the loads are still
  running;
- ``stop_loads``: stop the loads and report their CPU use and work done;
- ``start_probe`` / ``wait_probe`` / ``stop_probe``: the same for probes that
  run side by side (the stages of a pipeline): start one (waiting until a
  server says ``ready``), wait for one with a timeout (``done: false`` when
  it is still running), or stop one with SIGINT and collect its JSON;
- ``watch``: asleep until one of its probes or loads exits or the
  controller's next request arrives (which it then handles): what the lab
  does on the other hosts while a pipeline or an app measures, so no agent
  wakes inside the window and a death is seen at once;
- ``status``: whether every running probe and load is alive;
- ``shutdown``: stop everything and exit.

Whatever ends the agent (shutdown, SIGTERM, its stdin closing, the
controller dying, which the kernel turns into SIGTERM) goes through the same
clean-up: probe and loads stopped, their cgroups killed and removed.
"""

from __future__ import annotations

import json
import os
import shlex
import signal
import subprocess
import sys
import time
from pathlib import Path
from typing import Any

from pydantic import ValidationError

from loopscope import protocol as P
from loopscope.host import cpulimit, procs, provenance, tunings
from loopscope.errors import EXIT_INTERRUPTED, InputError, RunError, Stopped
from loopscope.agent.requests import Requests
from loopscope.agent.submonitor import SubMonitor
from loopscope.agent.commands import Failure, last_json, load_argvs, probe_argv, probe_env, proc_cpu_s, read_line, tune_threads
from loopscope.host.cgroup import RunGroup, find_root
from loopscope.lineage import die_with_parent
from loopscope.rundir import LoadReport
from loopscope.selfname import load_comm, set_comm


class Terminated(Stopped):
    """SIGTERM, or the controller's end, reached the agent."""


def _on_term(signum: int, frame: object) -> None:
    raise Terminated(signal.Signals(signum).name)


class Agent(SubMonitor):
    def __init__(self) -> None:
        self.run_id = "unnamed"
        self.probe_env: dict[str, str] = {}
        self.run_dir = Path(".")
        self.group: RunGroup | None = None
        #: groups a phase's limit tunings made for its loads, removed when the loads stop
        self.limited: list[Path] = []
        self.cg_note = ""
        self.loads: dict[str, list[procs.Child]] = {}
        # the controller's request stream (set by main; ``watch`` sleeps on it too)
        self.requests: Requests | None = None
        self.load_start_ns = 0
        self.probe: procs.Child | None = None
        self.running: dict[str, tuple[procs.Child, Path, int, bool]] = {}
        self.exited: dict[str, int] = {}  # probe name -> CLOCK_MONOTONIC ns its exit was seen (wait_probe)
        self.kcapture: Any = None
        self.packed: Any = None  # agent.files.Packed, between pack_files and drop_files
        #: the phase's tunings of this kernel, when this agent tunes it for the lab (``lab/tuned.py``)
        self.tuned: tunings.Applied | None = None

    # ---- ops ------------------------------------------------------------------------

    def hello(self, m: P.Hello) -> P.HelloReply:
        import loopscope

        mine = str(loopscope.__version__)
        if m.controller_version is not None and m.controller_version != mine:
            raise Failure(
                "agent",
                f"this host's loopscope is {mine} ({sys.executable}) and the controller's is {m.controller_version}: "
                "one version must run on every host (`loopscope hosts install EXPERIMENT` puts the controller's there)",
            )
        self.run_id = m.run_id
        self.run_dir = Path(m.run_dir)
        self.probe_env = dict(m.probe_env)
        self.run_dir.mkdir(parents=True, exist_ok=True)
        if m.vclock:
            # Test only: every child (probes, loads) skews its timestamps alike.
            os.environ["LOOPSCOPE_VCLOCK"] = m.vclock
        root, self.cg_note = find_root() if m.cgroups else (None, "cgroups not requested")
        if root is not None:
            self.group = RunGroup(root, m.cgroup_name or self.run_id)
        return P.HelloReply(
            pid=os.getpid(),
            started_mono_ns=_STARTED_NS,
            cgroup=str(self.group.path) if self.group else None,
            cgroup_note=self.cg_note,
            provenance=provenance.gather(self.cg_note),
        )

    def start_loads(self, m: P.StartLoads) -> P.LoadsStarted:
        step = Path(m.step_dir)
        scratch = Path(m.scratch_dir)
        env = procs.child_env(self.run_id)
        started = []
        self.load_start_ns = time.monotonic_ns()
        scratch.mkdir(parents=True, exist_ok=True)
        for ld in m.loads:
            name = ld["name"]
            group = self.group.child(f"loads/{name}") if self.group else None
            kids = []
            lenv = {**env, "LOOPSCOPE_COMM": load_comm(name)}
            for i, argv in enumerate(load_argvs(ld, scratch)):
                kids.append(procs.spawn(f"{name}[{i}]", "load", argv, step / "loads" / f"{name}-{i}.log", group, lenv))
            self.loads[name] = kids
            started.append(
                P.LoadStarted(name=name, pids=[k.pid for k in kids], cgroup=str(group) if group else None, command=kids[0].command() if kids else None)
            )
        # A load that cannot start dies at once: give it a moment to do so.
        time.sleep(m.settle_s)
        self._check_loads("while starting")
        for ld, st in zip(m.loads, started):
            if ld.get("cpus") or ld.get("sched"):
                st.tuned = tune_threads(ld, procs.threads_of(Path(st.cgroup) if st.cgroup else None, st.pids))
            if ld.get("limit"):
                self._limit_load(ld["name"], float(ld["limit"]["cpus"]), st)
        return P.LoadsStarted(loads=started)

    def _limit_load(self, name: str, cpus: float, st: P.LoadStarted) -> None:
        """A phase's ``limit`` tuning on load ``name``: its threads held to ``cpus`` until the loads stop."""
        own = Path(st.cgroup) if st.cgroup else None
        try:
            g = cpulimit.limit_threads(name, cpus, procs.threads_of(own, st.pids), own)
        except OSError as e:
            raise Failure(
                f"load {name}",
                f"the phase's limit tuning could not hold load {name} to {cpus} CPUs: {e.strerror or e} ({cpulimit.missing() or 'the cgroup refused it'})",
            ) from None
        if g is not None:
            self.limited.append(g)
        st.tuned = {**(st.tuned or {}), "limit_cpus": cpus, "limit_group": str(g or own)}

    def _unlimit(self) -> None:
        for g in self.limited:
            cpulimit.remove(g)
        self.limited = []

    def _check_loads(self, when: str) -> None:
        for name, kids in self.loads.items():
            for k in kids:
                if k.popen.poll() is not None:
                    raise Failure(f"load {name}", k.describe_failure(f"load {name} exited {when} (it should run until the phase ends)"))

    def run_probe(self, m: P.RunProbe) -> P.ProbeDone:
        p = m.probe
        step = Path(m.step_dir)
        trace = step / f"{p['name']}.lstrace"
        calibrate = m.calibrate
        argv = probe_argv(p, m.duration_ns, trace, Path(m.scratch_dir), calibrate)
        group = self.group.child(f"probes/{p['name']}") if self.group else None
        t0 = time.monotonic_ns()
        child = procs.spawn(p["name"], "probe", argv, step / f"{p['name']}.log", group, probe_env(self.run_id, p["kind"], self.probe_env), stdout_pipe=True)
        self.probe = child
        timeout = m.duration_ns / 1e9 + m.timeout_slack_s
        try:
            out, _ = child.popen.communicate(timeout=timeout)
        except subprocess.TimeoutExpired:
            child.popen.kill()
            child.popen.wait()
            raise Failure(f"probe {p['name']}", child.describe_failure(f"probe {p['name']} did not finish within {timeout:.0f} s")) from None
        finally:
            self.probe = None
        t1 = time.monotonic_ns()
        text = out.decode(errors="replace").strip()
        step.mkdir(parents=True, exist_ok=True)
        (step / f"{p['name']}{'.calibration' if calibrate else ''}.json").write_text(text + "\n")
        try:
            result = json.loads(text.splitlines()[-1])
        except (json.JSONDecodeError, IndexError):
            result = None
        # cut short (SIGUSR1 from the controller, passed on as SIGINT): what it measured until then is its result
        cut = child.popen.returncode == EXIT_INTERRUPTED and isinstance(result, dict) and bool(result.get("interrupted"))
        if child.popen.returncode != 0 and not cut:
            raise Failure(f"probe {p['name']}", child.describe_failure())
        if not isinstance(result, dict):
            raise Failure(f"probe {p['name']}", child.describe_failure(f"probe {p['name']} printed no JSON result"))
        cpu = RunGroup.cpu_usec(group) if group else None
        if group:
            RunGroup.remove(group)
        self._check_loads("during the probe")
        return P.ProbeDone(result=result, trace=str(trace), spawn_mono_ns=t0, end_mono_ns=t1, cpu_usec=cpu, command=shlex.join(argv))

    # ---- probes side by side ---------------------------------------------------------

    def start_probe(self, m: P.StartProbe) -> P.ProbeStarted:
        p = m.probe
        name = p["name"]
        if name in self.running:
            raise Failure(f"probe {name}", f"probe {name} is already running")
        step = Path(m.step_dir)
        step.mkdir(parents=True, exist_ok=True)
        trace = step / f"{name}.lstrace"
        argv = probe_argv(p, m.duration_ns, trace, Path(m.scratch_dir))
        group = self.group.child(f"probes/{name}") if self.group else None
        t0 = time.monotonic_ns()
        child = procs.spawn(name, "probe", argv, step / f"{name}.log", group, probe_env(self.run_id, p["kind"], self.probe_env), stdout_pipe=True)
        self.running[name] = (child, step, t0, False)
        if m.wait_ready:
            line = read_line(child, m.ready_timeout_s)
            if line != "ready":
                child.popen.kill()
                child.popen.wait()
                del self.running[name]
                what = f"probe {name} did not get ready" + (f" (it printed {line!r})" if line else "")
                raise Failure(f"probe {name}", child.describe_failure(what))
        return P.ProbeStarted(pid=child.pid, trace=str(trace), spawn_mono_ns=t0, command=shlex.join(argv))

    def wait_probe(self, m: P.WaitProbe) -> P.Waited | P.ProbeDone:
        """Until the probe exits or ``timeout_s`` passes, asleep (no polling:
        the probes beside it are measuring). ``collect: false`` only says
        it ended; ``stop_probe`` collects it later, after the window.
        ``watch``: other probes of this host whose death (or a load's) ends
        the wait as a failure, as ``watch`` does. The next request ends the
        wait too (``done: false``)."""
        name = m.name
        child = self._running(name)
        watched = {n: self._running(n).popen for n in m.watch if n != name}
        gone = self._sleep_on({name: child.popen, **watched, **self._load_popens()}, m.timeout_s, requests=True)
        if name not in gone:
            return P.Waited(done=False, exited=self._died(gone, "during the probe"))
        self.exited.setdefault(name, time.monotonic_ns())
        if not m.collect:
            return P.Waited(done=True)
        return self._finish(name)

    def watch(self, m: P.Watch) -> P.Watched:
        """Asleep until one of the running probes ``names`` or a load
        exits, ``timeout_s`` passes (default: never), or the next request
        arrives. A probe that failed or a load that ended is a failure; a
        probe that exited cleanly is said (``exited``)."""
        popens = {n: self._running(n).popen for n in m.names}
        gone = self._sleep_on({**popens, **self._load_popens()}, m.timeout_s, requests=True)
        return P.Watched(exited=self._died(gone, "during the window"))

    def _load_popens(self) -> dict[str, subprocess.Popen[bytes]]:
        return {f"load {name} #{i}": k.popen for name, kids in self.loads.items() for i, k in enumerate(kids)}

    def _died(self, gone: list[str], when: str) -> list[str]:
        """Of the processes that exited (names from ``_sleep_on``): a load is a
        failure, so is a probe that exited with an error (collected with its
        log); the probes that exited cleanly."""
        self._check_loads(when)
        for name, (child, _, _, stopping) in list(self.running.items()):
            if name in gone and child.popen.poll() not in (None, 0) and not stopping:
                self._finish(name)
        return [n for n in gone if n in self.running]

    def _sleep_on(self, popens: dict[str, subprocess.Popen[bytes]], timeout: float | None, requests: bool) -> list[str]:
        """Asleep on the processes' pidfds (and on standard input when
        ``requests``) until one of them exits, a request is waiting, or
        ``timeout`` passes: the names of those that exited."""
        import select

        gone = [n for n, p in popens.items() if p.poll() is not None]
        if gone or (requests and self.requests is not None and self.requests.waiting()):
            return gone
        fds: dict[int, str] = {}
        try:
            for n, p in popens.items():
                try:
                    fds[os.pidfd_open(p.pid)] = n
                except ProcessLookupError:
                    return [n]
            poller = select.poll()
            for fd in fds:
                poller.register(fd, select.POLLIN)
            if requests and self.requests is not None:
                poller.register(self.requests.fd, select.POLLIN)
            end = None if timeout is None else time.monotonic() + timeout
            while True:
                left = None if end is None else max(0.0, end - time.monotonic())
                ready = poller.poll(None if left is None else left * 1000)
                gone = [fds[fd] for fd, _ in ready if fd in fds]
                if gone or ready or (left is not None and left <= 0):
                    return gone
        finally:
            for fd in fds:
                os.close(fd)

    def stop_probe(self, m: P.StopProbe) -> P.ProbeDone:
        name = m.name
        child, step, t0, _ = self.running[name] if name in self.running else (self._running(name), Path("."), 0, False)
        self.running[name] = (child, step, t0, True)
        if child.popen.poll() is None:
            child.popen.send_signal(signal.SIGINT)
        try:
            child.popen.wait(timeout=m.timeout_s)
        except subprocess.TimeoutExpired:
            child.popen.kill()
            child.popen.wait()
        return self._finish(name)

    def signal_probe(self, m: P.SignalProbe) -> P.Done:
        """Pause (``stop``) or resume (``cont``) a running probe: the lab
        pauses its clock-sync probes while a probe step measures."""
        child = self._running(m.name)
        if child.popen.poll() is None:
            child.popen.send_signal(signal.SIGSTOP if m.signal == "stop" else signal.SIGCONT)
        return P.Done()

    def status(self, m: P.GetStatus) -> P.Status:
        for name, (child, _, _, stopping) in self.running.items():
            if child.popen.poll() is not None and not stopping and child.popen.returncode != 0:
                self._finish(name)
        self._check_loads("during the run")
        return P.Status(probes={n: c.popen.poll() is None for n, (c, _, _, _) in self.running.items()})

    def _running(self, name: str) -> procs.Child:
        if name not in self.running:
            raise Failure("agent", f"no probe named {name!r} is running here")
        return self.running[name][0]

    def _finish(self, name: str) -> P.ProbeDone:
        child, step, t0, stopping = self.running.pop(name)
        out, _ = child.popen.communicate()
        # when it ended, not when it was collected (a pipeline's source is collected after the window)
        t1 = self.exited.pop(name, None) or time.monotonic_ns()
        text = out.decode(errors="replace").strip()
        lines = [l for l in text.splitlines() if l.strip() and l.strip() != "ready"]
        (step / f"{name}.json").write_text((lines[-1] if lines else "") + "\n")
        rc = child.popen.returncode
        if rc != 0 and not (stopping and rc in (130, -signal.SIGINT)):
            raise Failure(f"probe {name}", child.describe_failure())
        try:
            result = json.loads(lines[-1])
        except (json.JSONDecodeError, IndexError):
            raise Failure(f"probe {name}", child.describe_failure(f"probe {name} printed no JSON result")) from None
        cpu = RunGroup.cpu_usec(child.group) if child.group else None
        if child.group:
            RunGroup.remove(child.group)
        return P.ProbeDone(result=result, trace=str(step / f"{name}.lstrace"), spawn_mono_ns=t0, end_mono_ns=t1, cpu_usec=cpu, command=child.command())

    def stop_loads(self, m: P.StopLoads) -> P.LoadsStopped:
        report = []
        elapsed = (time.monotonic_ns() - self.load_start_ns) / 1e9
        early = []
        for name, kids in self.loads.items():
            for k in kids:
                if k.popen.poll() is not None:
                    early.append((name, k))
        for name, kids in list(self.loads.items()):
            proc_cpu = sum(proc_cpu_s(k.pid) for k in kids)
            group = kids[0].group if kids else None
            # Every thread of the load, so attribution can name it whatever the program calls itself.
            tids = procs.threads_of(group, [k.pid for k in kids])
            # where its threads were allowed to run (a load may pin itself: stress-ng --taskset)
            allowed: set[int] = set()
            for t in tids:
                try:
                    allowed |= os.sched_getaffinity(t)
                except OSError:
                    pass
            procs.stop(kids)
            usec = RunGroup.cpu_usec(group) if group else None
            if group:
                RunGroup.remove(group)
            self._unlimit()
            works = [last_json(k.log) for k in kids]
            report.append(
                LoadReport(
                    name=name,
                    tids=tids,
                    cpus=sorted(allowed),
                    workers=len(kids),
                    exit=[procs.exit_text(k.popen.returncode) for k in kids],
                    cpu_s=usec / 1e6 if usec is not None else proc_cpu,
                    cpu_source="cgroup cpu.stat" if usec is not None else "/proc/<pid>/stat (children not included)",
                    elapsed_s=elapsed,
                    ops=sum(w.get("ops", 0) for w in works if w) if any(works) else None,
                    unit=next((w.get("unit") for w in works if w), None),
                )
            )
        self.loads = {}
        if early:
            name, k = early[0]
            raise Failure(f"load {name}", k.describe_failure(f"load {name} exited before the phase ended"))
        return P.LoadsStopped(loads=report)

    def start_kcapture(self, m: P.StartKcapture) -> P.CaptureMeta:
        """Record kernel events (this machine's kernel) until ``stop_kcapture``."""
        from loopscope.kernel.capture import Capture
        from loopscope.kernel.tracing import run_instance_name

        if self.kcapture is not None:
            raise Failure("kernel capture", "a kernel capture is already running here")
        group = self.group.child("kernel") if self.group else None
        cap = Capture(Path(m.out_dir), m.events or None, m.buffer_mb, m.window_s, name=run_instance_name(self.run_id), group=group, read=m.read)
        wrap = (lambda argv: RunGroup.wrap(group, argv)) if group is not None else None
        meta = cap.start(wrap=wrap, env=procs.child_env(self.run_id))
        if not meta.refused:
            self.kcapture = cap
        return P.CaptureMeta.model_validate(meta.model_dump(exclude_unset=True))

    def drain_kcapture(self, m: P.DrainKcapture) -> P.Drained:
        """Read the kernel's buffers now (the lab calls this between probe windows)."""
        if self.kcapture is None:
            return P.Drained(error="no kernel capture is running")
        from loopscope.host.cpulimit import snapshot

        return P.Drained.model_validate({**self.kcapture.drain(m.label), "cpu_limits": snapshot()})

    def stop_kcapture(self, m: P.StopKcapture) -> P.CaptureMeta:
        if self.kcapture is None:
            return P.CaptureMeta(refused="no kernel capture was running")
        meta = self.kcapture.stop()
        half_full = self.kcapture.final.get("half_full") or []
        self.kcapture = None
        return P.CaptureMeta.model_validate({**meta.model_dump(exclude_unset=True), "half_full": half_full})

    # ---- tunings of this kernel ------------------------------------------------------

    def check_tunings(self, m: P.CheckTunings) -> P.TuningsChecked:
        return P.TuningsChecked(problems=tunings.check(m.phases))

    def make_tunings(self, m: P.MakeTunings) -> P.TuningsMade:
        """The phase's tunings made here, each old value in this host's journal
        first; what was made is said even when one fails (it is given back with the rest)."""
        if self.tuned is not None:
            self.tuned.restore()
        self.tuned = tunings.Applied(tunings.agent_journal(self.run_id))
        error = None
        try:
            self.tuned.apply(m.tunings, m.where)
        except (RunError, InputError) as e:
            error = str(e)
        return P.TuningsMade.model_validate({"changes": self.tuned.record(), "error": error})

    def give_back_tunings(self, m: P.GiveBackTunings) -> P.TuningsGivenBack:
        problems = self.tuned.restore() if self.tuned is not None else []
        self.tuned = None
        return P.TuningsGivenBack(problems=problems)

    # ---- files home ---------------------------------------------------------------

    def pack_files(self, m: P.PackFiles) -> P.Packed:
        """Pack the run directory for the way home (``host/packing.py``)."""
        from loopscope.host.packing import Packed

        if self.packed is not None:
            self.packed.drop(remove_root=False)
        self.packed = Packed(Path(m.path))
        return P.Packed(bytes=self.packed.size, files=self.packed.files, sha256=self.packed.sha256)

    def read_packed(self, m: P.ReadPacked) -> P.Chunk:
        if self.packed is None:
            raise Failure("agent", "nothing is packed: pack_files first")
        data, eof = self.packed.read(m.offset, m.size)
        return P.Chunk(data=data, eof=eof)

    def drop_files(self, m: P.DropFiles) -> P.Done:
        if self.packed is not None:
            self.packed.drop(remove_root=m.remove)
            self.packed = None
        return P.Done()

    # ---- clean-up -------------------------------------------------------------------

    def cleanup(self) -> None:
        self.cleanup_monitor()  # (first: its own teardown takes its probes and loads down)
        if self.tuned is not None:
            # (what cannot be given back stays in the journal, for `loopscope cleanup` on this host)
            self.tuned.restore()
            self.tuned = None
        if self.packed is not None:
            self.packed.drop(remove_root=False)
            self.packed = None
        if self.kcapture is not None:
            self.kcapture.stop()
            self.kcapture = None
        if self.probe is not None and self.probe.popen.poll() is None:
            procs.stop([self.probe], grace=2.0)
        procs.stop([c for c, _, _, _ in self.running.values()], grace=2.0)
        self.running = {}
        for kids in self.loads.values():
            procs.stop(kids, grace=2.0)
        self.loads = {}
        self._unlimit()
        if self.group is not None:
            RunGroup.remove(self.group.path)
            root, _ = find_root()
            parent = self.group.path.parent
            if root is not None and parent != root and parent.parent == root:
                # a multi-host run's group holds one group per host: the last agent out removes it
                try:
                    parent.rmdir()
                except OSError:
                    pass

    def handle(self, m: dict[str, object]) -> dict[str, object]:
        """One request off the wire: checked against its model, carried out by
        the method of its op's name, the reply dumped as JSON."""
        op = str(m.get("op"))
        cls = P.REQUESTS.get(op)
        if cls is None:
            raise Failure("agent", f"unknown op {op!r}")
        try:
            req = cls.model_validate({k: v for k, v in m.items() if k not in ("id", "op")})
        except ValidationError as e:
            err = e.errors()[0]
            raise Failure("agent", f"bad {op} request: {'.'.join(str(x) for x in err['loc'])}: {err['msg']}") from None
        reply: P.Reply = getattr(self, op)(req)
        return reply.model_dump(mode="json", exclude_unset=True)


_STARTED_NS = time.monotonic_ns()


def main() -> int:
    set_comm("ls-agent")
    signal.signal(signal.SIGTERM, _on_term)
    signal.signal(signal.SIGINT, _on_term)
    signal.signal(signal.SIGHUP, _on_term)
    if not die_with_parent(signal.SIGTERM):
        return 1
    agent = Agent()

    def cut_short(signum: int, frame: object) -> None:
        # The controller was asked to stop inside a window: the probe measuring
        # stops as at its window's end (SIGINT) and says what it measured.
        if agent.probe is not None and agent.probe.popen.poll() is None:
            agent.probe.popen.send_signal(signal.SIGINT)

    signal.signal(signal.SIGUSR1, cut_short)
    agent.requests = Requests(sys.stdin.fileno())
    out = sys.stdout
    try:
        while (line := agent.requests.next()) is not None:
            if not line.strip():
                continue
            try:
                m = json.loads(line)
            except json.JSONDecodeError as e:
                out.write(json.dumps({"id": None, "ok": False, "component": "agent", "error": f"bad request: {e}"}) + "\n")
                out.flush()
                continue
            if m.get("op") == "shutdown":
                agent.cleanup()
                out.write(json.dumps({"id": m.get("id"), "ok": True}) + "\n")
                out.flush()
                return 0
            try:
                reply = {"id": m.get("id"), "ok": True, **agent.handle(m)}
            except Failure as f:
                reply = {"id": m.get("id"), "ok": False, "component": f.component, "error": f.detail}
            except (InputError, RunError) as e:  # a request it cannot carry out is answered, never the agent's end
                reply = {"id": m.get("id"), "ok": False, "component": getattr(e, "component", None) or "agent", "error": str(e)}
            except OSError as e:
                reply = {"id": m.get("id"), "ok": False, "component": "agent", "error": f"{e.filename or ''}: {e.strerror}"}
            out.write(json.dumps(reply) + "\n")
            out.flush()
    except Terminated:
        pass
    finally:
        # A second signal (the controller's death arrives as SIGTERM, and
        # again as SIGHUP or from whoever else is stopping things) must not cut
        # the clean-up short: a half-done one leaves cgroups behind. One that
        # comes while they are being ignored still runs the handler once (it
        # raised out of here, and a killed controller's cgroups stayed): ignore
        # them again until none is left.
        while True:
            try:
                for sig in (signal.SIGTERM, signal.SIGINT, signal.SIGHUP):
                    signal.signal(sig, signal.SIG_IGN)
                break
            except Terminated:
                continue
        agent.cleanup()
    return 0
