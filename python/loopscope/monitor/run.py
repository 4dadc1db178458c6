"""``loopscope monitor``: the spec's probes, period after period, for days.

A monitor is a run of one phase (the spec's loads, held throughout) whose
probes measure a period at a time, over and over, until ``--for`` ends or
a signal stops it. The lab is the one ``loopscope run`` uses (hosts,
agents, loads, clean-up on every way out), brought up in a session
directory of the monitor's (``sessions/NNN``); what the monitor keeps is
beside it, bounded whatever the run's length:

- per probe and period a latency histogram (``monitor.hist``), appended to
  ``histograms/<probe>.hlog`` as the period closes, and a row of
  ``periods.jsonl`` (count, p50/p99/p99.9/max and the maximum's time, the
  probe's own summary: samples and missed deadlines);
- every outlier above the threshold, kept and explained as it comes
  (``monitor.keeper``): ``outliers.jsonl`` and the windows of kernel events
  around them (``windows/``), within ``monitor.retain``;
- ``monitor.json``, rewritten at every period's close: settings, counts,
  the run's maximum per probe, how it ended.

While a period runs, a thread reads the probe's trace as its writer flushes
it (once a second) and hands the kind's windows (``ProbeKind.windows``, the
hook explain uses: every kind that has one can be monitored) above the
threshold to the keeper. The period's trace is deleted when its histogram
is written. The monitor's own threads run on CPUs no probe is pinned to.

Hosts of every kind on this machine's kernel are watched (local, netns, and
exec or ssh hosts into its namespaces and containers: their agents' files
are read where they write them). The probes measure in lanes
(``plan.lanes``): every lane measures in every period, side by side, each
with a tail of its own, so a fleet of one probe per host measures every
host at once; a lane's probes take turns. One flight recorder serves them
all (one kernel). A host lost under ``on_host_failure: continue`` closes its
period with what was read, is marked in the session's record, sits out the
periods while it is gone, and its agent is started again through its
launcher before each period.

A kind whose windows come from kernel events (``threads``: any program's
threads, ``live_capture``) gets, for each of its periods, a capture of its
own that records only the program's threads (``kernel.drain --watch``: the
probe puts its target in the capture's ``set_event_pid``), read every half
second into the period's directory; the tail reads it as it reads a
probe's trace, and it goes with the period's directory. Its cost is the
program's own events, not the machine's.
"""

from __future__ import annotations

import datetime as _dt
from dataclasses import dataclass, field
import json
import os
import shutil
import signal
import threading
import time
from pathlib import Path
from typing import TYPE_CHECKING, Any, Callable

import numpy as np
import polars as pl

from loopscope.host import procs
from loopscope.kinds import KINDS
from loopscope.lab.session import Say, Session
from loopscope.lab.steps import CUT_SHORT_S, Interrupted, Steps
from loopscope.monitor import figures
from loopscope.monitor.figures import ProbeLive, utc
from loopscope.monitor.plan import as_at_start, away_from_probes, lanes, recorded_cpus
from loopscope.monitor.far import Far, check as check_far, far_hosts
from loopscope.lab.hosts import AgentFailure
from loopscope.monitor import hist
from loopscope.rundir import monitor as record
from loopscope.rundir.monitor import MonitorJson, PeriodLine
from loopscope.monitor.keeper import Keeper
from loopscope.monitor.tail import LiveSource, Tail
from loopscope.monitor.watching import unwatch, watch
from loopscope.rundir import Step
from loopscope.spec import Experiment
from loopscope.spec.plan import PhaseRun, phase_runs

if TYPE_CHECKING:
    from loopscope.spec.models import ProbeModel

FORMAT = "loopscope-monitor/1"
# How often a monitored probe's trace writer flushes.
PROBE_FLUSH_MS = 250
# A quantile threshold waits for this many values (p99.9 of fewer is noise).
QUANTILE_MIN = 2000
# A probe dying this many periods in a row ends the monitor (it would not measure again).
MAX_DEATHS = 3
HOUR_NS = 3_600_000_000_000


@dataclass
class LaneRun:
    """One lane's period in its thread: its number, what it raised, when it is done (waited on, not the thread:
    a join a signal interrupts marks a running thread ended, bpo-45274, and the keeper stopped too early)."""

    n: int
    error: BaseException | None = None
    done: threading.Event = field(default_factory=threading.Event)


