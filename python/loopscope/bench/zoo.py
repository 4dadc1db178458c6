"""``loopscope bench explain``: explain scored against injected causes.

A classifier is trusted once it has been scored on cases whose answer is
known. Each case here is a short experiment on this machine: a timer probe
on one CPU (``PROBE_CPU``), a ``baseline`` phase and an ``injected`` phase
in alternating repetitions, where the injected phase adds one known cause of
lateness with a real program (stress-ng, ``ls-zoo``: the small C program in
``zoo_inject.c``, built by the bench, or a tuning of the kernel). The run is
then explained exactly as a user's run is (``analysis.explain``), and the
case is scored on what explain says of the injected phase's outliers (above
its p99): the cause ranked first, the expected cause's share and rank, its
share in the baseline phase (it must be absent there) and the share nobody
explains.

The expected cause is declared by the case, never inferred from the run.
A case this machine cannot inject (no stress-ng, one CPU, a missing kernel
feature) is reported ``skipped`` with the reason and is never counted as
passed: ``accuracy`` is over the named cases, skipped ones counting as
misses.

Injectors live either inside the lab (a ``command`` load of the injected
phase: the lab starts and stops it with the phase) or, when the case is
about a process the lab does not know (``fifo``), outside it: then a gate
load of the injected phase holds a lock on a file (``flock FILE sleep``),
and the injector acts only while the lock is held (the kernel releases it
when the load dies, however it dies). Every injector dies with the bench
(``PR_SET_PDEATHSIG``) and gives back what it changed on SIGTERM; the lab
gives back its tunings on every exit path.
"""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import tempfile
import time
from dataclasses import replace
from pathlib import Path
from typing import Callable

from typing_extensions import NotRequired, TypedDict


from loopscope.errors import RunError
from loopscope.host import shared
from loopscope.bench.zoocase import Progress, PROBE_CPU, CaseResult, Case, cases, bursts_case, spec_text, missing, _rt_throttling_off, build_zoo  # noqa: F401 (the zoo's names, for its tests)
from loopscope.bench.zooscore import score, duration_error_us, self_and_kernel_p99, run_time_ratio, rule_top, remedy_of
from loopscope.bench.zooanomaly import AnomalyResult, anomalies, run_anomaly
from loopscope.analysis.explain import explain
from loopscope.bench import recorders as REC
from loopscope.kinds import KINDS
from loopscope.host import cpulimit
from loopscope.host import swapfile
from loopscope.errors import InputError
from rich.console import Console
from rich.table import Table
from loopscope.units import format_ns


class ZooBench(TypedDict):
    """What ``loopscope bench explain --json`` prints."""

    remedies_that_helped: list[str] | None
    cases: list[CaseResult]
    accuracy: float | None
    #: the same score for rtla's rule (blame whoever ran when the timer fired) on the same outliers
    baseline_accuracy: float | None
    #: the bursts case (known lengths at known instants; not among the named cases): its entry, and the median
    #: absolute difference between the time explain gives the bursts in each outlier and the bursts' overlap with it
    bursts: NotRequired[CaseResult | None]
    duration_error_us: NotRequired[float | None]
    #: who recorded the kernel (native: loopscope's capture), the event set, and its tracepoints
    recorder: NotRequired[str]
    events: NotRequired[str]
    event_list: NotRequired[list[str]]
    anomalies: list[AnomalyResult]
    ran: int
    skipped: int
    settings: dict[str, str | float | int]
    seconds: float
    workdir: str


def _start_outside(argv: list[str], gate: Path, log: Path) -> subprocess.Popen[bytes]:
    with open(log, "ab") as f:
        p = subprocess.Popen([*argv, "--gate", str(gate)], stdout=f, stderr=f, start_new_session=True)
    time.sleep(0.2)
    if p.poll() is not None:
        raise RunError(f"bench explain: the injector {Path(argv[0]).name} {argv[1]} exited at once ({p.returncode}): {log.read_text()[-400:]}")
    return p


def _stop(p: subprocess.Popen[bytes] | None) -> None:
    if p is None or p.poll() is not None:
        return
    try:
        os.killpg(p.pid, signal.SIGTERM)
        p.wait(timeout=5)
    except (ProcessLookupError, subprocess.TimeoutExpired):
        try:
            os.killpg(p.pid, signal.SIGKILL)
        except ProcessLookupError:
            pass
        p.wait()


