"""``loopscope bench kcapture``: what recording kernel events costs the thing measured.

Two scenarios, each alternating runs without and with the capture, so both
sides sample the same state of this shared machine:

- ``timer-idle``: the timer probe (1 kHz, ``seconds`` per run) on the idle
  machine, alone and with the kernel capture (a tracefs instance, drained
  after the probe). The easy case: few events.
- ``pipeline-busy``: the demo's control-loop pipeline across four netns
  hosts (five nodes, a 2 ms emulated link) under a 200 Mbit/s UDP flood, as
  a full lab run with ``kernel.capture: off`` or ``on``. The hard case: the
  flood makes 300 k kernel events a second. The latency is every stage's
  kernel→application wait, pooled. ``aa_spread`` is the p99 ratio between
  two halves of the runs without capture (alternate runs): the noise floor
  any with/without ratio must be read against.

``self_share`` is the share of the outliers' time (above each group's p99)
that attribution gives to ``lab: capture`` in the runs with capture. With
``--designs`` the busy scenario also runs the designs the capture was chosen
against: ``continuously`` (the same reader at SCHED_IDLE, reading whenever
the kernel has events) and ``perf`` (``perf record`` on the same
tracepoints, the capture loopscope used before).

One run's p99 on this machine varies more than most effects, so every
figure is the median over its runs, and the runs are listed. Each scenario
is judged against its target (``verdict``: met, not met, or
``inconclusive`` when two halves of the runs without capture differ by
more than the target allows, so that no ratio could be told from noise);
by default the bench adds pairs of runs until the noise floor is inside
the target, up to a cap. The idle timer is judged by its p99 ratio; the
busy pipeline by the worse of its p50 and p99 ratios and, whatever the
noise, by its reader's share of a CPU (at most 5 %); either is not met
when the capture shows up in its own outliers beyond ``self_share``'s 2 %.
"""

from __future__ import annotations

import json
import shutil
import signal
import statistics
import subprocess
import sys
import time
from pathlib import Path
from typing import Callable

from typing_extensions import TypedDict

import numpy as np

from loopscope.rundir import Capture, KernelRecord, RunDir
from loopscope.errors import RunError
from loopscope.analysis.explained import CaptureSummary, opened
from loopscope.analysis import attribution as A
from loopscope.kernel import store as S
from loopscope.kernel import capture
from loopscope.lab import controller
from loopscope.analysis import explain
import os
from loopscope.units import format_ns
import polars as pl
from loopscope.analysis.explain import attribute_store
from loopscope.trace import reader
from loopscope.probes.pipeline import messages_from
from loopscope.kernel.capture import EVENTS
from loopscope.kinds import KINDS
from loopscope.host import scratch


class RunStats(TypedDict, total=False):
    """One run without or with the capture (ns; counts of the capture's run)."""

    p50_ns: float | None
    p99_ns: float | None
    max_ns: float | None
    waits: int
    kernel_events: int
    lost_kernel_events: int
    bytes_on_disk: int
    bytes_per_s: float | None
    seconds: float | None
    reads_half_full: int
    reads_during_windows: int | None
    reader_cpu_share: float | None
    #: of the reader's CPU time, its start and set-up (the kernel zeroing its ring buffers is most of it)
    reader_setup_cpu_s: float | None
    self: tuple[int, int]  # (ns explain gave lab: capture, outliers' ns), pooled into self_share
    self_share: float


class Scenario(TypedDict, total=False):
    """One scenario: medians of the runs each way, their ratios and the verdict."""

    name: str
    p50_ns_without: float | None
    p99_ns_without: float | None
    p50_ns_with: float | None
    p99_ns_with: float | None
    kernel_events: float | None
    lost_kernel_events: int
    bytes_per_s: float | None
    reader_cpu_share: float | None
    #: the median reader's start and set-up, in CPU seconds (inside reader_cpu_share)
    reader_setup_cpu_s: float | None
    self_share: float
    runs_without: list[RunStats]
    runs_with: list[RunStats]
    p99_ratio: float | None
    p50_ratio: float | None
    aa_spread: float | None
    #: the most either judged ratio may be (timer-idle: the p99's; pipeline-busy: the p50's and the p99's)
    target: float
    #: met, not met, or inconclusive (the noise floor wider than the target)
    verdict: str
    designs: dict[str, "Scenario"]
    context: dict[str, int | float | str | list[str]]


