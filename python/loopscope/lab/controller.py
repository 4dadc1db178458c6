"""The controller: ``loopscope run SPEC``.

Preflight first (the spec, the results directory, the commands loads
need, privileges, every host reachable), then the lab (``lab.py``: network
namespaces, the link emulator, one agent per host), then the plan: for each
repetition and phase, start the phase's loads on their hosts, let them warm
up, run every probe in turn (a pipeline's stages side by side on their
hosts), stop the loads. Between probes, and while a pipeline runs, every
agent and the emulator are checked, so one failing host stops the run on
all of them. Everything a run produces lands in ``runs/<time>-<name>/``
with the spec, the provenance and an index of files; the report is built
from it afterwards.

However the run ends, the same ``finally`` runs: the lab comes down (agents
told to shut down or terminated, emulator stopped, remote files fetched,
namespaces deleted, cgroups removed), processes still carrying the run's id
are killed, ``run.json`` records how it ended and which host and component
failed, and the state file that ``loopscope cleanup`` would use
disappears. Ctrl-C only reaches the controller (agents run in sessions of
their own), so it is the controller that decides the order of shutdown. If
the controller itself is killed, its agents hear of it from the kernel and
a reaper process (``reaper.py``) removes the namespaces.
"""

from __future__ import annotations

import datetime as _dt
import hashlib
import json
import os
import re
import shutil
import signal
import sys
import time
from contextlib import contextmanager
from dataclasses import dataclass, field
from pathlib import Path
from typing import TYPE_CHECKING, Any, Callable, Iterator

from loopscope import protocol as P
from loopscope.probes.params import Params
from loopscope.errors import InputError, RunError, Stopped
from loopscope.rundir import AgentRecord, HubStep, EmulatorRecord, Failed, HostAgent, LinkSetting, LoadRecord, LostHost, Provenance, RunDir, RunRecord, Step, TuningsApplied
from loopscope import selfname
from loopscope.lab import clocksync, hubs, kcapture, state
from loopscope.host import procs, tunings
from loopscope.lab.hosts import AgentFailure
from loopscope.lab.lab import Lab, LabError, resolve_hosts
from loopscope.lab.reaper import Reaper
from loopscope.kinds import KINDS
from loopscope.kinds.base import Collected, HostView
from loopscope.spec import Experiment, load
from loopscope.spec.load import where
from loopscope.spec.models import HOST_REF, REMOTE
from loopscope.spec.plan import PhaseRun, phase_runs, probe_seconds
from loopscope.lab.lab import check
from loopscope.lab.emulator import link_configs

if TYPE_CHECKING:
    from loopscope.spec.models import ProbeModel

Say = Callable[[str], None]
Tick = Callable[[int, int, str], None]


# A phase's loads placed on their hosts (each a load's request), and likewise their sinks.
LoadsByHost = dict[str, list[dict[str, Any]]]


class Interrupted(Stopped):
    """Ctrl-C or SIGTERM reached the controller: the run ends through its clean-up."""


#: how long a probe cut short inside its window may take to say what it measured
CUT_SHORT_S = 5.0


@dataclass
class Outcome:
    run_dir: Path
    status: str
    error: str | None = None
    notes: list[str] = field(default_factory=list)


# ---- preflight ------------------------------------------------------------------------


def preflight(exp: Experiment, file: str, results: Path, run_dir: Path | None) -> tuple[list[str], dict[str, str]]:
    """Check what can be checked before anything starts; InputError for what
    makes the run impossible, notes for what will run degraded. Returns the
    notes and each host's kind."""

    problems: list[str] = []
    kinds, notes = resolve_hosts(exp)
    problems += check(exp, file, kinds)
    for i, ld in enumerate(exp.loads):
        if ld.kind == "command":
            if ld.level.percent is not None:
                problems.append(f"{where(file, f'loads.{i}.level')}: loads.{i}.level: a command load's level is a number of copies, not a duty cycle [got {ld.level}]")
            if shutil.which(ld.command[0]) is None:
                problems.append(f"{where(file, f'loads.{i}.command')}: loads.{i}.command: {ld.command[0]!r} is not installed or not on PATH")
    problems += _missing_programs(exp, file, kinds)
    cpus = set(os.sched_getaffinity(0))
    for i, p in enumerate(exp.probes):
        for c in getattr(p, "cpu", None) or []:
            if c not in cpus:
                problems.append(f"{where(file, f'probes.{i}.cpu')}: probes.{i}.cpu: CPU {c} is not available; use one of {sorted(cpus)}")
        if getattr(p, "priority", None) is not None and os.geteuid() != 0:
            notes.append(f"probes.{i}.priority: SCHED_FIFO needs CAP_SYS_NICE; the probe will say if it ran SCHED_OTHER")
        if isinstance(p, Params):
            notes += [f"probes.{i}.{n}" for n in p.notes_here()]
            if kinds.get(getattr(p, "host", None) or exp.hosts[0].name) not in REMOTE:
                # what only this machine can say (a process to attach to); CPUs are said above
                problems += [f"{where(file, f'probes.{i}')}: probes.{i}.{x}" for x in p.check_here() if not x.startswith("cpu:")]
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
    return notes, kinds


