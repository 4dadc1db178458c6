"""Hosts on another kernel: each watched by a monitor of its own, there.

A monitor reads its probes' traces as they are written and keeps the
kernel's events around their outliers: both are where the host's kernel
is. So a host whose agent runs on another kernel (an ssh host, an exec host
into another machine) is watched by ``loopscope monitor`` started there by
its agent (``agent.submonitor``), on the spec cut to that host: the host as
``local``, the probes that measure only there, the loads placed there (its
flight recorder names them). It attributes its kept windows there; its
windows stay in its directory, which comes home with the host's files when
the monitor ends (``sessions/<s>/hosts/<host>/monitor/mon/windows``).

What it appends comes home once a second, a period at a time, into the
monitor's own files: its period rows into ``periods.jsonl``, its outliers
(with their causes) through the keeper's counts into ``outliers.jsonl``,
its interval histograms into each probe's ``.hlog``; the live view, the
metrics and ``monitor.json`` count them as the controller's own.

A probe or load that spans such a host and another is refused: it cannot
be measured by one monitor on either kernel. A host lost under
``on_host_failure: continue`` (its agent gone, its monitor with it) is
marked as any other, and its monitor started again with the agent
(``--resume``).
"""

from __future__ import annotations

import json
import threading
from dataclasses import dataclass, field
from pathlib import Path
from typing import TYPE_CHECKING, Protocol, cast

import yaml
from hdrh.histogram import HdrHistogram

from loopscope import protocol as P
from loopscope.errors import RunError
from loopscope.rundir.monitor import OutlierLine, PeriodLine
from loopscope.lab.hosts import AgentFailure
from loopscope.lab.kcapture import on_this_kernel
from loopscope.spec import Experiment
from loopscope.spec.plan import phase_runs

if TYPE_CHECKING:
    from io import TextIOWrapper

    from loopscope.lab.hostkinds import HostRt
    from loopscope.lab.lab import Lab
    from loopscope.lab.session import Session
    from loopscope.monitor.figures import ProbeLive
    from loopscope.monitor.hist import LogFile
    from loopscope.monitor.keeper import Keeper


class Watched(Protocol):
    """What the far hosts' follower reads and writes of its monitor (``monitor.run.Monitor``)."""

    exp: Experiment
    session: Session
    keeper: Keeper
    live: dict[str, ProbeLive]
    live_lock: threading.Lock
    close_lock: threading.Lock
    periods_f: TextIOWrapper
    logs: dict[str, LogFile]

    def say(self, msg: str) -> None: ...

    def note_once(self, text: str) -> None: ...

    def write_record(self) -> None: ...


#: how often what a far host's monitor appended is asked for
POLL_S = 1.0


def far_hosts(lab: Lab) -> list[str]:
    """The hosts whose probes a monitor here cannot read: on another kernel, or with their files elsewhere."""
    return [h.name for h in lab.hosts.values() if h.remote and not _near(h)]


def _near(h: HostRt) -> bool:
    return on_this_kernel(h) and Path(h.base).is_dir()


def check(exp: Experiment, far: list[str]) -> None:
    """Refuse what spans a far host and another host (exit 1, naming them)."""
    first = exp.hosts[0].name
    for p in exp.probes:
        hs = p.hosts(first)
        if set(hs) & set(far) and len(set(hs)) > 1:
            raise RunError(
                f"probe {p.name} spans hosts {', '.join(hs)}, and {', '.join(sorted(set(hs) & set(far)))} runs on another kernel: "
                "a monitor there watches only probes that measure on that host alone; monitor the probe from a controller on that kernel",
                component="monitor",
            )
    for name in phase_runs(exp)[0].phase.loads:
        ld = exp.load(name)
        dest = (getattr(ld, "dest", None) or "").rpartition(":")[0]
        on = {ld.host or first, *([dest] if dest in {h.name for h in exp.hosts} else [])}
        if on & set(far) and len(on) > 1:
            raise RunError(
                f"load {name} reaches from host {ld.host or first} to {dest}, and one of them runs on another kernel: a monitor there starts only loads of its own host",
                component="monitor",
            )