class KcaptureBench(Scenario, total=False):
    """What ``loopscope bench kcapture --json`` prints: every scenario, and the
    idle timer's figures at the top level (as earlier versions printed them)."""

    scenarios: list[Scenario]
    perf_cpu_share: float | None
    events: list[str]
    missing_events: list[str]


PIPELINE = """name: bench-kcapture
hosts: [{{name: h1}}, {{name: h2}}, {{name: h3}}, {{name: h4}}]
links:
  - between: [h3, h4]
    delay: 2ms
probes:
  - kind: pipeline
    name: loop
    source: h1
    nodes: [h2, h3, h4, h3, h2]
    sink: h1
    rate: 1000pps
    size: 256
    work_us: 50
loads:
  - {{name: flood, kind: net, host: h2, dest: "h4:9000", rate: 200Mbit, size: 1400}}
phases:
  - {{name: network, loads: [flood]}}
duration: {seconds}s
warmup: 1s
repetitions: 1
kernel: {{capture: "{capture}", read: {read}}}
"""


def _timer(seconds: float, work: Path, tag: str) -> RunStats:
    r = subprocess.run(
        [
            sys.executable,
            "-m",
            "loopscope.cli",
            "probe",
            "timer",
            "--interval-us",
            "1000",
            "--duration",
            f"{seconds:g}s",
            "--json",
            "--trace",
            str(work / f"{tag}.lstrace"),
        ],
        capture_output=True,
        text=True,
        timeout=seconds + 60,
    )
    if r.returncode != 0:
        raise RunError(f"bench kcapture: the timer probe failed: {r.stderr.strip()[-400:]}")
    j = json.loads(r.stdout)
    return {"p50_ns": j["p50_ns"], "p99_ns": j["p99_ns"], "max_ns": j["max_ns"]}


def _self_share(shares: list[tuple[int, int]]) -> float:
    """Pooled lab: capture time over pooled outlier time."""
    total = sum(t for _, t in shares)
    return sum(c for c, _ in shares) / total if total else 0.0


def _timer_self_share(cap_dir: Path, trace: Path) -> tuple[int, int]:
    """(ns attributed to lab: capture, outlier ns) for the timer's outliers above its p99."""
    st = S.open_dir(cap_dir)
    df = reader.read(trace, sort=False)
    wakeups = (pl.col("group").cast(pl.String) == "timer") & (pl.col("name").cast(pl.String) == "wakeup")
    iv = df.filter(pl.col("kind").cast(pl.String) == "interval", wakeups)
    if not len(iv):
        return 0, 0
    thr = iv["dur_ns"].quantile(0.99, "linear")
    o = (
        iv.filter(pl.col("dur_ns") > thr)
        .with_row_index("id")
        .select(
            pl.col("id").cast(pl.Int64),
            pl.col("tid").cast(pl.Int64),
            pl.col("t_ns").alias("start_k"),
            (pl.col("t_ns") + pl.col("dur_ns")).alias("end_k"),
            pl.lit(False).alias("span"),
        )
    )
    att = attribute_store(st, o)
    fam = att.with_columns(A.family().alias("f"))
    return int(fam.filter(pl.col("f") == "lab: capture")["ns"].sum()), int(fam["ns"].sum())