def _missing_programs(exp: Experiment, file: str, kinds: dict[str, str]) -> list[str]:
    """A program a probe starts on this machine's file system that is not
    there: named before anything starts, not as a failed run."""
    out = []
    here = Path(file).resolve().parent
    for i, p in enumerate(exp.probes):
        progs = KINDS[p.kind].local_programs(p)
        for j, q in enumerate(progs):
            if kinds.get(q.host or exp.hosts[0].name) in REMOTE or not q.command:
                continue
            exe = q.command[0]
            found = (Path(q.cwd or here) / exe).is_file() if "/" in exe else shutil.which(exe) is not None
            if not found:
                path = f"probes.{i}.command" if progs == [p] else f"probes.{i}.processes.{j}.command"
                where_ = "relative to " + str(q.cwd or here) if "/" in exe and not exe.startswith("/") else "on PATH" if "/" not in exe else "there"
                out.append(f"{where(file, path)}: {path}: {exe!r} does not exist ({where_}); build it or give its path")
    return out


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


def _now() -> str:
    return _dt.datetime.now(_dt.timezone.utc).isoformat(timespec="milliseconds")


def _sleep(seconds: float) -> None:
    # one sleep, no waking to look at the clock (Ctrl-C still interrupts it)
    time.sleep(max(0.0, seconds))


def execute(exp: Experiment, spec_text: str, run_dir: Path, say: Say, notes: list[str], tick: Tick | None = None, kinds: dict[str, str] | None = None) -> Outcome:
    """Run the experiment into ``run_dir``; whatever happens, the lab comes
    down and ``run.json`` says how the run ended. Ctrl-C and SIGTERM end
    the run through the same clean-up."""
    return execute_run(Run(exp, spec_text, run_dir, say, notes, tick, kinds))


def execute_run(r: "Run") -> Outcome:
    """``r``'s body, then its teardown on every way out (a monitor is a ``Run`` too)."""
    prev_int = signal.getsignal(signal.SIGINT)
    prev_term = signal.getsignal(signal.SIGTERM)

    def interrupted(signum: int, frame: object) -> None:
        raise Interrupted(signal.Signals(signum).name)

    own_name = selfname.current()
    selfname.set_comm("ls-ctl")  # attribution names the controller among the lab's own
    signal.signal(signal.SIGINT, interrupted)
    signal.signal(signal.SIGTERM, interrupted)
    try:
        r.body()
    finally:
        signal.signal(signal.SIGINT, signal.SIG_IGN)
        signal.signal(signal.SIGTERM, signal.SIG_IGN)
        try:
            r.teardown()
        finally:
            signal.signal(signal.SIGINT, prev_int)
            signal.signal(signal.SIGTERM, prev_term)
            if own_name:
                selfname.set_comm(own_name)
    return r.out


