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
import json
import os
import shutil
import threading
import time
from dataclasses import dataclass, field
from pathlib import Path
from typing import TYPE_CHECKING, Any, Callable

import numpy as np
import polars as pl
from hdrh.histogram import HdrHistogram

from loopscope.errors import InputError
from loopscope.host import procs
from loopscope.kinds import KINDS
from loopscope.lab.session import Say, Session
from loopscope.lab.steps import Interrupted, Steps
from loopscope.lab.hosts import AgentFailure
from loopscope.monitor import hist
from loopscope.rundir import monitor as record
from loopscope.rundir.monitor import Counts, MonitorJson, PeriodLine
from loopscope.monitor.keeper import Keeper
from loopscope.monitor.tail import LiveSource, Tail
from loopscope.rundir import Step
from loopscope.spec import Experiment
from loopscope.spec.plan import PhaseRun, phase_runs
from loopscope.kernel import capture as C

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
class ProbeLive:
    """One probe's figures so far (the live view and the metrics read them)."""

    name: str
    period: HdrHistogram = field(default_factory=hist.new)
    whole: HdrHistogram = field(default_factory=hist.new)
    last_period: HdrHistogram | None = None
    max_ns: int = 0
    max_at_utc: str | None = None
    periods: int = 0
    samples: int = 0
    missed: int = 0
    #: time between one period's last value and the next one's first (the probe restarting): not measured
    unmeasured_ns: int = 0
    last_end_k: int | None = None
    #: periods whose probe died (it starts again with the next one), and how many in a row now
    restarts: int = 0
    deaths_in_a_row: int = 0


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
        exp.kernel.capture = "off"  # the monitor's flight recorder replaces the run's capture
        # The session's directory name is its lab's run id (its cgroup, its
        # processes' mark, what its teardown kills): unique on this machine,
        # or one monitor's teardown would kill another's probes.
        self.session = Session(exp, spec_text, sessions / f"{n:03d}-{time.strftime('%Y%m%d-%H%M%S')}-mon{os.getpid()}", say, notes, kinds)
        self.exp, self.say, self.notes = exp, say, notes
        self.for_ns = for_ns
        self.view = view
        self.live = {p.name: ProbeLive(str(p.name)) for p in exp.probes}
        self.logs = {p.name: hist.LogFile(out / "histograms" / f"{p.name}.hlog", str(p.name)) for p in exp.probes}
        self.recent = hist.Recent(HOUR_NS)
        self.periods_f = open(out / "periods.jsonl", "a")
        self.keeper = Keeper(out, self.settings, f"loopscope-mon{os.getpid()}", self._roles, enabled=self.settings.recorder != "off", note=self._keeper_note)
        self.src = LiveSource(self.session.run_dir, self.session.rec, json.loads((self.session.run_dir / "spec.json").read_text()), self.offset)
        # a live_capture kind's watching capture (one at a time: probes take turns)
        self.watch_name = f"loopscope-mon{os.getpid()}-w"
        self.watch_tids: list[int] = []
        self.tail = Tail(self)
        self._noted: set[str] = set()
        self.started_utc = _dt.datetime.now(_dt.timezone.utc).isoformat()
        self.started_mono = time.monotonic_ns()
        self.period_no = self._periods_so_far()
        self.status = "running"
        self.roles_cache: dict[int, str] = {}
        self.live_lock = threading.Lock()
        self.metrics_at = metrics
        self.metrics_server: Any = None
        self._carry_over()

    def _carry_over(self) -> None:
        """A resumed monitor goes on from what the directory holds: its counts,
        each probe's maximum and whole-run histogram, the last hour's periods."""
        if not record.exists(self.mdir):
            return
        try:
            old = record.read(self.mdir)
        except InputError:
            return
        c, k = old.get("counts") or {}, self.keeper.counts
        k.above, k.kept, k.explained = int(c.get("outliers_above", 0)), int(c.get("kept", 0)), int(c.get("explained", 0))
        k.not_kept, k.by_cause = dict(c.get("not_kept") or {}), dict(c.get("by_top_cause") or {})
        k.windows, k.windows_removed, k.paused_ns = int(c.get("windows", 0)), int(c.get("windows_removed", 0)), int(c.get("recorder_paused_ns", 0))
        now_ms = time.time() * 1000
        for name, lv in self.live.items():
            was = (old.get("probes") or {}).get(str(name))
            if was is not None:
                lv.max_ns, lv.max_at_utc = int(was.get("max_ns") or 0), was.get("max_at_utc")
                lv.periods, lv.samples, lv.missed = int(was.get("periods", 0)), int(was.get("samples", 0)), int(was.get("missed", 0))
                lv.unmeasured_ns = int(float(was.get("unmeasured_s") or 0) * 1e9)
                lv.restarts = int(was.get("probe_restarts") or 0)
            log = self.mdir / "histograms" / f"{name}.hlog"
            for h in hist.read_log(log) if log.exists() else []:
                lv.whole.add(h)
                if now_ms - h.get_end_time_stamp() < HOUR_NS / 1e6:
                    self.recent.add(time.monotonic_ns() - int((now_ms - h.get_end_time_stamp()) * 1e6), h)

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
        with self.tail.lock:
            st = self.tail.step
            open_vals = np.concatenate(self.tail.values) if self.tail.values else np.zeros(0, dtype=np.int64)
        out = {}
        with self.live_lock:
            for name, lv in self.live.items():
                h = hist.new()
                h.add(lv.whole)
                if st is not None and st.probe == name:
                    hist.record(h, open_vals)
                last = lv.last_period.get_max_value() if lv.last_period is not None and lv.last_period.get_total_count() else None
                out[str(name)] = {"whole": h, "last_max_ns": last, "periods": lv.periods}
        return out

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
        self._away_from_probes()
        why = self.keeper.start()
        if why:
            self.notes.append(f"outliers are counted, not kept: {why}")
            self.say(f"note: outliers are counted, not kept: {why}")
        self.tail.start()
        pr = phase_runs(self.exp)[0]
        self.session.set_links_start()
        by_host, sinks = self.session.start_phase(pr, "loads", "")
        self._refresh_roles()
        if self.metrics_at is not None:
            from loopscope.monitor import metrics

            self.metrics_server = metrics.serve(self, *self.metrics_at)
            self.say(f"metrics: http://{self.metrics_at[0]}:{self.metrics_at[1]}/metrics")
        self.write_record()
        if self.view is not None:
            self.view(self)  # the live view starts
        period = int(self.settings.period)  # type: ignore[union-attr]
        while True:
            for probe in self.exp.probes:
                left = None if self.for_ns is None else self.for_ns - (time.monotonic_ns() - self.started_mono)
                if left is not None and left < 1_000_000_000:
                    self.session.end_phase(pr, by_host, sinks)
                    self.session.lab.check()
                    return
                self.period(pr, probe, period if left is None else min(period, left))

    def _away_from_probes(self) -> None:
        """Every thread of the monitor and of its agents (polars' and its I/O
        runtime's among them; threads started later inherit it) and the
        recorder it starts on CPUs no probe is pinned to. The probes an
        agent starts get the agent's first CPUs back (``procs.spawn``)."""
        away_from_probes(self.exp, [t for t in self.session.lab.lab_tids().get("lab: agent", []) if t])

    def period(self, pr: PhaseRun, probe: ProbeModel, dur_ns: int) -> None:
        self.period_no += 1
        n = self.period_no
        key = f"{probe.name}-{n:07d}"
        plan = KINDS[probe.kind].live_step(probe, key, getattr(probe, "host", None) or self.session.first.name, lambda h: self.session.lab.step_dir(h, key))
        host = plan["host"]
        rel = {k: self.session.lab.rel(plan["host"], plan[k]) for k in ("trace", "json")}
        stages = [
            {**sg, "trace": self.session.lab.rel(sg["host"], sg["trace"]), "json": self.session.lab.rel(sg["host"], sg["json"])}
            for sg in plan.get("stages") or []
        ]
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
        t0_mono = time.monotonic_ns()
        watching = self._watch(probe, Path(self.session.lab.step_dir(host, key)) / "kernel") if KINDS[probe.kind].live_capture else None
        self.tail.watch(st)
        cut: str | None = None
        died: str | None = None
        step: dict[str, Any] = {}
        try:
            step = KINDS[probe.kind].run(Steps(self.session.lab, self.exp, self.session.calib), probe, key, dur_ns)
            cut = step.get("interrupted")
        except AgentFailure as e:
            # A probe that dies is started again with the next period, and
            # counted; one that dies MAX_DEATHS periods in a row ends the monitor.
            lv = self.live[probe.name]
            if not str(e.component or "").startswith("probe") or lv.deaths_in_a_row + 1 >= MAX_DEATHS:
                raise
            lv.deaths_in_a_row += 1
            lv.restarts += 1
            died = str(e).splitlines()[0][:300]
            self.say(f"period {n}: probe {probe.name} died ({died}); it starts again with the next period")
        finally:
            if watching is not None:
                self._unwatch(watching)
            w = self.tail.finish()
            self.src.stores.pop(probe.label, None)
        t1 = time.time()
        if died is None:
            self.live[probe.name].deaths_in_a_row = 0
        self.close_period(probe, n, st, step, w, t0, t1, t0_mono, died)
        if cut:
            raise Interrupted(str(cut))

    def _watch(self, probe: ProbeModel, d: Path) -> Any:
        """A watching capture for ``probe``'s period (its probe fills its
        ``set_event_pid``), or None when the kernel refuses (said once)."""

        cap = C.Capture(d, events=C.WATCH_EVENTS, buffer_mb=C.WATCH_BUFFER_MB, name=self.watch_name, read="watch")
        meta = cap.start()
        if meta.refused:
            self.note_once(f"probe {probe.name}: its threads cannot be recorded, so it measures nothing: {meta.refused}")
            return None
        if meta.missing_events:
            self.note_once(f"probe {probe.name}: this kernel lacks {', '.join(meta.missing_events)}; its threads are measured without them")
        self.src.stores[str(probe.name)] = d
        try:
            self.watch_tids = sorted(int(t) for t in os.listdir(f"/proc/{cap.proc.pid}/task")) if cap.proc is not None else []
        except OSError:
            self.watch_tids = []
        return cap

    def _unwatch(self, cap: Any) -> None:
        """The watching capture's last read, then its instance removed."""
        cap.stop()
        if cap.final.get("error"):
            self.note_once(f"the watching capture's last read failed: {cap.final['error']}")

    def close_period(
        self, probe: ProbeModel, n: int, st: Step, step: dict[str, Any], w: pl.DataFrame, t0: float, t1: float, t0_mono: int, died: str | None = None
    ) -> None:
        lv = self.live[probe.name]
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
        self.logs[probe.name].write(h, t0, t1)
        self.recent.add(time.monotonic_ns(), h)
        with self.live_lock:
            lv.whole.add(h)
            lv.last_period = h
            lv.periods += 1
        res: dict[str, Any] = {}
        try:
            res = json.loads((self.session.run_dir / step["json"]).read_text().strip().splitlines()[-1])
        except (OSError, KeyError, ValueError, IndexError):
            pass
        row: PeriodLine = {
            "period": n,
            "probe": probe.name,
            "start_utc": _utc(t0),
            "end_utc": _utc(t1),
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
            row["max_at_utc"] = _utc((int(w["t_ns"][i]) - off) / 1e9 + to_utc)
            if int(vals[i]) > lv.max_ns:
                lv.max_ns, lv.max_at_utc = int(vals[i]), row["max_at_utc"]
        for k in ("samples", "missed", "interrupted"):
            if k in res:
                row[k] = res[k]
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
        if self.view is not None:
            self.view(self)

    def record(self) -> MonitorJson:
        s = self.settings
        assert s is not None
        c = self.keeper.counts
        with self.keeper.lock:
            counts: Counts = {
                "outliers_above": c.above,
                "kept": c.kept,
                "explained": c.explained,
                "not_kept": dict(c.not_kept),
                "windows": c.windows,
                "windows_removed": c.windows_removed,
                "kept_bytes": c.kept_bytes,
                "recorder_paused_ns": c.paused_ns,
                "by_top_cause": dict(c.by_cause),
            }
        return {
            "format": FORMAT,
            "name": self.exp.name,
            "status": self.status,
            "pid": os.getpid(),
            "started_utc": self.started_utc,
            "updated_utc": _utc(time.time()),
            "settings": s.model_dump(mode="json"),
            "periods": self.period_no,
            "probes": {
                str(k): {
                    "max_ns": v.max_ns or None,
                    "max_at_utc": v.max_at_utc,
                    "periods": v.periods,
                    "count": v.whole.get_total_count(),
                    "p99_ns": hist.quantile(v.whole, 0.99),
                    "p999_ns": hist.quantile(v.whole, 0.999),
                    "samples": v.samples,
                    "missed": v.missed,
                    "unmeasured_s": round(v.unmeasured_ns / 1e9, 3),
                    "probe_restarts": v.restarts,
                }
                for k, v in self.live.items()
            },
            "counts": counts,
            "recorder": self.keeper.why_not or f"flight recorder ({s.recorder})",
            "session": self.session.run_dir.name,
            "notes": list(self.notes),
        }

    def write_record(self) -> None:
        record.write(self.mdir, self.record())

    def teardown(self) -> None:
        self.tail.stop()
        if self.metrics_server is not None:
            self.metrics_server.shutdown()
            self.metrics_server.server_close()
        try:
            self.keeper.stop()
        finally:
            for lg in self.logs.values():
                lg.close()
            self.periods_f.close()
            self.session.teardown()
            self.status = self.session.out.status
            self.write_record()


# The monitor's own threads, once they are off the probes' CPUs, run at this
# nice: there they compete only with loads nobody measures, and at nice 0 a
# context-switch storm beside them left the tail and the recorder's reader a
# few per cent of their CPU (outliers reached the keeper 8-20 s late, when
# the kernel's buffers no longer held them).
OWN_NICE = -10


def away_from_probes(exp: Experiment, tids: list[int] | None = None) -> None:
    """This process's threads, and ``tids``, onto the CPUs no probe is pinned
    to, and this process's threads (and those they start) at ``OWN_NICE``.
    Nothing changes when no probe is pinned (the monitor would then compete
    with its probes, and shows in their attribution as ``lab: agent``)."""
    pinned = {c for p in exp.probes for c in (getattr(p, "cpu", None) or [])}
    try:
        rest = os.sched_getaffinity(0) - pinned
        if not rest or not pinned:
            return
        mine = {int(x) for x in os.listdir("/proc/self/task")}
        for t in mine | set(tids or []):
            try:
                os.sched_setaffinity(t, rest)
                if t in mine:
                    os.setpriority(os.PRIO_PROCESS, t, OWN_NICE)
            except OSError:
                pass
    except OSError:
        pass


def _utc(t: float) -> str:
    return _dt.datetime.fromtimestamp(t, _dt.timezone.utc).isoformat(timespec="milliseconds")