def timer_idle(plan: "Pairs", secs: float, work: Path, say: Callable[[str], None]) -> Scenario:

    without: list[RunStats] = []
    with_: list[RunStats] = []
    i = 0
    while plan.more(without, TARGETS["timer-idle"]):
        say(f"  timer-idle {i + 1}/{plan.label(i)}: timer alone ({secs:g} s) …")
        j = _timer(secs, work, f"alone{i}")
        without.append(j)
        say(f"  timer-idle {i + 1}/{plan.label(i)}: timer under kernel capture ({secs:g} s) …")
        cap = capture.Capture(work / f"cap{i}", window_s=secs)
        meta = cap.start()
        if meta.refused:
            raise RunError(f"bench kcapture: {meta.refused}")
        try:
            j = _timer(secs, work, f"with{i}")
            cap.drain("after the probe")
        finally:
            meta = cap.stop()
        rd = meta.reader or {}
        with_.append(
            {
                "p50_ns": j["p50_ns"],
                "p99_ns": j["p99_ns"],
                "max_ns": j["max_ns"],
                "kernel_events": int(rd.get("events") or 0),
                "lost_kernel_events": int(rd.get("lost_events") or 0),
                "bytes_on_disk": int(rd.get("bytes_written") or 0),
                "seconds": meta.seconds,
                "reads_half_full": int(rd.get("reads_half_full") or 0),
                "reader_cpu_share": meta.reader_cpu_s / meta.seconds if meta.reader_cpu_s is not None and meta.seconds else None,
                "reader_setup_cpu_s": meta.reader_setup_cpu_s,
                "self": _timer_self_share(work / f"cap{i}", work / f"with{i}.lstrace"),
            }
        )
        shutil.rmtree(work / f"cap{i}", ignore_errors=True)
        i += 1
    return _judged(_summary("timer-idle", without, with_), without, "timer-idle")


def _pipeline_waits(run_dir: Path) -> np.ndarray:
    """Every stage's kernel→application wait of every message (ns), pooled."""
    out = []
    for st in RunDir(run_dir).record().steps:
        if not st.stages:
            continue
        m = messages_from(reader.read(run_dir / st.trace, sort=False))
        for c in m.columns if len(m) else []:
            if c.endswith("_stack_ns"):
                out.append(m[c].to_numpy())
    return np.concatenate(out) if out else np.array([], dtype=np.int64)


def _lab_run(spec: Path, run_dir: Path, perf: bool, work: Path) -> np.ndarray:
    """The run's pooled stage waits (``_pipeline_waits``)."""

    pp = None
    if perf:
        (work / "perf").mkdir(exist_ok=True)
        data = work / "perf" / f"{run_dir.name}.perf"
        a = ["perf", "record", "-q", "-a", "-k", "mono", "-m", "1024", "-o", str(data)]
        for e in EVENTS:
            a += ["-e", e]
        pp = subprocess.Popen(a, stdin=subprocess.DEVNULL, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL, start_new_session=True)
        time.sleep(1.0)
    try:
        out = controller.run(str(spec), run_dir=str(run_dir))
    finally:
        if pp is not None:
            pp.send_signal(signal.SIGINT)
            pp.wait(timeout=60)
    if out.status != "completed":
        raise RunError(f"bench kcapture: the pipeline run {run_dir.name} {out.status}: {out.error}")
    if perf:
        # The old capture's file, named in run.json the way runs recorded with it were.
        rd = RunDir(run_dir)
        run = rd.record()
        dest = run_dir / "hosts" / "h1" / "kernel"
        dest.mkdir(parents=True, exist_ok=True)
        shutil.move(str(data), dest / "kernel.perf")
        run.kernel = KernelRecord(captures=[Capture(host="h1", covers=["h1", "h2", "h3", "h4"], data="hosts/h1/kernel/kernel.perf", timens_offset_ns=0)])
        rd.write_record(run)
    return _pipeline_waits(run_dir)


def _explain_self(run_dir: Path) -> tuple[tuple[int, int], CaptureSummary | None]:

    ex = explain.explain(run_dir, KINDS)
    cap_ns = tot = 0
    for g in ex["groups"] if ex else []:
        if " stack (" not in g["probe"]:
            continue
        tot += g["outlier_ns"]
        cap_ns += int(round(g["lab"].get("lab: capture", 0.0) * g["outlier_ns"]))
    return (cap_ns, tot), (opened(ex["captures"][0]) if ex and ex["captures"] else None)


