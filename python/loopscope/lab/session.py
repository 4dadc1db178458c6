"""One lab session: the life cycle ``loopscope run`` and ``loopscope monitor`` share.

A ``Session`` is the lab of one run directory from its record's first line
to its last: hosts up (``bring_up``), the sched probes' bursts sized
(``calibrate``), clock sync and the kernel capture beside the probes
(``start_beside``), a phase's links, tunings and loads (``start_phase``,
``end_phase``), hosts lost under ``on_host_failure: continue``
(``may_lose``), and ``teardown`` on every way out. Two loops drive it: the
run's phases × repetitions (``controller.RunLoop``) and the monitor's periods
until stopped (``monitor.run.Monitor``). ``execute`` runs a loop: its plan,
Ctrl-C and SIGTERM turned into ``Interrupted``, how it failed said, then the
loop's teardown and the session's. Neither loop subclasses the other; what
they share is here, and settings reach the probes as typed values
(``Lab.probe_env``, carried by each agent's hello).
"""

from __future__ import annotations

import datetime as _dt
import hashlib
import json
import os
import shutil
import signal
import sys
import time
from contextlib import contextmanager
from dataclasses import dataclass, field
from pathlib import Path
from typing import TYPE_CHECKING, Any, Callable, Iterator, Protocol

from loopscope import protocol as P
from loopscope import selfname
from loopscope.errors import RunError
from loopscope.host import procs
from loopscope.kernel import tracing
from loopscope.kinds import KINDS
from loopscope.lab import clocksync, kcapture, state
from loopscope.lab.emulator import link_configs
from loopscope.lab.hosts import AgentFailure
from loopscope.lab.lab import Lab, LabError, resolve_hosts
from loopscope.lab.reaper import Reaper
from loopscope.lab.steps import Interrupted, Steps, sleep
from loopscope.lab.tuned import KernelTunings
from loopscope.rundir import AgentRecord, EmulatorRecord, Failed, HostAgent, LinkSetting, LoadRecord, LostHost, Provenance, RunDir, RunRecord, TuningsApplied
from loopscope.spec import Experiment
from loopscope.spec.plan import PhaseRun

if TYPE_CHECKING:
    from loopscope.spec.models import Phase, ProbeModel

Say = Callable[[str], None]

# A phase's loads placed on their hosts (each a load's request), and likewise their sinks.
LoadsByHost = dict[str, list[dict[str, Any]]]


@dataclass
class Outcome:
    run_dir: Path
    status: str
    error: str | None = None
    notes: list[str] = field(default_factory=list)


class Loop(Protocol):
    """What drives a session: its plan (everything between bring-up and
    teardown) and its own teardown (before the session's)."""

    session: "Session"

    def plan(self) -> None: ...

    def teardown(self) -> None: ...


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


def now() -> str:
    return _dt.datetime.now(_dt.timezone.utc).isoformat(timespec="milliseconds")


def execute(loop: Loop) -> Outcome:
    """``loop``'s plan over its session, then its teardown and the session's on every way out."""
    s = loop.session
    prev_int = signal.getsignal(signal.SIGINT)
    prev_term = signal.getsignal(signal.SIGTERM)

    def interrupted(signum: int, frame: object) -> None:
        raise Interrupted(signal.Signals(signum).name)

    own_name = selfname.current()
    selfname.set_comm("ls-ctl")  # attribution names the controller among the lab's own
    signal.signal(signal.SIGINT, interrupted)
    signal.signal(signal.SIGTERM, interrupted)
    try:
        s.body(loop.plan)
    finally:
        signal.signal(signal.SIGINT, signal.SIG_IGN)
        signal.signal(signal.SIGTERM, signal.SIG_IGN)
        try:
            loop.teardown()
        finally:
            signal.signal(signal.SIGINT, prev_int)
            signal.signal(signal.SIGTERM, prev_term)
            if own_name:
                selfname.set_comm(own_name)
    return s.out