def sub_spec(text: str, exp: Experiment, host: str) -> str:
    """The experiment file cut to ``host``, as its own monitor runs it: the host
    as ``local``, its probes, the first phase's loads placed on it; tunings, links,
    clock sync and the kernel capture stay with the controller."""
    raw = yaml.safe_load(text) or {}
    first = exp.hosts[0].name
    probes = []
    for rp, p in zip(raw.get("probes") or [], exp.probes):
        if p.hosts(first) == [host]:
            probes.append({**rp, "name": str(p.name), "host": host})
    phase = phase_runs(exp)[0].phase
    loads = []
    for rl, ld in zip(raw.get("loads") or [], exp.loads):
        if ld.name in phase.loads and (ld.host or first) == host:
            loads.append({**rl, "name": ld.name, "host": host})
    out = {k: v for k, v in raw.items() if k not in ("hosts", "probes", "loads", "phases", "links", "clocksync", "kernel", "on_host_failure")}
    out.update(
        {
            "name": f"{exp.name}-{host}",
            "hosts": [{"name": host, "kind": "local"}],
            "probes": probes,
            "loads": loads,
            "phases": [{"name": phase.name, "loads": [ld["name"] for ld in loads]}],
        }
    )
    return yaml.safe_dump(out, sort_keys=False)


@dataclass
class FarHost:
    """One far host's monitor as the controller follows it."""

    name: str
    probes: list[str]
    offsets: dict[str, int] = field(default_factory=dict)
    running: bool = False
    #: what the poll met: the agent gone (the main thread loses the host)
    error: AgentFailure | None = None
    ended_said: bool = False