def pipeline_busy(plan: "Pairs", secs: float, work: Path, say: Callable[[str], None], designs: list[str]) -> Scenario:
    specs = {}
    for d in ["off", *designs]:
        capture = "off" if d in ("off", "perf") else "on"
        read = "continuously" if d == "continuously" else "between-windows"
        specs[d] = work / f"pipeline-{d}.yaml"
        specs[d].write_text(PIPELINE.format(seconds=f"{secs:g}", capture=capture, read=read))
    runs: dict[str, list[RunStats]] = {d: [] for d in specs}
    i = 0
    while plan.more(runs["off"], TARGETS["pipeline-busy"]):
        for d in specs:
            say(f"  pipeline-busy {i + 1}/{plan.label(i)}: {'without capture' if d == 'off' else 'capture: ' + d} ({secs:g} s under a 200 Mbit/s flood) …")
            rd = work / f"run-{d}-{i}"
            r = _lab_run(specs[d], rd, d == "perf", work)
            w = r
            row: RunStats = {
                "p50_ns": float(np.percentile(w, 50)) if len(w) else None,
                "p99_ns": float(np.percentile(w, 99)) if len(w) else None,
                "waits": int(len(w)),
            }
            if d != "off":
                (c, t), cap = _explain_self(rd)
                row["self"] = (c, t)
                if cap is not None:
                    row.update(
                        {
                            "kernel_events": cap["events"],
                            "lost_kernel_events": cap["lost_events"],
                            "bytes_per_s": cap["bytes_per_s"],
                            "reader_cpu_share": cap["reader_cpu_share"] if cap["reader_cpu_share"] is not None else cap["perf_cpu_share"],
                            "reads_during_windows": cap["reads_during_windows"],
                            "reader_setup_cpu_s": cap.get("reader_setup_cpu_s"),
                        }
                    )
            runs[d].append(row)
            shutil.rmtree(rd, ignore_errors=True)
        i += 1
    without = runs.pop("off")
    out = _judged(_summary("pipeline-busy", without, runs[designs[0]]), without, "pipeline-busy")
    out["designs"] = {d: _judged(_summary(f"pipeline-busy ({d})", without, rs), without, "pipeline-busy") for d, rs in runs.items()}
    return out


# The targets: the ratios with capture over without, per scenario
# (timer-idle: the p99; pipeline-busy: its p99 and its p50), and what the
# reader may take of a CPU under the flood.
TARGETS = {"timer-idle": 1.05, "pipeline-busy": 1.05}
JUDGED = {"timer-idle": ["p99_ratio"], "pipeline-busy": ["p99_ratio", "p50_ratio"]}
SELF_SHARE_TARGET = 0.02
READER_SHARE_TARGET = {"pipeline-busy": 0.05}


def aa_spread(without: list[RunStats]) -> float | None:
    """The p99 of alternate runs without capture over the others': the noise
    floor a with/without ratio is read against (1.0 on a quiet machine)."""
    a = [p for x in without[0::2] if (p := x.get("p99_ns"))]
    b = [p for x in without[1::2] if (p := x.get("p99_ns"))]
    return float(statistics.median(a) / statistics.median(b)) if a and b else None


def verdict(ratio: float | None, spread: float | None, target: float, self_share: float, reader_over: bool = False) -> str:
    """``met``, ``not met`` or ``inconclusive``: a ratio (the worst of those
    judged) is judged only when the noise floor is inside the target (two
    halves of the runs without capture differ by less than the effect the
    target allows). The capture in its own outliers, or a reader over its
    share of a CPU (``reader_over``), is not met whatever the noise."""
    if self_share > SELF_SHARE_TARGET or reader_over:
        return "not met"
    if ratio is None or spread is None or max(spread, 1 / spread) > target:
        return "inconclusive"
    return "met" if ratio <= target else "not met"