def run_case(
    case: Case, work: Path, duration_s: float, reps: int, say: Callable[[str], None], remedies: bool = True, recorder: str = "native", events: str = "full"
) -> CaseResult:
    why = missing(case) or (REC.missing(recorder) if recorder != "native" else None)
    if why:
        return {"name": case.name, "expected": case.expected, "injected": case.what, "skipped": why}
    if recorder != "native" and case.cpu_limit:
        # no look at the kernel's groups without loopscope's capture: the limit is named without its group
        case = replace(case, also=[*case.also, "throttled: CPU limit"])
    d = work / case.name
    d.mkdir(parents=True, exist_ok=True)
    gate = d / "gate.pid" if case.outside is not None else None
    (d / "spec.yaml").write_text(spec_text(case, duration_s, reps, gate, capture=recorder == "native"))
    run_dir = next(d / f"run-{i}" for i in range(1, 10_000) if not (d / f"run-{i}").exists())
    outside = None
    swap = None
    try:
        if case.cpu_limit:
            cpulimit.make(*case.cpu_limit)
        if case.swap_mb:
            swap = swapfile.create(case.swap_mb)
        if case.outside and gate is not None:  # [] : the probe itself reads the gate
            outside = _start_outside(case.outside, gate, d / "injector.log")
        say(f"  {case.name}: {case.what} ({reps} × baseline/injected, {duration_s:g} s each) …")
        cmd = [sys.executable, "-m", "loopscope.cli", "run", str(d / "spec.yaml"), "--run-dir", str(run_dir), "--no-report"]
        present: list[str] | None = None
        if recorder == "native":
            r = subprocess.run(cmd, capture_output=True, text=True, timeout=600)
            if r.returncode != 0:
                raise RunError(f"bench explain: case {case.name}: the run failed ({r.returncode}): {r.stderr.strip()[-800:]}")
        else:
            rec = REC.record(recorder, events, d / ("kernel.dat" if recorder == "trace-cmd" else "perf.data"), cmd)
            status = json.loads((run_dir / "run.json").read_text()).get("status") if (run_dir / "run.json").exists() else None
            if status != "completed":
                raise RunError(f"bench explain: case {case.name}: the run under {recorder} did not complete ({status or 'no run.json'}; see {run_dir})")
            present = REC.attach(run_dir, rec)
            rec.unlink(missing_ok=True)
        say(f"  {case.name}: explaining …")

        res = explain(run_dir, KINDS, all_causes=True)
        if res is None:
            raise RunError(f"bench explain: case {case.name}: the run has no kernel capture to explain")
        out = score(case, res)
        out["run"] = str(run_dir)
        if present is not None and (inv := REC.invisible(case.expected, set(present))):
            out["invisible"] = inv
        if case.self_check:
            out["self_p99_ns"], out["loopscope_p99_ns"] = self_and_kernel_p99(run_dir, case.self_check, "injected")
        if case.expected == "slowed: no kernel event":
            out["run_time_ratio"] = run_time_ratio(run_dir)
        out["baseline_top"] = rule_top(run_dir, "injected")
        out["baseline_ok"] = out["baseline_top"] in (case.expected, *case.also)
        if remedies:  # the injectors and the swap stay for the follow-up: it runs the injected phase again
            out["remedy"] = remedy_of(case, run_dir, reps, say)
    finally:
        _stop(outside)
        if swap is not None:
            swapfile.remove(swap)
        if case.shared:
            shared.remove(shared.path())
        if case.cpu_limit:
            g = cpulimit.group_dir(case.cpu_limit[0])
            if g is not None:
                cpulimit.remove(g)
    return out


def run(
    *,
    only: list[str] | None = None,
    quick: bool = False,
    duration_s: float | None = None,
    reps: int | None = None,
    workdir: str | None = None,
    progress: Progress = None,
    remedies: bool = True,
    recorder: str = "native",
    events: str = "full",
) -> ZooBench:
    say = progress or (lambda _m: None)
    duration_s = duration_s or (2.0 if quick else 5.0)
    reps = reps or (1 if quick else 3)
    # the names first (the programs' paths do not change them): a refused --case makes and leaves nothing
    every, odd = cases("zoo", "lock", "table", "ping"), anomalies("zoo", "poll", "table")
    unknown = sorted(set(only or []) - {c.name for c in every} - {f"anomaly-{a.name}" for a in odd} - {"anomalies", "bursts"})
    if unknown:
        raise InputError(
            f"--case: no case named {', '.join(unknown)}; the cases are {', '.join(c.name for c in every)}, bursts, anomalies (all three) or {', '.join('anomaly-' + a.name for a in odd)}"
        )
    work = Path(workdir) if workdir else Path(tempfile.mkdtemp(prefix="loopscope-zoo-"))
    work.mkdir(parents=True, exist_ok=True)
    progs = build_zoo(work)
    every = cases(progs["zoo"], progs["lock"], progs["table"], progs["ping"])
    odd = anomalies(progs["zoo"], progs["poll"], progs["table"], quick)
    chosen = [c for c in every if not only or c.name in only]
    odd = [a for a in odd if not only or "anomalies" in only or f"anomaly-{a.name}" in only]
    t0 = time.monotonic()
    native = recorder == "native"
    remedies = remedies and native  # the follow-up proves a remedy with loopscope's capture; another recorder is scored on names
    if not native:
        odd = []  # the anomalies' detectors read the probes' records, not the recorder's: nothing to compare
    results = [run_case(c, work, duration_s, reps, say, remedies, recorder, events) for c in chosen]
    timed: CaseResult | None = None
    error_us = None
    if native and (not only or "bursts" in only):
        log = work / "bursts" / "bursts.log"
        log.parent.mkdir(parents=True, exist_ok=True)
        log.unlink(missing_ok=True)
        timed = run_case(bursts_case(progs["zoo"], log), work, duration_s, reps, say, remedies=False)
        error_us = duration_error_us(Path(timed["run"]), log) if timed.get("run") else None
    found = [run_anomaly(a, work, say) for a in odd]
    ran = [r for r in results if not r.get("skipped")]
    hit = sum(1 for r in ran if r.get("expected_rank") == 1)
    helped = [r["name"] for r in ran if (r.get("remedy") or {}).get("significant")]
    # the runs stay for a look (loopscope report / explain RUN); say where, and that they are the user's to remove
    say(f"the cases' experiments and runs are kept in {work} (remove it when done; --dir chooses where)")
    return {
        "remedies_that_helped": helped if remedies else None,
        "cases": results,
        "accuracy": hit / len(results) if results else None,
        "baseline_accuracy": sum(1 for r in ran if r.get("baseline_ok")) / len(results) if results else None,
        "anomalies": found,
        "bursts": timed,
        "duration_error_us": error_us,
        "recorder": recorder,
        "events": events,
        "event_list": _event_list(recorder, events),
        "ran": len(ran),
        "skipped": len(results) - len(ran),
        "settings": {"duration_s": duration_s, "repetitions": reps, "probe": f"timer 1 kHz on CPU {PROBE_CPU}", "threshold": "p99 of each phase"},
        "seconds": time.monotonic() - t0,
        "workdir": str(work),
    }


