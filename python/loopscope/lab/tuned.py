"""A phase's tunings on every kernel of the lab.

Tunings change a kernel's settings, so they are made once per kernel, as
the kernel capture records once per kernel (``lab/kcapture.py`` groups the
hosts by their agents' boot ids). This machine's kernel (its netns and
local hosts, and the ssh or exec hosts that turn out to run on it) is tuned
here by the controller, with the journal in this machine's state directory
and the reaper to give it back if the controller is killed. Another kernel
is tuned by the agent of one of its hosts, with the journal on that host
(``host/tunings.py``): the agent gives everything back when the phase ends,
when the lab stops it, and when the controller's connection drops; if the
agent itself is killed, ``loopscope cleanup`` on that host gives it back
from the journal, whose owner is gone.

Once the agents are up, each kernel not checked at preflight checks every
phase's tunings against its own machine (an IRQ, an idle state or a file it
lacks), so no phase starts with a tuning one kernel cannot make.
"""

from __future__ import annotations

from dataclasses import dataclass, field

from loopscope import protocol as P
from loopscope.host import tunings
from loopscope.lab import kcapture, state
from loopscope.lab.hosts import AgentFailure
from loopscope.lab.lab import Lab
from loopscope.rundir import TuningChange
from loopscope.spec.models import Phase


@dataclass
class KernelTunings:
    """The phase's tunings as made on each kernel: here (``Applied``) and through the agents that hold the others'."""

    lab: Lab
    run_id: str
    here: tunings.Applied | None = None
    #: hosts whose agent holds the phase's tunings of its kernel
    away: list[str] = field(default_factory=list)
    #: what each kernel changed (None: this machine's), for the run's record
    applied: list[tuple[str | None, list[TuningChange]]] = field(default_factory=list)

    def kernels(self) -> tuple[bool, list[str]]:
        """Whether this machine's kernel runs a host of the lab, and the host that tunes each other kernel."""
        here, away = False, []
        for rec, _ in kcapture.kernels(self.lab):
            if kcapture.on_this_kernel(self.lab.hosts[rec]):
                here = True
            else:
                away.append(rec)
        return here, away

    def check(self, phases: list[Phase], checked_here: bool) -> None:
        """Every phase's tunings checked on each kernel not checked yet: a kernel that cannot make one fails the run, naming its host."""
        here, away = self.kernels()
        dumped: list[dict[str, object]] = [ph.model_dump() for ph in phases]
        if here and not checked_here:
            problems = tunings.check(dumped)
            if problems:
                raise AgentFailure("tunings this machine cannot make:\n  " + "\n  ".join(problems), host=None, component="tunings")
        for h in away:
            r = self.lab.agent(h).ask(P.CheckTunings(phases=dumped), timeout=60)
            if r.problems:
                raise AgentFailure(f"tunings host {h}'s kernel cannot make:\n  " + "\n  ".join(r.problems), host=h, component="tunings")

    def apply(self, phase: Phase, where: str) -> None:
        """The phase's tunings made on every kernel, this machine's first; ``applied`` says what each changed, even on a failure."""
        here, away = self.kernels()
        ts: list[dict[str, object]] = [t.model_dump() for t in phase.tunings]
        self.applied = []
        if here:
            self.here = tunings.Applied(state.state_dir() / f"{self.run_id}.tunings")
            try:
                self.here.apply(ts, where)
            finally:
                self.applied.append((None, [TuningChange.model_validate(c) for c in self.here.record()]))
        for h in away:
            self.away.append(h)
            r = self.lab.agent(h).ask(P.MakeTunings(tunings=ts, where=where), timeout=120)
            self.applied.append((h, r.changes))
            if r.error:
                raise AgentFailure(f"tunings on host {h}: {r.error}", host=h, component="tunings")

    def restore(self) -> list[str]:
        """Everything given back on every kernel, the last made first; the problems, if any."""
        problems: list[str] = []
        for h in reversed(self.away):
            if self.lab.hosts[h].lost:
                problems.append(f"host {h} was lost with its tunings: its agent gave them back if it could, else `loopscope cleanup` on {h} does")
                continue
            try:
                r = self.lab.agent(h).ask(P.GiveBackTunings(), timeout=60)
                problems += [f"host {h}: {p}" for p in r.problems]
            except AgentFailure as e:
                problems.append(f"host {h}: {str(e).splitlines()[0]} (`loopscope cleanup` on {h} gives them back from its journal)")
        self.away = []
        if self.here is not None:
            problems += self.here.restore()
            self.here = None
        return problems