class Far:
    """The far hosts' monitors: started, followed once a second, stopped (see the module's text)."""

    def __init__(self, mon: Watched, names: list[str]) -> None:
        self.mon = mon
        first = mon.exp.hosts[0].name
        self.hosts = {n: FarHost(n, [str(p.name) for p in mon.exp.probes if p.hosts(first) == [n]]) for n in names}
        self.lock = threading.Lock()
        self.stop_ev = threading.Event()
        self.thread: threading.Thread | None = None

    @property
    def probes(self) -> set[str]:
        return {p for fh in self.hosts.values() for p in fh.probes}

    def elsewhere(self) -> set[str]:
        """The far probes on another machine (another boot of another kernel,
        not this machine counted apart, as ``LOOPSCOPE_APART_KERNELS`` does):
        their CPUs are not this machine's."""
        lab = self.mon.session.lab
        return {p for fh in self.hosts.values() if not lab.hosts[fh.name].here for p in fh.probes}

    def start(self) -> None:
        for n in self.hosts:
            self.start_one(n, resume=False)
        self.thread = threading.Thread(target=self._loop, name="ls-far", daemon=True)
        self.thread.start()

    def start_one(self, name: str, resume: bool) -> None:
        """Host ``name``'s monitor started by its agent (again, after a loss: ``--resume``)."""
        fh = self.hosts[name]
        lab = self.mon.session.lab
        spec = sub_spec((self.mon.session.run_dir / "spec.yaml").read_text(), self.mon.exp, name)
        with self.lock:
            r = lab.agent(name).ask(P.StartMonitor(spec=spec, out=f"{lab.hosts[name].base}/monitor", resume=resume), timeout=60)
            # (again after a loss: from where the last read ended, for what it wrote as it died came home with nothing)
            fh.offsets = {k: min(v, fh.offsets.get(k, v)) for k, v in r.offsets.items()} if resume else dict(r.offsets)
            fh.running, fh.error, fh.ended_said = True, None, False
        self.mon.say(f"host {name}: on another kernel; its own monitor runs there and its periods come home")

    def _loop(self) -> None:
        while not self.stop_ev.wait(POLL_S):
            self.poll()

    def poll(self) -> None:
        lab = self.mon.session.lab
        for fh in self.hosts.values():
            if not fh.running or fh.error is not None or lab.hosts[fh.name].lost:
                continue
            try:
                with self.lock:
                    r = lab.agent(fh.name).ask(P.ReadMonitor(offsets=fh.offsets), timeout=60)
                    self.merge(fh, r)
            except AgentFailure as e:
                fh.error = e

    def failures(self) -> list[tuple[str, AgentFailure]]:
        """Far hosts whose agent the poll found gone (each once)."""
        out = []
        for fh in self.hosts.values():
            if fh.error is not None and fh.running:
                fh.running = False
                out.append((fh.name, fh.error))
        return out

    def stop(self) -> None:
        """Every far monitor stopped as by Ctrl-C (its open period closed), and its last lines home."""
        self.stop_ev.set()
        if self.thread is not None:
            self.thread.join(30)
        lab = self.mon.session.lab
        for fh in self.hosts.values():
            if not fh.running or lab.hosts[fh.name].lost:
                continue
            try:
                with self.lock:
                    r = lab.agent(fh.name).ask(P.StopMonitor(offsets=fh.offsets), timeout=60)
                    self.merge(fh, r)
            except AgentFailure as e:
                self.mon.note_once(f"host {fh.name}: its monitor's last lines did not come home: {str(e).splitlines()[0]}")
            fh.running = False

    def merge(self, fh: FarHost, r: P.MonitorLines) -> None:
        """What ``fh``'s monitor appended, into the monitor's own files and figures."""
        m = self.mon
        for name, text in r.appended.items():
            lines = [ln for ln in text.splitlines() if ln.strip()]
            if name == "periods.jsonl":
                for ln in lines:
                    self.period(cast(PeriodLine, json.loads(ln)))
            elif name == "outliers.jsonl":
                for ln in lines:
                    m.keeper.add_far(cast(OutlierLine, json.loads(ln)))
            elif name.startswith("histograms/") and name.endswith(".hlog"):
                probe = name[len("histograms/") : -len(".hlog")]
                if probe in m.logs:
                    self._intervals(probe, [ln for ln in lines if not ln.startswith(("#", '"'))])
        fh.offsets.update(r.offsets)
        notes = (r.record or {}).get("notes")
        for note in notes if isinstance(notes, list) else []:  # (what it said: a recorder it could not start, a probe pinned for it)
            m.note_once(f"host {fh.name}: {note}")
        if not r.running and not fh.ended_said:
            fh.ended_said = True
            if r.exit_code not in (0, 130):
                said = " ".join(r.said.strip().splitlines()[-3:])[-400:]
                m.note_once(f"host {fh.name}: its monitor ended (exit {r.exit_code}): {said}")
                if not self.stop_ev.is_set():  # (its agent is alive: the monitor fails, naming the host)
                    fh.error = AgentFailure(f"host {fh.name}: its own monitor ended (exit {r.exit_code}): {said}", fh.name, "monitor")

    def period(self, row: PeriodLine) -> None:
        """A far probe's period row: written with the others, counted in its probe's figures."""
        m = self.mon
        lv = m.live.get(str(row.get("probe")))
        with m.close_lock:
            m.periods_f.write(json.dumps(row) + "\n")
            m.periods_f.flush()
            if lv is not None:
                with m.live_lock:
                    lv.periods += 1
                    lv.samples += int(row.get("samples") or row.get("count") or 0)
                    lv.missed += int(row.get("missed") or 0)
                    lv.unmeasured_ns += int(float(row.get("gap_s") or 0) * 1e9)
                    if row.get("probe_died"):
                        lv.restarts += 1
                    if int(row.get("max_ns") or 0) > lv.max_ns:
                        lv.max_ns, lv.max_at_utc = int(row["max_ns"]), row.get("max_at_utc")
            m.write_record()

    def _intervals(self, probe: str, lines: list[str]) -> None:
        """Interval lines of a far probe's log, appended to its log here and added to its figures."""
        m = self.mon
        log = m.logs[probe]
        for ln in lines:
            log.f.write(ln + "\n")
            try:
                h = HdrHistogram.decode(ln.rsplit(",", 1)[1].strip())
            except (ValueError, IndexError, TypeError):
                continue
            with m.live_lock:
                lv = m.live[probe]
                lv.whole.add(h)
                lv.last_period = h
        log.f.flush()