class Run:
    """One run of an experiment: the lab, the record it writes (``run.json``)
    and what is running beside the probes (clock sync, kernel capture, a
    phase's tunings). ``body`` runs the plan and classifies how it failed;
    ``teardown`` gives everything back on every way out."""

    def __init__(self, exp: Experiment, spec_text: str, run_dir: Path, say: Say, notes: list[str], tick: Tick | None, kinds: dict[str, str] | None) -> None:
        self.exp, self.run_dir, self.say, self.notes, self.tick = exp, run_dir, say, notes, tick
        self.run_id = run_dir.name
        run_dir.mkdir(parents=True)
        (run_dir / "spec.yaml").write_text(spec_text)
        _write_json(run_dir / "spec.json", exp.model_dump(mode="json", by_alias=True))
        self.kinds = kinds or resolve_hosts(exp)[0]
        self.rec = RunRecord(run_id=self.run_id, name=exp.name, status="running", started_utc=_dt.datetime.now(_dt.timezone.utc).isoformat(),
                             controller_pid=os.getpid(), command=sys.argv, notes=notes, hosts={h.name: self.kinds[h.name] for h in exp.hosts},
                             steps=[], loads=[], timings={})
        self.save()
        state.register(state.RunState(run_id=self.run_id, run_dir=str(run_dir.resolve()), controller_pid=os.getpid(), controller_start=procs.process_start_time(os.getpid())))
        self.lab = Lab(exp, self.run_id, run_dir, self.kinds)
        # namespaces and tunings outlive a killed controller: the reaper gives them back
        self.reaper = Reaper(self.run_id) if self.lab.topo is not None or any(ph.tunings for ph in exp.phases or []) else None
        self.tuned: tunings.Applied | None = None
        self.out = Outcome(run_dir, "running", notes=notes)
        self.sync_info: clocksync.SyncRun | None = None
        self.kcap_info: kcapture.CaptureRun | None = None
        self.calib: dict[str, dict[str, int]] = {}
        self.done = 0
        #: what the run is doing now (a failure or a lost host says it)
        self.during = "bringing up the lab"

    def save(self) -> None:
        """Write the record as it stands (the notes said so far included)."""
        self.rec.notes = list(self.notes)
        RunDir(self.run_dir).write_record(self.rec)

    def body(self) -> None:
        """The plan, and how it ended (``out.status``, ``run.json``'s ``failed``)."""
        out, rec = self.out, self.rec
        try:
            self.plan()
            out.status = "completed"
        except Interrupted as e:
            out.status, out.error = "interrupted", f"interrupted by {e}"
        except AgentFailure as e:
            out.status, out.error = "failed", str(e)
            rec.failed = Failed(host=e.host, component=e.component, at_utc=_now(), during=self.during, why=str(e).splitlines()[0])
        except LabError as e:
            out.status, out.error = "failed", f"the lab could not be set up: {e}"
            rec.failed = Failed(host=None, component="lab")
        except RunError as e:
            out.status, out.error = "failed", str(e)
            rec.failed = Failed(host=None, component=e.component or "controller")
        except Exception as e:  # noqa: BLE001 - a bug of loopscope's: the run fails naming the controller, the traceback is kept for the report of it
            import traceback

            where = self.run_dir / "controller-error.txt"
            where.write_text(traceback.format_exc())
            out.status, out.error = "failed", f"the controller failed ({type(e).__name__}: {e}); this is loopscope's bug, the traceback is in {where}"
            rec.failed = Failed(host=None, component="controller")

    def plan(self) -> None:
        """What the run does, start to end (a monitor does its own)."""
        rec = self.rec
        self.bring_up()
        self.calibrate()
        self.start_beside()
        plan = phase_runs(self.exp)
        self.total = len(plan) * len(self.exp.probes)
        self.set_links_start()
        if any(ph.tunings for ph in self.exp.phases or []):
            rec.tunings = []
        for pr in plan:
            self.phase(pr)
        with self.may_lose("the end of the run"):
            self.lab.check()
        self.stop_beside(quiet=False)

    def set_links_start(self) -> None:
        """The links as the experiment sets them (a phase changes them from there)."""

        self.links = link_configs(self.exp)
        self.rec.phase_links = {}

    def bring_up(self) -> None:
        """The hosts, their agents and the run's provenance."""
        exp, lab, rec = self.exp, self.lab, self.rec
        if len(exp.hosts) > 1:
            self.say(f"bringing up {len(exp.hosts)} hosts ({', '.join(f'{n}: {k}' for n, k in self.kinds.items())})")
        lab.up(self.say)
        self.notes.extend(lab.notes)
        if lab.paths:
            rec.paths = dict(lab.paths)
        first = self.first = next(iter(lab.hosts.values()))
        rec.timings["agent_spawn_mono_ns"] = first.agent.spawn_ns if first.agent else None
        rec.timings["agent_ready_mono_ns"] = time.monotonic_ns()
        rec.timings.update(lab.timings)
        rec.agent = AgentRecord(host=first.name, pid=first.pid, cgroup=first.cgroup, cgroup_note=first.hello.cgroup_note if first.hello else None)
        rec.agents = {h.name: HostAgent(kind=h.kind, pid=h.pid, cgroup=h.cgroup, address=h.address) for h in lab.hosts.values()}
        RunDir(self.run_dir).write_provenance(Provenance.model_validate({"controller": {"pid": os.getpid(), "argv": sys.argv, "cwd": os.getcwd()}, "lab": lab.provenance(),
                                                                          "hosts": {h.name: h.hello.provenance for h in lab.hosts.values() if h.hello}}))
        for h in lab.hosts.values():
            if h.cgroup is None:
                self.notes.append(f"{h.name}: loads and probes are not in cgroups ({h.hello.cgroup_note if h.hello else 'no agent'}); CPU use comes from /proc and clean-up relies on process ids")
        self.save()

    def calibrate(self) -> None:
        """Size the sched probes' bursts once, on the idle machine, so every
        phase runs the same work against the same reference."""
        for probe in self.exp.probes:
            got = KINDS[probe.kind].prepare(Steps(self.lab, self.exp, self.calib), probe, self.say)
            if got is not None:
                self.calib[probe.name or ""] = got
        self.rec.calibration = self.calib

    def start_beside(self) -> None:
        """What runs beside the probes for the whole run: clock sync, kernel capture."""
        exp = self.exp
        if clocksync.wanted(exp):
            self.say(f"clock-sync probes: every host against {exp.clocksync.reference or exp.hosts[0].name}, {exp.clocksync.rate:g} pairs/s")
            self.sync_info = clocksync.start(self.lab, exp)
            self.rec.clocksync = self.sync_info.record
            self.save()
        if exp.kernel.capture != "off":
            self.kcap_info = kcapture.start(self.lab, exp, self.notes)
            self.rec.kernel = self.kcap_info.record()
            self.save()

    def stop_beside(self, quiet: bool) -> None:
        """Stop the capture and clock sync (those still running), recording what they say."""
        if self.kcap_info is not None and (not quiet or self.kcap_info.running):
            kcapture.stop(self.lab, self.kcap_info, quiet=quiet, steps=self.rec.steps, notes=self.notes)
            self.rec.kernel = self.kcap_info.record()
        if self.sync_info is not None and (not quiet or self.sync_info.running):
            clocksync.stop(self.lab, self.sync_info, quiet=quiet)
            self.rec.clocksync = self.sync_info.record

    def phase(self, pr: PhaseRun) -> None:
        """One repetition of one phase: its links, tunings and loads, every probe, the loads stopped."""
        by_host, sinks = self.start_phase(pr)
        for probe in self.exp.probes:
            self.step_unless_lost(pr, probe)
        self.stop_loads(pr, by_host, sinks)
        if self.tuned is not None:
            self.notes.extend(f"rep {pr.rep} {pr.phase.name}: a tuning was not restored: {p}" for p in self.tuned.restore())
            self.tuned = None

    def start_phase(self, pr: PhaseRun) -> tuple[LoadsByHost, LoadsByHost]:
        """A phase's links, tunings and loads, then its warm-up: what both
        loops over a lab (a run's steps, a monitor's periods) do before their
        probes. Returns the loads by host and their sinks, for ``stop_loads``."""
        self.set_links(pr)
        by_host, sinks = place_loads(self.lab, self.exp, pr.phase.loads, self.first.name)
        tune_loads(by_host, pr.phase)
        self.apply_tunings(pr)
        by_host = self.start_loads(pr, by_host, sinks)
        if self.exp.warmup:
            _sleep(self.exp.warmup / 1e9)
        return by_host, sinks

    def step_unless_lost(self, pr: PhaseRun, probe: ProbeModel) -> None:
        """The probe's step, unless a host it needs is lost (then the step is
        marked for that host, not run). A host lost during the step that the
        step does not need (found dead by the checks around it) is lost, and
        the step runs again, once."""
        key = f"{pr.key}/{probe.name}"
        for _ in range(2):
            needs = set(self.exp.hosts_of(probe))
            gone = [h for h in needs if self.lab.hosts[h].lost]
            if gone:
                for h in gone:
                    self.lost_step(h, key)
                self.done += 1
                return
            ok = False
            with self.may_lose(f"rep {pr.rep} · {pr.phase.name} · {probe.name}"):
                self.step(pr, probe)
                ok = True
            if ok:
                return
            # a host was lost: the next round marks the step if it needed that host, else runs it again
        self.done += 1

    def stop_loads(self, pr: PhaseRun, by_host: LoadsByHost, sinks: LoadsByHost) -> None:
        """Stop the phase's loads, senders before the sinks they send to, and record what each did."""
        for hname in sorted(by_host, key=lambda h: h in sinks):
            if self.lab.hosts[hname].lost:
                continue
            lr: P.LoadsStopped | None = None
            for _ in range(2):  # a loss elsewhere interrupting it: asked again
                if lr is None and not self.lab.hosts[hname].lost:
                    with self.may_lose(f"rep {pr.rep} · {pr.phase.name} · stopping loads on {hname}"):
                        lr = self.lab.agent(hname).ask(P.StopLoads())
            if lr is None:  # lost: its loads ended with its agent
                continue
            for ld in lr.loads:
                self.rec.loads.append(LoadRecord.model_validate({"rep": pr.rep, "phase": pr.phase.name, "host": hname, **ld.model_dump(mode="json", exclude_unset=True)}))

    def set_links(self, pr: PhaseRun) -> None:
        if not self.exp.links:
            return

        want = link_configs(self.exp, pr.phase)
        self.rec.phase_links[pr.phase.name] = [LinkSetting.model_validate({k: c[k] for k in ("name", "delay_ns", "jitter_ns", "loss", "rate_bps")}) for c in want]
        if want != self.links and self.lab.emulator is not None:
            changed = ", ".join(f"{c['name']} {c['delay_ns'] / 1e6:g} ms" for c, o in zip(want, self.links) if c != o)
            self.say(f"rep {pr.rep} · {pr.phase.name}: links now {changed}")
            self.lab.set_links(want)
            self.links = want

    def apply_tunings(self, pr: PhaseRun) -> None:
        if not pr.phase.tunings:
            return
        self.say(f"rep {pr.rep} · {pr.phase.name}: applying {len(pr.phase.tunings)} tunings")
        self.tuned = tunings.Applied(state.state_dir() / f"{self.run_id}.tunings")
        try:
            self.tuned.apply([t.model_dump() for t in pr.phase.tunings], f"phases.{[p.name for p in self.exp.phases or []].index(pr.phase.name)}")
        finally:
            self.rec.tunings = [*(self.rec.tunings or []), TuningsApplied.model_validate({"rep": pr.rep, "phase": pr.phase.name, "changes": self.tuned.record()})]
            self.save()

    def start_loads(self, pr: PhaseRun, by_host: LoadsByHost, sinks: LoadsByHost) -> LoadsByHost:
        """Start the phase's loads, sinks of network loads first (so the
        streams have somewhere to go); every host with a load or sink."""
        if not by_host:
            return by_host
        self.say(f"[{self.done}/{self.total}] rep {pr.rep} · {pr.phase.name}: starting {', '.join(n for n in pr.phase.loads)}")
        for group in (sinks, by_host):
            for hname, loads in group.items():
                if self.lab.hosts[hname].lost:
                    continue
                with self.may_lose(f"rep {pr.rep} · {pr.phase.name} · starting loads on {hname}"):
                    self.lab.agent(hname).ask(P.StartLoads(step_dir=self.lab.step_dir(hname, pr.key), scratch_dir=self.lab.scratch(hname), loads=loads))
        return {h: [*sinks.get(h, []), *by_host.get(h, [])] for h in {*sinks, *by_host}}

    def step(self, pr: PhaseRun, probe: ProbeModel) -> None:
        """One probe's window: kernel buffers emptied, clock sync at rest while it measures."""
        lab, rec = self.lab, self.rec
        dur = int(probe_seconds(self.exp, probe) * 1e9)
        label = f"rep {pr.rep} · {pr.phase.name} · {probe.name} ({dur / 1e9:g} s)"
        self.during = label
        if self.tick is not None:
            self.tick(self.done, self.total, label)
        else:
            self.say(f"[{self.done}/{self.total}] {label}")
        lab.check()
        # The window starts with empty kernel buffers: what the loads' start and the warm-up recorded is read now.
        kcapture.drain(lab, self.kcap_info, f"r{pr.rep:02d}-{pr.phase.name}-before-{probe.name}")
        # The clock-sync probes rest while the step measures (the estimate bridges it).
        clocksync.pause(lab, self.sync_info, True)
        try:
            step = KINDS[probe.kind].run(Steps(lab, self.exp, self.calib), tuned_probe(probe, pr.phase), pr.key, dur)
        except BaseException:
            try:  # resumed for their stop; the step's own failure is what the run reports
                clocksync.pause(lab, self.sync_info, False)
            except Exception:  # noqa: BLE001
                pass
            raise
        clocksync.pause(lab, self.sync_info, False)
        if "first_probe_spawn_mono_ns" not in rec.timings:
            rec.timings["first_probe_spawn_mono_ns"] = step["spawn_mono_ns"]
        rec.steps.append(Step.model_validate({"rep": pr.rep, "phase": pr.phase.name, "loads": list(pr.phase.loads), "probe": probe.name, "kind": probe.kind, **step}))
        if step.get("interrupted"):
            # kept, cut short: the run ends here, through its clean-up
            self.save()
            raise Interrupted(str(step["interrupted"]))
        # Between windows: the kernel capture's reader runs now, not while a probe measures.
        kcapture.drain(lab, self.kcap_info, f"r{pr.rep:02d}-{pr.phase.name}-{probe.name}")
        self.done += 1
        self.save()
        if self.tick is not None:
            self.tick(self.done, self.total, label)

    @contextmanager
    def may_lose(self, during: str, step: str | None = None) -> Iterator[None]:
        """Under ``on_host_failure: continue``, a failure whose cause is a host
        whose agent is gone (its launcher exited, its connection dropped, it
        was killed) loses that host, and the run goes on with the others; any
        other failure, or every host gone, fails the run as under ``stop``."""
        self.during = during
        try:
            yield
        except AgentFailure as e:
            if self.exp.on_host_failure != "continue":
                raise
            dead = [h for h in self.lab.hosts.values() if h.lost is None and h.agent is not None and (h.agent.dead is not None or not h.agent.ch.alive())]
            if not dead or len(dead) == sum(1 for h in self.lab.hosts.values() if h.lost is None):
                raise
            for h in dead:
                self.lose(h.name, during, h.agent.dead if h.agent is not None and h.agent.dead else str(e).splitlines()[0], step)

    def lose(self, host: str, during: str, why: str, step: str | None) -> None:
        """Go on without ``host``: its agent stopped, what ran beside the
        probes there (kernel capture, clock sync) ended, its loss recorded."""
        h = self.lab.hosts[host]
        h.lost = why
        if h.agent is not None:
            try:
                h.agent.terminate()
            except Exception:  # noqa: BLE001 - it is gone already; this only makes sure
                pass
        if self.kcap_info is not None and host in self.kcap_info.running:
            self.kcap_info.running.remove(host)
            self.notes.append(f"the kernel capture on {host} ended with it (the hosts it covered have no kernel events after {_now()})")
        if self.sync_info is not None:
            self.sync_info.running = [(x, n) for x, n in self.sync_info.running if x != host]
            if host == (self.exp.clocksync.reference or self.exp.hosts[0].name):
                self.notes.append(f"host {host} was the clock-sync reference: the other hosts' offsets after its loss are extrapolated from before it")
        # assigned, not appended: the record keeps only the fields set
        self.rec.lost_hosts = [*self.rec.lost_hosts, LostHost(host=host, at_utc=_now(), during=during, why=why, steps=[step] if step else [])]
        self.notes.append(f"host {host} was lost during {during} ({why}); the run went on without it (on_host_failure: continue)")
        self.say(f"host {host} lost during {during}: {why}; going on without it")
        self.save()

    def lost_step(self, host: str, step: str) -> None:
        for lh in self.rec.lost_hosts:
            if lh.host == host and step not in lh.steps:
                lh.steps.append(step)

    def teardown(self) -> None:
        """Give everything back, whatever happened: tunings, capture, clock
        sync, the lab, stray processes, scratch; then the record's last word."""
        out, rec, lab = self.out, self.rec, self.lab
        if out.status == "running":
            out.status, out.error = "failed", out.error or "the controller stopped unexpectedly"
        try:
            rec.lab_tids = lab.lab_tids()
        except Exception:  # noqa: BLE001 - naming the lab's threads must not fail the clean-up
            pass
        if self.tuned is not None:
            self.notes.extend(f"a tuning was not restored: {p}" for p in self.tuned.restore())
        self.stop_beside(quiet=True)
        lab.down(out.status == "completed", self.notes)
        rec.timings.update(lab.timings)
        if lab.emulator_result is not None:
            rec.emulator = EmulatorRecord.model_validate({"json": "netem/netem.json", "trace": "netem/netem.lstrace"})
        if lab.router_counts is not None:
            rec.router_kernel = lab.router_counts
        for pid in procs.pids_of_run(self.run_id):
            try:
                os.kill(pid, signal.SIGKILL)
            except ProcessLookupError:
                pass
        for h in lab.hosts.values():
            if not h.remote:
                shutil.rmtree(Path(h.base) / "scratch", ignore_errors=True)
        if rec.tunings:
            self.tunings_into_provenance()
        rec.status = out.status
        rec.error = out.error
        rec.ended_utc = _dt.datetime.now(_dt.timezone.utc).isoformat()
        self.save()
        write_index(self.run_dir)
        state.unregister(self.run_id)
        if self.reaper is not None:
            self.reaper.release()

    def tunings_into_provenance(self) -> None:
        """What the phases changed on this machine, old and new, beside the rest of its provenance."""
        rd = RunDir(self.run_dir)
        if not rd.provenance_json.exists():
            return
        prov = rd.provenance()
        prov.tunings = [t.model_dump(mode="json", exclude_unset=True) for t in self.rec.tunings or []]
        rd.write_provenance(prov)