def _judged(s: Scenario, without: list[RunStats], scenario: str) -> Scenario:
    s["aa_spread"] = aa_spread(without)
    s["target"] = TARGETS[scenario]
    ratios = [s.get(k) for k in JUDGED[scenario]]
    worst = None if any(r is None for r in ratios) else max(float(r) for r in ratios)  # type: ignore[arg-type]
    share, most = s.get("reader_cpu_share"), READER_SHARE_TARGET.get(scenario)
    s["verdict"] = verdict(worst, s["aa_spread"], TARGETS[scenario], s.get("self_share", 0.0), most is not None and share is not None and share > most)
    return s


class Pairs:
    """How many alternating pairs to run: ``fixed`` when the user said so,
    else at least ``least`` and then more, up to ``most``, until the noise
    floor (``aa_spread``) is inside the target, so that a ratio can be judged."""

    def __init__(self, least: int, most: int, fixed: bool) -> None:
        self.least, self.most, self.fixed = least, most, fixed

    def more(self, without: list[RunStats], target: float) -> bool:
        return self.more_at(len(without), lambda: aa_spread(without), target)

    def more_at(self, n: int, spread: Callable[[], float | None], target: float) -> bool:
        """``more`` for ``n`` runs without, whose noise floor ``spread`` gives."""
        if n < self.least:
            return True
        if self.fixed or n >= self.most:
            return False
        sp = spread()
        return sp is None or max(sp, 1 / sp) > target or n % 2 == 1

    def label(self, i: int) -> str:
        return str(self.least) if self.fixed or i < self.least else f"{self.least}…{self.most}"


def _med(xs: list[RunStats], k: str) -> float | None:
    v = [float(x) for r in xs if isinstance(x := r.get(k), (int, float))]
    return float(statistics.median(v)) if v else None


def _ratio(a: float | None, b: float | None) -> float | None:
    return a / b if a and b else None


def _summary(name: str, without: list[RunStats], with_: list[RunStats]) -> Scenario:
    if any("bytes_per_s" in x for x in with_):
        bps = _med(with_, "bytes_per_s")
    else:
        per = [x.get("bytes_on_disk", 0) / secs for x in with_ if (secs := x.get("seconds"))]
        bps = float(statistics.median(per)) if per else None
    runs_with: list[RunStats] = []
    for x in with_:
        c, t = x.get("self", (0, 0))
        row: RunStats = {k: v for k, v in x.items() if k != "self"}  # type: ignore[assignment]
        row["self_share"] = c / t if t else 0.0
        runs_with.append(row)
    s: Scenario = {
        "name": name,
        "p50_ns_without": _med(without, "p50_ns"),
        "p99_ns_without": _med(without, "p99_ns"),
        "p50_ns_with": _med(with_, "p50_ns"),
        "p99_ns_with": _med(with_, "p99_ns"),
        "kernel_events": _med(with_, "kernel_events"),
        "lost_kernel_events": sum(x.get("lost_kernel_events") or 0 for x in with_),
        "bytes_per_s": bps,
        "reader_cpu_share": _med(with_, "reader_cpu_share"),
        "reader_setup_cpu_s": _med(with_, "reader_setup_cpu_s"),
        "self_share": _self_share([x["self"] for x in with_ if "self" in x]),
        "runs_without": without,
        "runs_with": runs_with,
    }
    s["p99_ratio"] = _ratio(s["p99_ns_with"], s["p99_ns_without"])
    s["p50_ratio"] = _ratio(s["p50_ns_with"], s["p50_ns_without"])
    return s