class Monitor:
    """A run whose one phase's probes measure period after period (see the module's text)."""

    def __init__(
        self,
        exp: Experiment,
        spec_text: str,
        out: Path,
        say: Say,
        notes: list[str],
        for_ns: int | None,
        kinds: dict[str, str],
        view: Callable[["Monitor"], None] | None = None,
        metrics: tuple[str, int] | None = None,
    ) -> None:
        self.mdir = out
        sessions = out / "sessions"
        n = len([p for p in sessions.iterdir() if p.is_dir()]) + 1 if sessions.is_dir() else 1
        self.settings = exp.monitor
        assert self.settings is not None
        #: the threshold when it is a time (None: a quantile of the last hour, held in ``recent``)
        self.fixed_ns = self.settings.threshold_ns()
        exp.kernel.capture = "off"  # the monitor's flight recorder replaces the run's capture
        # The session's directory name is its lab's run id (its cgroup, its
        # processes' mark, what its teardown kills): unique on this machine,
        # or one monitor's teardown would kill another's probes.
        self.session = Session(exp, spec_text, sessions / f"{n:03d}-{time.strftime('%Y%m%d-%H%M%S')}-mon{os.getpid()}", say, notes, kinds)
        self.exp, self.say, self.notes = exp, say, notes
        self.for_ns = for_ns
        self.view = view
        self.live = {str(p.name): ProbeLive(str(p.name)) for p in exp.probes}
        self.logs = {str(p.name): hist.LogFile(out / "histograms" / f"{p.name}.hlog", str(p.name)) for p in exp.probes}
        self.recent = hist.Recent(HOUR_NS)
        self.periods_f = open(out / "periods.jsonl", "a")
        only = recorded_cpus(exp)
        self.keeper = Keeper(
            out, self.settings, f"loopscope-mon{os.getpid()}", self._roles, enabled=self.settings.recorder != "off", note=self._keeper_note, cpus=only
        )
        if only:
            self.notes.append(
                f"the flight recorder records CPU {', '.join(map(str, only))} only (every probe is pinned there): what runs on the other CPUs is not recorded,"
                " a wake-up aimed at these CPUs is"
            )
        self.src = LiveSource(self.session.run_dir, self.session.rec, json.loads((self.session.run_dir / "spec.json").read_text()), self.offset)
        # a live_capture kind's watching capture (one at a time: probes take turns)
        self.watch_name = f"loopscope-mon{os.getpid()}-w"
        self.watch_tids: list[int] = []
        #: probes that measure at once (one lane per group of hosts), each lane's trace read by a tail of its own
        self.lanes = lanes(exp)
        self.tails = [Tail(self, f"ls-tail-{i}") for i in range(len(self.lanes))]
        #: hosts on another kernel, each watched by a monitor of its own there (known once the agents said hello)
        self.far = Far(self, [])
        first = exp.hosts[0].name
        self.probe_host = {str(p.name): p.hosts(first)[0] for p in exp.probes}
        #: a period closes under it (lanes close theirs side by side; the files and the record are shared)
        self.close_lock = threading.Lock()
        #: the lanes of the round measuring now (teardown waits for them before the keeper stops)
        self.lanes_running: list[tuple[threading.Thread, LaneRun, ProbeModel]] = []
        #: the CPUs it started with (its own threads move off the probes' ones; an agent started again gets these)
        self.cpus_at_start = os.sched_getaffinity(0)
        self.stopping = False
        self._noted: set[str] = set()
        self.started_utc = _dt.datetime.now(_dt.timezone.utc).isoformat()
        self.started_mono = time.monotonic_ns()
        self.period_no = self._periods_so_far()
        self.status = "running"
        self.roles_cache: dict[int, str] = {}
        self.live_lock = threading.Lock()
        self.metrics_at = metrics
        self.metrics_server: Any = None
        #: each host's own endpoint (``monitor.metrics: agent``)
        self.host_servers: list[Any] = []
        self._carry_over()

    def _carry_over(self) -> None:
        """A resumed monitor goes on from what the directory holds (``figures.carry_over``)."""
        old = figures.previous(self.mdir)
        if old is not None:
            figures.carry_over(old, self.mdir, self.keeper.counts, self.live, self.recent)

    # ---- helpers the threads call ------------------------------------------------------

    def _keeper_note(self, text: str) -> None:
        self.notes.append(text)
        self.say(f"note: {text}")

    def note_once(self, text: str) -> None:
        if text not in self._noted:
            self._noted.add(text)
            self.notes.append(text)

    def offset(self, host: str) -> int:
        h = self.session.lab.hosts.get(host)
        return int(getattr(h.spec, "clock_offset", 0) or 0) if h is not None else 0

    def threshold_ns(self, open_values: np.ndarray) -> int | None:
        s = self.settings
        assert s is not None
        fixed = s.threshold_ns()
        if fixed is not None:
            return fixed
        q = s.threshold_quantile()
        assert q is not None
        return self.recent.quantile(q, open_values, QUANTILE_MIN)

    def live_snapshot(self) -> dict[str, dict[str, object]]:
        """Per probe, for the metrics: the run's histogram so far (the open
        period's values included), the last period's maximum, periods closed."""
        opened = {str(name): self.open_values(str(name)) for name in self.live}
        out = {}
        with self.live_lock:
            for name, lv in self.live.items():
                h = hist.new()
                h.add(lv.whole)
                if (vals := opened[str(name)]) is not None:
                    hist.record(h, vals)
                last = lv.last_period.get_max_value() if lv.last_period is not None and lv.last_period.get_total_count() else None
                out[str(name)] = {"whole": h, "last_max_ns": last, "periods": lv.periods, "host": self.probe_host[str(name)]}
        return out

    def open_values(self, probe: str) -> np.ndarray | None:
        """The values of ``probe``'s open period so far (None: it is not measuring now)."""
        for t in self.tails:
            if (v := t.open_values(probe)) is not None:
                return v
        return None

    def _roles(self) -> dict[int, str]:
        """Threads by who they are, as they are now (a run learns its loads'
        threads when they stop; a monitor's loads never do): the lab's own,
        the recorder's, each load's (its cgroup's threads). Once named, a
        thread keeps its name: an outlier explained after its load stopped
        (the last ones, at the end) still names it."""
        out = self.roles_cache
        for label, tids in self.session.lab.lab_tids().items():
            for t in tids:
                out[t] = label
        for t in [*self.keeper.reader_tids(), *self.watch_tids]:
            out[t] = "lab: capture"
        for name, (group, pids) in self.session.load_groups.items():
            for t in procs.threads_of(group, pids):
                out[t] = f"load: {name}"
        return dict(out)

    def _refresh_roles(self) -> None:
        self._roles()

    def _periods_so_far(self) -> int:
        p = self.mdir / "periods.jsonl"
        if not p.exists():
            return 0
        return max(
            (int(json.loads(line).get("period", 0)) for line in p.read_text().splitlines() if line.strip().startswith("{") and line.strip().endswith("}")),
            default=0,
        )

    # ---- the run ----------------------------------------------------------------------

    def plan(self) -> None:
        """The lab up, the recorder and the loads started, then periods until ``--for`` ends."""
        # The probes' trace writers (off the measured CPUs) flush four times a
        # second at the normal policy: the tail sees an outlier within ~0.3 s,
        # and a load beside the writer cannot hold its trace back (an idle
        # writer under a context-switch storm flushed 8-20 s late, after the
        # kernel's buffers had overwritten the outliers' windows).
        # (what every probe of the session starts with, through each agent's hello)
        self.session.lab.probe_env.update({"LOOPSCOPE_FLUSH_MS": str(PROBE_FLUSH_MS), "LOOPSCOPE_WRITER_IDLE": "0"})
        if any(KINDS[p.kind].live_capture for p in self.exp.probes):
            from loopscope.kernel.capture import tracefs
            from loopscope.probes.threads import WATCH_ENV

            tf = tracefs()
            if tf is not None:
                self.session.lab.probe_env[WATCH_ENV] = str(tf / "instances" / self.watch_name / "set_event_pid")
        self.session.bring_up()
        self.far = Far(self, far_hosts(self.session.lab))
        check_far(self.exp, list(self.far.hosts))
        self.lanes = [x for x in ([p for p in lane if str(p.name) not in self.far.probes] for lane in self.lanes) if x]
        self._away_from_probes()
        if not self.lanes:  # (every probe is on another kernel: the recorders are theirs)
            self.keeper.cap, self.keeper.why_not = None, "every probe's host runs on another kernel, whose own monitor keeps its outliers"
        why = self.keeper.start() if self.lanes else None
        if why:
            self.notes.append(f"outliers are counted, not kept: {why}")
            self.say(f"note: outliers are counted, not kept: {why}")
        for t in self.tails:
            t.start()
        pr = phase_runs(self.exp)[0]
        self.session.set_links_start()
        by_host, sinks = self.session.start_phase(pr, "loads", "", skip=set(self.far.hosts))
        self.far.start()
        self._refresh_roles()
        if self.metrics_at is not None:
            from loopscope.monitor import metrics

            self.metrics_server = metrics.serve(self, *self.metrics_at)
            self.say(f"metrics: http://{self.metrics_at[0]}:{self.metrics_at[1]}/metrics")
            if self.settings.metrics == "agent":  # type: ignore[union-attr]
                self.host_servers = metrics.serve_hosts(self, list(self.session.lab.hosts.values()), self.metrics_at[1], self.say, self.note_once)
        self.write_record()
        if self.view is not None:
            self.view(self)  # the live view starts
        period = int(self.settings.period)  # type: ignore[union-attr]
        turn = 0
        while True:
            left = None if self.for_ns is None else self.for_ns - (time.monotonic_ns() - self.started_mono)
            if left is not None and left < 1_000_000_000:
                self.session.end_phase(pr, by_host, sinks)
                self.session.lab.check()
                return
            self.revive_lost()
            self.round(pr, [lane[turn % len(lane)] for lane in self.lanes], period if left is None else min(period, left))
            turn += 1

    def revive_lost(self) -> None:
        """Under ``on_host_failure: continue``, a lost host's agent started
        again through its launcher before each period; its lane measures again."""
        if self.exp.on_host_failure != "continue":
            return
        for h in list(self.session.lab.hosts.values()):
            if h.lost is None:
                continue
            with as_at_start(self.cpus_at_start):
                back = self.session.revive(h.name)
                if back and h.name in self.far.hosts:
                    self.far.start_one(h.name, resume=True)
            if back:
                self._away_from_probes()
                self._refresh_roles()

    def _next_period(self) -> int:
        with self.close_lock:
            self.period_no += 1
            return self.period_no

    def round(self, pr: PhaseRun, probes: list[ProbeModel], dur_ns: int) -> None:
        """One period of every lane at once (a lane whose host is lost sits it
        out). Ctrl-C or SIGTERM cuts every lane's probe short, closes each
        period with what it measured, then ends the monitor."""
        first = self.exp.hosts[0].name
        jobs = self.lanes_running = []
        try:
            # (a signal while they start cuts short those started: inside the try)
            for i, probe in enumerate(probes):
                if any(self.session.lab.hosts[h].lost for h in probe.hosts(first)):
                    continue
                got = LaneRun(self._next_period())
                t = threading.Thread(target=self._lane, args=(self.tails[i], pr, probe, got, dur_ns), name=f"ls-lane-{i}", daemon=True)
                jobs.append((t, got, probe))
                t.start()
            for _, got, _ in jobs:
                while not got.done.wait(0.2):
                    pass
            if not jobs:  # (every probe is on another kernel, or its host lost)
                time.sleep(max(0.2, dur_ns / 1e9))
        except Interrupted:
            self.stopping = True
            self._cut_short([h for _, _, p in jobs for h in p.hosts(first)])
            self._join_lanes()
            raise
        if self.view is not None and jobs:
            self.view(self)
        for name, err in self.far.failures():
            with self.session.may_lose(f"the monitor of host {name}"):
                raise err
        for _, got, probe in jobs:
            if got.error is not None:
                with self.session.may_lose(f"period {got.n} of probe {probe.name}", f"{probe.name}-{got.n:07d}"):
                    raise got.error

    def _join_lanes(self) -> None:
        """Every lane's period closed (its outliers handed to the keeper), within ``CUT_SHORT_S``."""
        until = time.monotonic() + CUT_SHORT_S
        for _, got, _ in self.lanes_running:
            got.done.wait(max(0.0, until - time.monotonic()))

    def _lane(self, tail: Tail, pr: PhaseRun, probe: ProbeModel, got: LaneRun, dur_ns: int) -> None:
        try:
            self.period(pr, probe, dur_ns, tail, got.n)
        except BaseException as e:  # noqa: BLE001 - handed to the main thread, which fails or loses the host
            got.error = e
        finally:
            got.done.set()

    def _cut_short(self, hosts: list[str]) -> None:
        """Every probe measuring now told to stop as at its window's end (its
        agent passes SIGUSR1 on as SIGINT): each lane's step then returns what
        it measured, and its period closes."""
        for name in dict.fromkeys(hosts):
            h = self.session.lab.hosts[name]
            if h.hello is not None and h.here and h.lost is None:
                try:
                    os.kill(h.hello.pid, signal.SIGUSR1)
                except OSError:
                    pass

    def _away_from_probes(self) -> None:
        """Every thread of the monitor and of its agents (polars' and its I/O
        runtime's among them; threads started later inherit it) and the
        recorder it starts on CPUs no probe is pinned to. The probes an
        agent starts get the agent's first CPUs back (``procs.spawn``)."""
        away_from_probes(self.exp, [t for t in self.session.lab.lab_tids().get("lab: agent", []) if t], self.far.elsewhere())

    def period(self, pr: PhaseRun, probe: ProbeModel, dur_ns: int, tail: Tail, n: int) -> None:
        """One period of ``probe`` (in its lane's thread): measured, its trace
        tailed as it is written, then closed; a host lost under it closes it
        with what was read, then the main thread loses the host."""
        key = f"{probe.name}-{n:07d}"
        plan = KINDS[probe.kind].live_step(probe, key, getattr(probe, "host", None) or self.session.first.name, lambda h: self.session.lab.step_dir(h, key))
        host = plan["host"]
        rel = {k: self._at(plan["host"], plan[k]) for k in ("trace", "json")}
        stages = [{**sg, "trace": self._at(sg["host"], sg["trace"]), "json": self._at(sg["host"], sg["json"])} for sg in plan.get("stages") or []]
        st = Step.model_validate(
            {
                "rep": 1,
                "phase": pr.phase.name,
                "loads": list(pr.phase.loads),
                "probe": probe.name,
                "kind": probe.kind,
                "host": host,
                **rel,
                **({"stages": stages} if stages else {}),
                "spawn_mono_ns": 0,
                "end_mono_ns": 0,
            }
        )
        t0 = time.time()
        watching = watch(self, probe, Path(self.session.lab.step_dir(host, key)) / "kernel") if KINDS[probe.kind].live_capture else None
        tail.watch(st)
        cut: str | None = None
        died: str | None = None
        failed: AgentFailure | None = None
        try:
            step = KINDS[probe.kind].run(Steps(self.session.lab, self.exp, self.session.calib), probe, key, dur_ns)
            cut = step.get("interrupted")
        except AgentFailure as e:
            # A probe that dies is started again with the next period, and
            # counted; one that dies MAX_DEATHS periods in a row ends the monitor.
            # A host lost under it (its agent gone) closes the period with what was read.
            lv = self.live[str(probe.name)]
            gone = [x for x in probe.hosts(self.exp.hosts[0].name) if self._agent_gone(x)]
            said = str(e).splitlines() or [""]
            # its first line says who failed; its last, the failure's own words (a probe's error, the log's end)
            died = (f"host {', '.join(gone)} lost: " if gone else "") + said[0][:300] + (f": {said[-1].strip()[:300]}" if len(said) > 1 else "")
            if self.stopping and not gone and said[-1].strip().endswith(("interrupted", "KeyboardInterrupt")):
                cut, died = "stopped before it measured", None  # (cut short while it started: not a death)
            elif gone or not str(e.component or "").startswith("probe") or lv.deaths_in_a_row + 1 >= MAX_DEATHS:
                failed = e
            else:
                lv.deaths_in_a_row += 1
                lv.restarts += 1
                self.say(f"period {n}: probe {probe.name} died ({died}); it starts again with the next period")
        finally:
            if watching is not None:
                unwatch(self, watching)
            w = tail.finish()
            self.src.stores.pop(probe.label, None)
        t1 = time.time()
        if died is None:
            self.live[str(probe.name)].deaths_in_a_row = 0
        self.close_period(probe, n, st, w, t0, t1, died, cut)
        if failed is not None:
            raise failed
        if cut:
            raise Interrupted(str(cut))

    def _at(self, host: str, path: str) -> str:
        """Where a file ``host``'s agent writes is read from, relative to the
        session's directory (a remote host's on this machine: its own path)."""
        return path if self.session.lab.hosts[host].remote else self.session.lab.rel(host, path)

    def _agent_gone(self, host: str) -> bool:
        a = self.session.lab.hosts[host].agent
        return a is not None and (a.dead is not None or not a.ch.alive())

    def close_period(self, probe: ProbeModel, n: int, st: Step, w: pl.DataFrame, t0: float, t1: float, died: str | None = None, cut: str | None = None) -> None:
        with self.close_lock:
            self._close_period(probe, n, st, w, t0, t1, died, cut)

    def _close_period(self, probe: ProbeModel, n: int, st: Step, w: pl.DataFrame, t0: float, t1: float, died: str | None, cut: str | None) -> None:
        lv = self.live[str(probe.name)]
        vals = w["latency_ns"].to_numpy() if len(w) else np.zeros(0, dtype=np.int64)
        h = hist.new()
        hist.record(h, vals)
        # the period is the time its values span (the probe's start and stop are not measured)
        off = self.offset(st.host or self.session.first.name)
        to_utc = time.time() - time.monotonic()
        gap_ns = None
        if len(w):
            a_k = int(w["t_ns"].min()) - off  # type: ignore[arg-type]
            b_k = int((w["t_ns"] + w["latency_ns"]).max()) - off  # type: ignore[arg-type]
            t0, t1 = a_k / 1e9 + to_utc, b_k / 1e9 + to_utc
            if lv.last_end_k is not None:
                gap_ns = max(0, a_k - lv.last_end_k)
                lv.unmeasured_ns += gap_ns
            lv.last_end_k = b_k
        self.logs[str(probe.name)].write(h, t0, t1)
        if self.fixed_ns is None:  # (a fixed threshold needs no last hour)
            self.recent.add(time.monotonic_ns(), h)
        with self.live_lock:
            lv.whole.add(h)
            lv.last_period = h
            lv.periods += 1
        res: dict[str, Any] = {}
        try:
            res = json.loads((self.session.run_dir / str(st.json_)).read_text().strip().splitlines()[-1])
        except (OSError, KeyError, ValueError, IndexError):
            pass
        row: PeriodLine = {
            "period": n,
            "probe": probe.name,
            "host": str(st.host),
            "start_utc": utc(t0),
            "end_utc": utc(t1),
            "seconds": round(t1 - t0, 3),
            "count": len(vals),
            "gap_s": None if gap_ns is None else round(gap_ns / 1e9, 3),
        }
        if died:
            row["probe_died"] = died
        if len(vals):
            i = int(np.argmax(vals))
            row.update(
                {
                    "p50_ns": hist.quantile(h, 0.5),
                    "p99_ns": hist.quantile(h, 0.99),
                    "p999_ns": hist.quantile(h, 0.999),
                    "max_ns": int(vals[i]),
                    "max_t_ns": int(w["t_ns"][i]),
                }
            )
            row["max_at_utc"] = utc((int(w["t_ns"][i]) - off) / 1e9 + to_utc)
            if int(vals[i]) > lv.max_ns:
                lv.max_ns, lv.max_at_utc = int(vals[i]), row["max_at_utc"]
        for k in ("samples", "missed", "interrupted"):
            if k in res:
                row[k] = res[k]
        if cut and not row.get("interrupted"):
            row["interrupted"] = cut
        lv.samples += int(res.get("samples") or len(vals))
        lv.missed += int(res.get("missed") or 0)
        self.periods_f.write(json.dumps(row) + "\n")
        self.periods_f.flush()
        os.fsync(self.periods_f.fileno())
        # the period's trace has given what is kept of it
        for h in self.session.lab.hosts:  # every host's part of it (an rr probe's echo, a pipeline's stages)
            shutil.rmtree(Path(self.session.lab.step_dir(h, f"{probe.name}-{n:07d}")), ignore_errors=True)
        self._refresh_roles()
        self.write_record()

    def record(self) -> MonitorJson:
        s = self.settings
        assert s is not None
        return {
            "format": FORMAT,
            "name": self.exp.name,
            "status": self.status,
            "pid": os.getpid(),
            "started_utc": self.started_utc,
            "updated_utc": utc(time.time()),
            "settings": s.model_dump(mode="json"),
            "periods": self.period_no,
            "probes": figures.statuses(self.live, self.probe_host),
            "counts": figures.counts(self.keeper),
            "recorder": self.keeper.why_not or f"flight recorder ({s.recorder})",
            "session": self.session.run_dir.name,
            "notes": list(self.notes),
        }

    def write_record(self) -> None:
        record.write(self.mdir, self.record())

    def teardown(self) -> None:
        self._join_lanes()  # (a failure elsewhere ends the loop with lanes still closing their periods)
        self.far.stop()
        for t in self.tails:
            t.stop()
        for t in self.tails:  # (a read under way hands its outliers over before the keeper stops)
            if t.is_alive():
                t.join(CUT_SHORT_S)
        for srv in [self.metrics_server, *self.host_servers]:
            if srv is not None:
                srv.shutdown()
                srv.server_close()
        try:
            self.keeper.stop()
        finally:
            for lg in self.logs.values():
                lg.close()
            self.periods_f.close()
            self.session.teardown()
            self.status = self.session.out.status
            self.write_record()