def _event_list(recorder: str, events: str) -> list[str]:
    """The tracepoints the recorder was asked for (loopscope's capture filters some: docs/explain.md)."""
    if recorder == "perf" and events == "minimal":
        return ["perf sched record (sched:sched_switch, sched:sched_wakeup, sched:sched_wakeup_new, sched:sched_migrate_task, sched:sched_stat_*)"]
    return REC.events_of(events)


def _pct(v: float | None) -> str:
    return f"{100 * v:.1f} %" if v is not None else "–"


def print_human(r: ZooBench) -> None:
    t = Table(title="explain against injected causes (the injected phase's outliers, above its p99)")
    for col in ("case", "expected", "rank", "share", "top cause", "baseline", "unexplained", "outliers", "rtla's rule blames", "remedy: p99 ratio [95 % CI]"):
        t.add_column(col)
    for c in r["cases"]:
        if c.get("skipped"):
            t.add_row(c["name"], c["expected"], "skipped", c["skipped"], "", "", "", "", "", "")
            continue
        rem = c.get("remedy") or {}
        ratio, ci = rem.get("ratio_p99"), rem.get("ci95")
        rtext = f"{ratio:.2f} [{ci[0]:.2f}, {ci[1]:.2f}]{' *' if rem.get('significant') else ''}" if ratio is not None and ci else (rem.get("why") or "–")
        t.add_row(
            c["name"],
            c["expected"],
            str(c["expected_rank"] or "absent"),
            _pct(c["expected_share"]),
            f"{c['top_cause']} ({_pct(c['top_share'])})",
            _pct(c["baseline_expected_share"]),
            _pct(c["unexplained_share"]),
            str(c["outliers"]),
            f"{c.get('baseline_top') or '–'}{' (right)' if c.get('baseline_ok') else ''}",
            rtext,
        )
    con = Console()
    con.print(t)
    if r.get("anomalies"):
        a = Table(title="the study's anomalies, injected: detected and named")
        for col in ("anomaly", "injected", "detected", "expected cause", "named", "ok"):
            a.add_column(col)

        for x in r["anomalies"]:
            if x.get("skipped"):
                a.add_row(x["name"], format_ns(x["injected_ns"]), "skipped", x["expected"], x["skipped"], "no")
                continue
            named = f"{x['cause']} ({x['windows_with_cause']} of {x['windows']} windows)" if x.get("cause") else "–"
            a.add_row(
                x["name"],
                format_ns(x["injected_ns"]),
                format_ns(x["detected_ns"]) if x["detected_ns"] is not None else "not detected",
                x["expected"],
                named,
                "yes" if x["ok"] else "no",
            )
        con.print(a)
    if r.get("bursts") and not (r["bursts"] or {}).get("skipped"):
        b = r["bursts"] or {}
        err = r.get("duration_error_us")
        con.print(
            f"bursts (known lengths at known instants): {b.get('expected')} {_pct(b.get('expected_share'))} of the outliers' time; "
            f"explain's time against the injected overlap: median error {f'{err:.1f} µs' if err is not None else '–'}"
        )
    if r.get("baseline_accuracy") is not None:
        con.print(f"rtla's rule (blame whoever ran when the timer fired) on the same outliers: accuracy {r['baseline_accuracy']:.2f}")
    con.print(
        f"accuracy: {r['accuracy']:.2f} ({r['ran']} ran, {r['skipped']} skipped; a skipped case counts as a miss); {r['seconds']:.0f} s; runs in {r['workdir']}"
    )
