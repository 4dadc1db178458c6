"""What a probe kind gets to run its steps (``kinds.base.StepContext``).

``Steps`` runs one step's processes through the hosts' agents (``StepHelpers``
stops what is left on the way out), a step's one process with the channel
hubs beside it, and the sched probes' calibration. A Ctrl-C or SIGTERM
inside a window raises ``Interrupted``: the probe is asked for what it
measured until then (``Steps.cut_short``), and the run ends through its
clean-up. Both loops over a lab (``loopscope run``'s steps, the monitor's
periods) hand kinds a ``Steps``.
"""

from __future__ import annotations

import os
import re
import signal
import time
from contextlib import contextmanager
from typing import TYPE_CHECKING, Any, Iterator

from loopscope import protocol as P
from loopscope.errors import Stopped
from loopscope.kinds.base import Collected, HelperSpec, HostView
from loopscope.lab import hubs
from loopscope.lab.hosts import AgentFailure
from loopscope.lab.lab import Lab
from loopscope.rundir import HubStep
from loopscope.spec import Experiment
from loopscope.spec.models import HOST_REF

if TYPE_CHECKING:
    from loopscope.spec.models import ProbeModel


class Interrupted(Stopped):
    """Ctrl-C or SIGTERM reached the controller: the run ends through its clean-up."""


#: how long a probe cut short inside its window may take to say what it measured
CUT_SHORT_S = 5.0


def sleep(seconds: float) -> None:
    """One sleep, no waking to look at the clock (Ctrl-C still interrupts it)."""
    time.sleep(max(0.0, seconds))


class StepHelpers:
    """The processes of one step (``kinds.base.Helpers``): started through
    the host's agent, stopped in reverse on the way out."""

    def __init__(self, lab: Lab, key: str) -> None:
        self.lab, self.key = lab, key
        self._running: list[tuple[str, str]] = []

    def start(self, host: str, spec: HelperSpec, *, duration_ns: int | None = None, wait_ready: bool = False) -> None:
        lab = self.lab
        req = P.StartProbe(probe=spec, step_dir=lab.step_dir(host, self.key), scratch_dir=lab.scratch(host), wait_ready=wait_ready)
        if duration_ns is not None:
            req.duration_ns = duration_ns
        lab.agent(host).ask(req)
        self._running.append((host, spec["name"]))

    def start_each(self, starts: list[tuple[str, HelperSpec]], *, wait_ready: bool = False) -> None:
        """Several that wait for nothing of each other's, started at once
        (``Lab.ask_each``); in ``running`` in the order given. The first
        failure is raised once every answer is in, and those that started are
        stopped on the way out like the rest."""
        lab = self.lab
        reqs = [(h, P.StartProbe(probe=spec, step_dir=lab.step_dir(h, self.key), scratch_dir=lab.scratch(h), wait_ready=wait_ready)) for h, spec in starts]
        got = lab.ask_each(reqs)
        self._running += [(h, spec["name"]) for (h, spec), r in zip(starts, got) if not isinstance(r, AgentFailure)]
        for r in got:
            if isinstance(r, AgentFailure):
                raise r

    def stop(self, host: str, name: str) -> Collected:
        lab = self.lab
        r = lab.agent(host).ask(P.StopProbe(name=name))
        self._running.remove((host, name))
        return Collected(
            name=name,
            host=host,
            trace=lab.rel(host, r.trace),
            json=lab.rel(host, f"{lab.step_dir(host, self.key)}/{name}.json"),
            command=r.command,
            cpu_usec=r.cpu_usec,
            spawn_mono_ns=r.spawn_mono_ns,
            end_mono_ns=r.end_mono_ns,
            result=r.result,
        )

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

    def calibrate(self, probe: ProbeModel) -> dict[str, object]:
        lab = self.lab
        host = probe.hosts(self.first_host)[0]
        r = lab.agent(host).ask(
            P.RunProbe(
                probe=probe.model_dump(mode="json"),
                step_dir=lab.step_dir(host, "calibration"),
                scratch_dir=lab.scratch(host),
                duration_ns=int(probe.seconds(self.exp.duration) * 1e9),
                calibrate=True,
            )
        )
        return r.result

    def check(self) -> None:
        self.lab.check()

    def channel_stats(self, host: str, key: str, name: str) -> str | None:
        return self.lab.rel(host, hubs.stats_path(self.lab, host, key, name)) if self.exp.channels else None

    def sleep(self, seconds: float) -> None:
        sleep(seconds)

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
        host whose agent this controller cannot signal (another machine's, or
        another process-id namespace's), or a probe that cannot stop early,
        ends the run without the step."""
        h = self.lab.hosts[hname]
        if not h.here or h.hello is None:
            raise why
        try:
            os.kill(h.hello.pid, signal.SIGUSR1)
            return self.lab.agent(hname).answer(req, rid, timeout=CUT_SHORT_S)
        except (OSError, AgentFailure):
            raise why from None