def place_loads(lab: Lab, exp: Experiment, names: list[str], default_host: str) -> tuple[LoadsByHost, LoadsByHost]:
    """The phase's loads by host, and the sinks their network loads need: a
    net load whose ``dest`` names a host of the experiment (``h4:9000``)
    sends to that host's address, where a sink is started for it."""
    by_host: LoadsByHost = {}
    sinks: LoadsByHost = {}
    for n in names:
        ld = exp.load(n)
        d = ld.model_dump(mode="json")
        if ld.kind == "net" and ld.dest:
            host, _, port = ld.dest.rpartition(":")
            if host in lab.hosts:
                d["dest"] = f"{lab.hosts[host].address}:{port}"
                bind = f"{'0.0.0.0' if lab.hosts[host].remote else lab.hosts[host].address}:{port}"
                sinks.setdefault(host, []).append({"kind": "sink", "name": f"{ld.name}-sink", "level": 1, "protocol": ld.protocol, "bind": bind})
        by_host.setdefault(ld.host or default_host, []).append(d)
    return by_host, sinks


def tune_loads(by_host: LoadsByHost, phase: Any) -> None:
    """The phase's placement and scheduling tunings of its loads, for the agents to apply."""
    for t in phase.tunings:
        for loads in by_host.values():
            for d in loads:
                d.update(t.for_load(d["name"]))