class Session:
    """One lab's life cycle, under either loop: the run directory and the
    record it writes (``run.json``), the lab, what runs beside the probes
    (clock sync, kernel capture), a phase's links, tunings and loads, hosts
    lost under ``on_host_failure: continue``. ``execute`` runs a loop's plan
    over it and classifies how it failed; ``teardown`` gives everything back
    on every way out."""

    def __init__(self, exp: Experiment, spec_text: str, run_dir: Path, say: Say, notes: list[str], kinds: dict[str, str] | None) -> None:
        self.exp, self.run_dir, self.say, self.notes = exp, run_dir, say, notes
        self.run_id = run_dir.name
        run_dir.mkdir(parents=True)
        (run_dir / "spec.yaml").write_text(spec_text)
        _write_json(run_dir / "spec.json", exp.model_dump(mode="json", by_alias=True))
        self.kinds = kinds or resolve_hosts(exp)[0]
        self.rec = RunRecord(
            run_id=self.run_id,
            name=exp.name,
            status="running",
            started_utc=_dt.datetime.now(_dt.timezone.utc).isoformat(),
            controller_pid=os.getpid(),
            command=sys.argv,
            notes=notes,
            hosts={h.name: self.kinds[h.name] for h in exp.hosts},
            steps=[],
            loads=[],
            timings={},
        )
        self.save()
        state.register(
            state.RunState(
                run_id=self.run_id, run_dir=str(run_dir.resolve()), controller_pid=os.getpid(), controller_start=procs.process_start_time(os.getpid())
            )
        )
        self.lab = Lab(exp, self.run_id, run_dir, self.kinds)
        # namespaces and tunings outlive a killed controller: the reaper gives them back
        self.reaper = Reaper(self.run_id) if self.lab.topo is not None or any(ph.tunings for ph in exp.phases or []) else None
        self.tuned: KernelTunings | None = None
        self.out = Outcome(run_dir, "running", notes=notes)
        self.sync_info: clocksync.SyncRun | None = None
        self.kcap_info: kcapture.CaptureRun | None = None
        self.calib: dict[str, dict[str, int]] = {}
        #: each started load's cgroup and processes, by name (the monitor names its threads from them)
        self.load_groups: dict[str, tuple[Path | None, list[int]]] = {}
        #: a lost host's restarts so far (a monitor's), by name
        self.revived: dict[str, int] = {}
        #: each started load's host, by name
        self._load_host: dict[str, str] = {}
        #: what the run is doing now (a failure or a lost host says it)
        self.during = "bringing up the lab"

    def save(self) -> None:
        """Write the record as it stands (the notes said so far included)."""
        self.rec.notes = list(self.notes)
        RunDir(self.run_dir).write_record(self.rec)

    def body(self, plan: Callable[[], None]) -> None:
        """A loop's plan over the lab, and how it ended (``out.status``, ``run.json``'s ``failed``)."""
        out, rec = self.out, self.rec
        try:
            plan()
            out.status = "completed"
        except Interrupted as e:
            out.status, out.error = "interrupted", f"interrupted by {e}"
        except AgentFailure as e:
            out.status, out.error = "failed", str(e)
            rec.failed = Failed(host=e.host, component=e.component, at_utc=now(), during=self.during, why=str(e).splitlines()[0])
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
        RunDir(self.run_dir).write_provenance(
            Provenance.model_validate(
                {
                    "controller": {"pid": os.getpid(), "argv": sys.argv, "cwd": os.getcwd()},
                    "lab": lab.provenance(),
                    "hosts": {h.name: h.hello.provenance for h in lab.hosts.values() if h.hello},
                }
            )
        )
        for h in lab.hosts.values():
            if h.cgroup is None:
                self.notes.append(
                    f"{h.name}: loads and probes are not in cgroups ({h.hello.cgroup_note if h.hello else 'no agent'}); CPU use comes from /proc and clean-up relies on process ids"
                )
        self.save()
        if any(ph.tunings for ph in exp.phases or []):
            # each kernel the preflight could not reach checks the phases' tunings now, before any is made
            here = any(not h.remote for h in lab.hosts.values())
            KernelTunings(lab, self.run_id).check(exp.phases or [], checked_here=here)

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
        if exp.wants_clocksync():
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

    def start_phase(self, pr: PhaseRun, key: str, label: str, skip: set[str] = set()) -> tuple[LoadsByHost, LoadsByHost]:
        """A phase's links, tunings and loads, then its warm-up: what both
        loops over a lab (a run's steps, a monitor's periods) do before their
        probes. The loads write into the step directories named ``key``;
        ``label`` starts the line that says so. Returns the loads by host and
        their sinks, for ``stop_loads``. Loads on the hosts in ``skip`` are
        left to those hosts (a monitor's far hosts start their own)."""
        self.set_links(pr)
        by_host, sinks = place_loads(self.lab, self.exp, pr.phase.loads, self.first.name)
        by_host = {h: v for h, v in by_host.items() if h not in skip}
        sinks = {h: v for h, v in sinks.items() if h not in skip}
        tune_loads(by_host, pr.phase)
        self.apply_tunings(pr)
        by_host = self.start_loads(pr, by_host, sinks, key, label)
        if self.exp.warmup:
            sleep(self.exp.warmup / 1e9)
        return by_host, sinks

    def end_phase(self, pr: PhaseRun, by_host: LoadsByHost, sinks: LoadsByHost) -> None:
        """The phase's loads stopped and its tunings given back."""
        self.stop_loads(pr, by_host, sinks)
        if self.tuned is not None:
            self.notes.extend(f"rep {pr.rep} {pr.phase.name}: a tuning was not restored: {p}" for p in self.tuned.restore())
            self.tuned = None

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
                self.rec.loads.append(
                    LoadRecord.model_validate({"rep": pr.rep, "phase": pr.phase.name, "host": hname, **ld.model_dump(mode="json", exclude_unset=True)})
                )

    def set_links(self, pr: PhaseRun) -> None:
        if not self.exp.links:
            return

        want = link_configs(self.exp, pr.phase)
        self.rec.phase_links[pr.phase.name] = [
            LinkSetting.model_validate({k: c[k] for k in ("name", "delay_ns", "jitter_ns", "loss", "rate_bps")}) for c in want
        ]
        if want != self.links and self.lab.emulator is not None:
            changed = ", ".join(f"{c['name']} {c['delay_ns'] / 1e6:g} ms" for c, o in zip(want, self.links) if c != o)
            self.say(f"rep {pr.rep} · {pr.phase.name}: links now {changed}")
            self.lab.set_links(want)
            self.links = want

    def apply_tunings(self, pr: PhaseRun) -> None:
        if not pr.phase.tunings:
            return
        self.say(f"rep {pr.rep} · {pr.phase.name}: applying {len(pr.phase.tunings)} tunings")
        self.tuned = KernelTunings(self.lab, self.run_id)
        try:
            self.tuned.apply(pr.phase, f"phases.{[p.name for p in self.exp.phases or []].index(pr.phase.name)}")
        finally:
            self.rec.tunings = [
                *(self.rec.tunings or []),
                *(
                    TuningsApplied.model_validate({"rep": pr.rep, "phase": pr.phase.name, **({"host": h} if h else {}), "changes": changes})
                    for h, changes in self.tuned.applied
                ),
            ]
            self.save()

    def start_loads(self, pr: PhaseRun, by_host: LoadsByHost, sinks: LoadsByHost, key: str, label: str) -> LoadsByHost:
        """Start the phase's loads, sinks of network loads first (so the
        streams have somewhere to go); every host with a load or sink. Where
        each load's threads are is kept (``load_groups``)."""
        if not by_host:
            return by_host
        self.say(f"{label}starting {', '.join(n for n in pr.phase.loads)}")
        for group in (sinks, by_host):
            for hname, loads in group.items():
                if self.lab.hosts[hname].lost:
                    continue
                with self.may_lose(f"rep {pr.rep} · {pr.phase.name} · starting loads on {hname}"):
                    r = self.lab.agent(hname).ask(P.StartLoads(step_dir=self.lab.step_dir(hname, key), scratch_dir=self.lab.scratch(hname), loads=loads))
                    for ld in r.loads:
                        self.load_groups[ld.name] = (Path(ld.cgroup) if ld.cgroup else None, list(ld.pids))
                        self._load_host[ld.name] = hname
        return {h: [*sinks.get(h, []), *by_host.get(h, [])] for h in {*sinks, *by_host}}

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
            self.notes.append(f"the kernel capture on {host} ended with it (the hosts it covered have no kernel events after {now()})")
        if self.sync_info is not None:
            self.sync_info.running = [(x, n) for x, n in self.sync_info.running if x != host]
            if host == (self.exp.clocksync.reference or self.exp.hosts[0].name):
                self.notes.append(f"host {host} was the clock-sync reference: the other hosts' offsets after its loss are extrapolated from before it")
        # assigned, not appended: the record keeps only the fields set
        self.rec.lost_hosts = [*self.rec.lost_hosts, LostHost(host=host, at_utc=now(), during=during, why=why, steps=[step] if step else [])]
        self.notes.append(f"host {host} was lost during {during} ({why}); the run went on without it (on_host_failure: continue)")
        self.say(f"host {host} lost during {during}: {why}; going on without it")
        self.save()

    def revive(self, host: str) -> bool:
        """A lost host's agent started again through its launcher (a monitor
        does this before each period under ``on_host_failure: continue``);
        whether it is back. Its loads are not started again (the notes say so)."""
        self.revived[host] = n = self.revived.get(host, 0) + 1
        try:
            self.lab.restart(host, self.say, n)
        except Exception as e:  # noqa: BLE001 - it stays lost; the next period tries again
            if n == 1:
                self.say(f"host {host} could not be started again ({str(e).splitlines()[0][:200]}); trying again before each period")
            return False
        for lh in self.rec.lost_hosts:
            if lh.host == host and lh.back_utc is None:
                lh.back_utc = now()
        loads = [n for n, (_g, _p) in self.load_groups.items() if self._load_host.get(n) == host]
        self.notes.append(
            f"host {host} is back at {now()} (its agent started again through its launcher, attempt {n})"
            + (f"; its loads ({', '.join(loads)}) were not started again" if loads else "")
        )
        self.say(f"host {host} is back")
        self.save()
        return True

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
        # an agent killed outright left its kernel capture recording (this kernel's: its readers are gone now)
        for name in tracing.run_instances(self.run_id):
            tracing.remove_instance(name)
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


def tune_loads(by_host: LoadsByHost, phase: Phase) -> None:
    """The phase's placement and scheduling tunings of its loads, for the agents to apply."""
    for t in phase.tunings:
        for loads in by_host.values():
            for d in loads:
                d.update(t.for_load(d["name"]))


def tuned_probe(probe: ProbeModel, phase: Phase) -> ProbeModel:
    """The probe as this phase runs it: its CPUs or priority as the phase's tunings say."""
    update: dict[str, object] = {}
    for t in phase.tunings:
        update.update(t.for_probe(probe.name or ""))
    return probe.model_copy(update=update) if update else probe
