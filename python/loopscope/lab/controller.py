"""The controller: ``loopscope run SPEC``, the run's loop over a lab session.

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

The lab's life cycle is ``session.py``'s (the monitor drives the same
session with its own loop); however the run ends, the same ``finally`` runs: the lab comes down (agents
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
import os
import shutil
from pathlib import Path
from typing import TYPE_CHECKING, Callable

from loopscope.probes.params import Params
from loopscope.errors import InputError
from loopscope.rundir import Step
from loopscope.lab import clocksync, kcapture
from loopscope.lab.lab import resolve_hosts
from loopscope.kinds import KINDS
from loopscope.spec import Experiment, load
from loopscope.spec.load import where
from loopscope.spec.models import REMOTE
from loopscope.spec.plan import PhaseRun, phase_runs, probe_seconds
from loopscope.lab.lab import check
from loopscope.lab import session
from loopscope.lab.session import Outcome, Say, Session, tuned_probe
from loopscope.lab.steps import Interrupted, Steps

if TYPE_CHECKING:
    from loopscope.spec.models import ProbeModel

Tick = Callable[[int, int, str], None]


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
                problems.append(
                    f"{where(file, f'loads.{i}.level')}: loads.{i}.level: a command load's level is a number of copies, not a duty cycle [got {ld.level}]"
                )
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


def execute(
    exp: Experiment, spec_text: str, run_dir: Path, say: Say, notes: list[str], tick: Tick | None = None, kinds: dict[str, str] | None = None
) -> Outcome:
    """Run the experiment into ``run_dir``; whatever happens, the lab comes
    down and ``run.json`` says how the run ended. Ctrl-C and SIGTERM end
    the run through the same clean-up."""
    return session.execute(RunLoop(Session(exp, spec_text, run_dir, say, notes, kinds), tick))


class RunLoop:
    """``loopscope run``'s loop over a session: every repetition of every
    phase (its links, tunings and loads, every probe in turn, the loads
    stopped), with the progress said as it goes."""

    def __init__(self, session: Session, tick: Tick | None = None) -> None:
        self.session, self.tick = session, tick
        self.exp = session.exp
        self.done = 0
        self.total = 0

    def plan(self) -> None:
        """What the run does, start to end."""
        rec = self.session.rec
        self.session.bring_up()
        self.session.calibrate()
        self.session.start_beside()
        plan = phase_runs(self.exp)
        self.total = len(plan) * len(self.exp.probes)
        self.session.set_links_start()
        if any(ph.tunings for ph in self.exp.phases or []):
            rec.tunings = []
        for pr in plan:
            self.phase(pr)
        with self.session.may_lose("the end of the run"):
            self.session.lab.check()
        self.session.stop_beside(quiet=False)

    def phase(self, pr: PhaseRun) -> None:
        """One repetition of one phase: its links, tunings and loads, every probe, the loads stopped."""
        by_host, sinks = self.session.start_phase(pr, pr.key, f"[{self.done}/{self.total}] rep {pr.rep} · {pr.phase.name}: ")
        for probe in self.exp.probes:
            self.step_unless_lost(pr, probe)
        self.session.end_phase(pr, by_host, sinks)

    def step_unless_lost(self, pr: PhaseRun, probe: ProbeModel) -> None:
        """The probe's step, unless a host it needs is lost (then the step is
        marked for that host, not run). A host lost during the step that the
        step does not need (found dead by the checks around it) is lost, and
        the step runs again, once."""
        key = f"{pr.key}/{probe.name}"
        for _ in range(2):
            needs = set(self.exp.hosts_of(probe))
            gone = [h for h in needs if self.session.lab.hosts[h].lost]
            if gone:
                for h in gone:
                    self.session.lost_step(h, key)
                self.done += 1
                return
            ok = False
            with self.session.may_lose(f"rep {pr.rep} · {pr.phase.name} · {probe.name}"):
                self.step(pr, probe)
                ok = True
            if ok:
                return
            # a host was lost: the next round marks the step if it needed that host, else runs it again
        self.done += 1

    def step(self, pr: PhaseRun, probe: ProbeModel) -> None:
        """One probe's window: kernel buffers emptied, clock sync at rest while it measures."""
        lab, rec = self.session.lab, self.session.rec
        dur = int(probe_seconds(self.exp, probe) * 1e9)
        label = f"rep {pr.rep} · {pr.phase.name} · {probe.name} ({dur / 1e9:g} s)"
        self.session.during = label
        if self.tick is not None:
            self.tick(self.done, self.total, label)
        else:
            self.session.say(f"[{self.done}/{self.total}] {label}")
        lab.check()
        # The window starts with empty kernel buffers: what the loads' start and the warm-up recorded is read now.
        kcapture.drain(lab, self.session.kcap_info, f"r{pr.rep:02d}-{pr.phase.name}-before-{probe.name}")
        # The clock-sync probes rest while the step measures (the estimate bridges it).
        clocksync.pause(lab, self.session.sync_info, True)
        try:
            step = KINDS[probe.kind].run(Steps(lab, self.exp, self.session.calib), tuned_probe(probe, pr.phase), pr.key, dur)
        except BaseException:
            try:  # resumed for their stop; the step's own failure is what the run reports
                clocksync.pause(lab, self.session.sync_info, False)
            except Exception:  # noqa: BLE001
                pass
            raise
        clocksync.pause(lab, self.session.sync_info, False)
        if "first_probe_spawn_mono_ns" not in rec.timings:
            rec.timings["first_probe_spawn_mono_ns"] = step["spawn_mono_ns"]
        rec.steps.append(
            Step.model_validate({"rep": pr.rep, "phase": pr.phase.name, "loads": list(pr.phase.loads), "probe": probe.name, "kind": probe.kind, **step})
        )
        if step.get("interrupted"):
            # kept, cut short: the run ends here, through its clean-up
            self.session.save()
            raise Interrupted(str(step["interrupted"]))
        # Between windows: the kernel capture's reader runs now, not while a probe measures.
        kcapture.drain(lab, self.session.kcap_info, f"r{pr.rep:02d}-{pr.phase.name}-{probe.name}")
        self.done += 1
        self.session.save()
        if self.tick is not None:
            self.tick(self.done, self.total, label)

    def teardown(self) -> None:
        self.session.teardown()


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
        over = ", ".join(
            x
            for x in (
                duration is not None and f"duration {duration / 1e9:g} s",
                repetitions is not None and f"{repetitions} repetitions",
                not kernel_capture and "no kernel capture",
            )
            if x
        )
        notes.append(f"overridden on the command line: {over} (spec.json holds what ran)")
    for n in notes:
        say(f"note: {n}")
    target = rd or new_run_dir(res, exp.name)
    try:
        target.parent.mkdir(parents=True, exist_ok=True)
    except OSError as e:
        raise InputError(f"{target.parent}: cannot create the results directory: {e.strerror}") from None
    return execute(exp, text, target, say, notes, tick, kinds)