def tuned_probe(probe: ProbeModel, phase: Any) -> Any:
    """The probe as this phase runs it: its CPUs or priority as the phase's tunings say."""
    update: dict[str, object] = {}
    for t in phase.tunings:
        update.update(t.for_probe(probe.name))
    return probe.model_copy(update=update) if update else probe


class StepHelpers:
    """The processes of one step (``kinds.base.Helpers``): started through
    the host's agent, stopped in reverse on the way out."""

    def __init__(self, lab: Lab, key: str) -> None:
        self.lab, self.key = lab, key
        self._running: list[tuple[str, str]] = []

    def start(self, host: str, spec: dict[str, Any], *, duration_ns: int | None = None, wait_ready: bool = False) -> None:
        lab = self.lab
        req = P.StartProbe(probe=spec, step_dir=lab.step_dir(host, self.key), scratch_dir=lab.scratch(host), wait_ready=wait_ready)
        if duration_ns is not None:
            req.duration_ns = duration_ns
        lab.agent(host).ask(req)
        self._running.append((host, spec["name"]))

    def stop(self, host: str, name: str) -> Collected:
        lab = self.lab
        r = lab.agent(host).ask(P.StopProbe(name=name))
        self._running.remove((host, name))
        return Collected(name=name, host=host, trace=lab.rel(host, r.trace), json=lab.rel(host, f"{lab.step_dir(host, self.key)}/{name}.json"),
                       command=r.command, cpu_usec=r.cpu_usec, spawn_mono_ns=r.spawn_mono_ns, end_mono_ns=r.end_mono_ns, result=r.result)

    def running(self) -> list[tuple[str, str]]:
        return list(self._running)

    def stop_rest(self) -> None:
        """Stop what is still running, briefly and quietly: the step is
        leaving on a failure, and this must not hide it."""
        for host, name in reversed(self._running):
            try:
                self.lab.agent(host).ask(P.StopProbe(name=name, timeout_s=3))
            except Exception:  # noqa: BLE001 - stopping what is left must not hide the first failure
                pass
        self._running.clear()