def run(
    *,
    quick: bool = False,
    runs: int | None = None,
    seconds: float | None = None,
    scenarios: list[str] | None = None,
    designs: bool = False,
    progress: Callable[[str], None] | None = None,
) -> KcaptureBench:

    say = progress or (lambda s: None)
    want = scenarios or ["timer-idle", "pipeline-busy"]
    have, lack, refused = capture.available()
    if refused:
        raise RunError(f"bench kcapture: kernel capture is not possible here: {refused}")
    if "pipeline-busy" in want and os.geteuid() != 0:
        raise RunError("bench kcapture: the pipeline-busy scenario needs root (network namespaces); run it as root or pass --scenario timer-idle")
    dz = ["between-windows"] + (["continuously"] + (["perf"] if shutil.which("perf") else []) if designs else [])
    out: KcaptureBench = {"scenarios": []}
    with scratch.directory("bench-kcapture") as d:
        work = Path(d)
        if "timer-idle" in want:
            plan = Pairs(runs or (2 if quick else 6), runs or (2 if quick else 24), bool(runs) or quick)
            secs = seconds or (2.0 if quick else 10.0)
            t = timer_idle(plan, secs, work, say)
            t["context"] = {"runs": len(t["runs_without"]), "seconds": secs, "interval_us": 1000}
            out["scenarios"].append(t)
            # Today's top-level keys are the idle timer's (perf_cpu_share: the capture's reader now).
            for k in (
                "p50_ns_without",
                "p99_ns_without",
                "p50_ns_with",
                "p99_ns_with",
                "kernel_events",
                "lost_kernel_events",
                "runs_without",
                "runs_with",
                "p99_ratio",
                "p50_ratio",
            ):
                out[k] = t[k]
            out["perf_cpu_share"] = t.get("reader_cpu_share")
            out["context"] = t["context"]
        if "pipeline-busy" in want:
            plan = Pairs(runs or (2 if quick else 10), runs or (2 if quick else 30), bool(runs) or quick)
            secs = seconds or (2.0 if quick else 5.0)
            p = pipeline_busy(plan, secs, work, say, dz)
            p["context"] = {"runs": len(p["runs_without"]), "seconds": secs, "rate_pps": 1000, "flood": "200 Mbit/s UDP h2 → h4", "designs": dz}
            out["scenarios"].append(p)
    out["events"] = have
    out["missing_events"] = lack
    return out


def print_human(r: KcaptureBench) -> None:

    def f(x: float | None) -> str:
        return format_ns(x) if x is not None else "–"

    for s in r["scenarios"]:
        c = s["context"]
        print(f"{s['name']}: {c['runs']} runs each way, {c['seconds']:g} s, alternating; medians")
        rows = [("between-windows", s)] + [(d, x) for d, x in (s.get("designs") or {}).items() if d != "between-windows"]
        for d, x in rows:
            print(
                f"  {d:16s} p50 {f(x['p50_ns_without'])} → {f(x['p50_ns_with'])} (×{x['p50_ratio'] or float('nan'):.3f}), "
                f"p99 {f(x['p99_ns_without'])} → {f(x['p99_ns_with'])} (×{x['p99_ratio'] or float('nan'):.3f}); "
                f"lab: capture {x['self_share'] * 100:.2f} % of the outliers' time; "
                f"{(x['kernel_events'] or 0):,.0f} events/run, {x['lost_kernel_events']} lost"
                + (f", {bps / 1e6:.2f} MB/s on disk" if (bps := x.get("bytes_per_s")) else "")
                + (f", reader {share * 100:.1f} % of a CPU" if (share := x.get("reader_cpu_share")) is not None else "")
                + (f" ({setup:.2f} s of it its start and ring buffers)" if (setup := x.get("reader_setup_cpu_s")) is not None else "")
            )
        if s.get("aa_spread") is not None:
            print(f"  noise floor: p99 of one half of the runs without capture over the other: ×{s['aa_spread']:.3f}")
        print(
            f"  target {' and '.join(k.split('_')[0] for k in JUDGED.get(s['name'], ['p99_ratio']))} ×{s['target']:.2f}, lab: capture ≤ {SELF_SHARE_TARGET * 100:.0f} %"
            + (f", reader ≤ {most * 100:.0f} % of a CPU" if (most := READER_SHARE_TARGET.get(s["name"])) is not None else "")
            + f": {s['verdict']}"
            + (" (the noise floor is wider than the target: more runs, or a quieter machine)" if s["verdict"] == "inconclusive" else "")
        )
        print(f"    p99 per run without: {', '.join(f(x['p99_ns']) for x in s['runs_without'])}")
        print(f"    p99 per run with:    {', '.join(f(x['p99_ns']) for x in s['runs_with'])}")