class Steps:
    """What a probe kind gets to run its steps (``kinds.base.StepContext``)."""

    def __init__(self, lab: Lab, exp: Experiment, calibration: dict[str, dict[str, int]]) -> None:
        self.lab, self.exp, self.calibration = lab, exp, calibration
        self.run_id = lab.run_id
        self.hosts = {n: HostView(n, h.address, h.remote) for n, h in lab.hosts.items()}

    @property
    def first_host(self) -> str:
        return next(iter(self.lab.hosts))

    @contextmanager
    def helpers(self, key: str) -> Iterator[StepHelpers]:
        hs = StepHelpers(self.lab, key)
        try:
            yield hs
        finally:
            hs.stop_rest()

    def calibrate(self, probe: ProbeModel) -> dict[str, Any]:
        lab = self.lab
        host = probe.hosts(self.first_host)[0]
        r = lab.agent(host).ask(P.RunProbe(probe=probe.model_dump(mode="json"), step_dir=lab.step_dir(host, "calibration"), scratch_dir=lab.scratch(host),
                                           duration_ns=int(probe.seconds(self.exp.duration) * 1e9), calibrate=True))
        return r.result

    def check(self) -> None:
        self.lab.check()

    def channel_stats(self, host: str, key: str, name: str) -> str | None:
        return self.lab.rel(host, hubs.stats_path(self.lab, host, key, name)) if self.exp.channels else None

    def sleep(self, seconds: float) -> None:
        _sleep(seconds)

    def window(self, watch: dict[str, list[str]], until: tuple[str, str] | None, timeout_s: float) -> tuple[bool, list[tuple[str, str]]]:
        from loopscope.lab import window

        return window.sleep_through(self.lab, watch, until, timeout_s)

    def with_hosts(self, command: list[str]) -> list[str]:
        return [re.sub(HOST_REF, lambda m: self.lab.hosts[m.group(1)].address or "127.0.0.1", a) for a in command]

    def channel_env(self, host: str, key: str, name: str) -> dict[str, str]:
        if not self.exp.channels:
            return {}
        return {"LOOPSCOPE_CHANNELS": hubs.env_for(self.lab, self.exp), "LOOPSCOPE_CHANNEL_STATS": hubs.stats_path(self.lab, host, key, name)}

    def hubs_start(self, probe: str, key: str, dur_ns: int) -> list[Any]:
        return hubs.start(self.lab, self.exp, probe, key, dur_ns) if self.exp.channels else []

    def hubs_check(self, running: list[Any]) -> None:
        hubs.check(self.lab, running)

    def hubs_stop(self, running: list[Any], quiet: bool = False) -> list[HubStep]:
        return hubs.stop(self.lab, running, quiet=quiet) if running else []

    def failure(self, what: str, host: str, component: str) -> Exception:
        return AgentFailure(what, host=host, component=component)

    def run_one(self, probe: ProbeModel, spec: dict[str, Any], key: str, dur_ns: int) -> dict[str, Any]:
        """``spec`` as one process on the probe's host, with the channel hubs
        running beside it when the experiment has channels and the kind uses them."""
        lab = self.lab
        hname = probe.hosts(next(iter(lab.hosts)))[0]
        channels = bool(self.exp.channels) and probe.uses_channels
        running: list[Any] = []
        if channels:
            spec = {**spec, "env": {**spec.get("env", {}), **self.channel_env(hname, key, probe.label)}}
            running = self.hubs_start(probe.label, key, dur_ns)
        cut: str | None = None
        try:
            agent = lab.agent(hname)
            req = P.RunProbe(probe=spec, step_dir=lab.step_dir(hname, key), scratch_dir=lab.scratch(hname), duration_ns=dur_ns)
            rid = agent.post(req)
            try:
                r = agent.answer(req, rid)
            except Interrupted as e:
                r, cut = self.cut_short(hname, req, rid, e), str(e)
            hub_parts = self.hubs_stop(running)
        finally:
            self.hubs_stop(running, quiet=True)
        step: dict[str, object] = {
            "host": hname,
            "trace": lab.rel(hname, r.trace),
            "json": lab.rel(hname, f"{lab.step_dir(hname, key)}/{probe.name}.json"),
            "command": r.command,
            "cpu_usec": r.cpu_usec,
            "spawn_mono_ns": r.spawn_mono_ns,
            "end_mono_ns": r.end_mono_ns,
        }
        if channels:
            step["hubs"] = hub_parts
            step["channel_stats"] = lab.rel(hname, hubs.stats_path(lab, hname, key, probe.label))
        if cut is not None:
            step["interrupted"] = cut
        return step

    def cut_short(self, hname: str, req: P.RunProbe, rid: int, why: Interrupted) -> P.ProbeDone:
        """Ctrl-C or SIGTERM inside a window: the probe is told to stop as at
        its window's end (its agent passes SIGUSR1 on as SIGINT) and what it
        measured until then is the step's result, within ``CUT_SHORT_S``; a
        host whose agent this controller cannot signal (over ssh), or a probe
        that cannot stop early, ends the run without the step."""
        h = self.lab.hosts[hname]
        if h.remote or h.hello is None:
            raise why
        try:
            os.kill(h.hello.pid, signal.SIGUSR1)
            return self.lab.agent(hname).answer(req, rid, timeout=CUT_SHORT_S)
        except (OSError, AgentFailure):
            raise why from None


def run(
    spec_path: str,
    *,
    results: str | None = None,
    run_dir: str | None = None,
    say: Say = lambda s: None,
    tick: Tick | None = None,
    duration: int | None = None,
    repetitions: int | None = None,
    kernel_capture: bool = True,
) -> Outcome:
    exp = load(spec_path, KINDS)
    if not kernel_capture:
        exp.kernel.capture = "off"
    if duration is not None:
        exp.duration = duration
        for p in exp.probes:
            if getattr(p, "duration", None) is not None:
                setattr(p, "duration", duration)  # the kinds that have one
    if repetitions is not None:
        exp.repetitions = repetitions
    # A program probe on this machine's file system starts where the
    # experiment file is, so its command can name files next to it.
    kind_of = {h.name: h.kind for h in exp.hosts}
    here = str(Path(spec_path).resolve().parent)
    for p in exp.probes:
        for q in KINDS[p.kind].local_programs(p):
            if q.cwd is None and kind_of.get(q.host or exp.hosts[0].name) not in REMOTE:
                q.cwd = here
    text = Path(spec_path).read_text()
    res = Path(results or exp.results)
    rd = Path(run_dir) if run_dir else None
    notes, kinds = preflight(exp, spec_path, res, rd)
    if duration is not None or repetitions is not None or not kernel_capture:
        over = ", ".join(x for x in (duration is not None and f"duration {duration / 1e9:g} s", repetitions is not None and f"{repetitions} repetitions",
                                     not kernel_capture and "no kernel capture") if x)
        notes.append(f"overridden on the command line: {over} (spec.json holds what ran)")
    for n in notes:
        say(f"note: {n}")
    target = rd or new_run_dir(res, exp.name)
    try:
        target.parent.mkdir(parents=True, exist_ok=True)
    except OSError as e:
        raise InputError(f"{target.parent}: cannot create the results directory: {e.strerror}") from None
    return execute(exp, text, target, say, notes, tick, kinds)
