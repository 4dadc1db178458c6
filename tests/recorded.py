"""Recorded runs: real runs of loopscope, checked in under
tests/fixtures/runs/NAME, that the fast tier analyses (compare, report,
dataset) without starting a lab. A test takes a copy in its tmp dir (the
commands that read a run write beside it).

Each recipe is the experiment files the run was made from; re-record one with

    python -m tests.recorded NAME

on a quiet machine (root, stress-ng installed), and commit what changed. A
change to the run directory's format that the readers refuse shows up as a
failing fast-tier test: re-record then.
"""

from __future__ import annotations

import shutil
import subprocess
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
RUNS = ROOT / "tests" / "fixtures" / "runs"
BIN = ROOT / ".venv" / "bin" / "loopscope"

# compare: five repetitions of a 1 kHz timer on CPU 0, quiet and beside a
# nice -20 CPU hog on that CPU (the probe at SCHED_OTHER: the hog wins).
COMPARE = """name: {name}
probes:
  - {{kind: timer, interval_us: 1000, cpu: [0]}}
loads:
  - {{name: hog, kind: command, command: "nice -n -20 stress-ng --cpu 1 --taskset 0 --quiet"}}
phases:
  - {{name: run, loads: [{loads}]}}
duration: 1s
repetitions: 5
kernel: {{capture: off}}
"""

# report: three probes under two loads, two repetitions, the kernel captured.
REPORT = """name: rep
probes:
  - kind: timer
    interval_us: 1000
  - kind: sched
    sleep_us: 500
    work_us: 500
  - kind: syscall
    calls: [getpid, open, read]
    max_seconds_per_call: 0.3
    target_pct: 10
loads:
  - kind: cpu
    level: 2
  - kind: io
    level: 1
duration: 600ms
repetitions: 2
"""

# dataset: three runs of two experiments in one results directory (each
# with its report: the tables the dataset reads), one with the kernel captured.
DATASET = """name: {name}
probes:
  - {{kind: timer, interval_us: 1000}}
loads:
  - {{name: cpu, kind: cpu, level: 1}}
phases:
  - {{name: baseline}}
  - {{name: cpu, loads: [cpu]}}
duration: 400ms
repetitions: 2
kernel: {{capture: {capture}}}
"""

# monitor: a timer probe on CPU 1 beside a hog at nice -20 that takes the
# CPU a tenth of the time, watched in 3 s periods for 10 s: its outliers are
# kept and named by the flight recorder (the dataset's monitor views).
MONITOR = """name: watch
probes:
  - {kind: timer, name: t, interval_us: 1000, cpu: [1]}
loads:
  - {name: hog, kind: command, command: "nice -n -20 stress-ng --cpu 1 --taskset 1 --cpu-load 10 --quiet"}
monitor: {period: 3s, threshold: 500us, keep_per_minute: 60}
"""

#: recipes whose runs go into one results directory (``runs``), named by the lab
RESULTS = {"dataset"}
#: recipes that are monitors (``loopscope monitor … --for``), not runs
MONITORS = {"monitor": "10s"}

RECIPES: dict[str, dict[str, str]] = {
    "dataset": {
        "tick-1": DATASET.format(name="tick", capture="off"),
        "tick-2": DATASET.format(name="tick", capture="off"),
        "tock": DATASET.format(name="tock", capture="on"),
    },
    "report": {"run": REPORT},
    "compare": {"quiet": COMPARE.format(name="quiet", loads=""), "hogged": COMPARE.format(name="hogged", loads="hog")},
    "monitor": {"watch": MONITOR},
}


def copy(name: str, dest: Path) -> dict[str, Path]:
    """The recorded runs of ``name``, copied under ``dest``: run name → its directory."""
    if name in RESULTS:
        runs = Path(shutil.copytree(RUNS / name / "runs", dest / "runs"))
        from loopscope.kinds import KINDS
        from loopscope.report import build

        for run in sorted(runs.iterdir()):
            build(run, KINDS)  # the tables and page by today's code, from what the run recorded
        return {"runs": runs}
    out = {}
    for run in RECIPES[name]:
        out[run] = Path(shutil.copytree(RUNS / name / run, dest / run))
    return out


def record(name: str) -> None:
    where = RUNS / name
    shutil.rmtree(where, ignore_errors=True)
    where.mkdir(parents=True)
    for run, spec in RECIPES[name].items():
        (where / f"{run}.yaml").write_text(spec)
        if name in MONITORS:
            cmd = ["monitor", f"{run}.yaml", "-o", run, "--for", MONITORS[name]]
        else:
            cmd = ["run", f"{run}.yaml", *(["--results", "runs"] if name in RESULTS else ["--run-dir", run, "--no-report"])]
        r = subprocess.run([str(BIN), *cmd], cwd=where, timeout=600)
        if r.returncode != 0:
            sys.exit(f"recording {name}/{run} failed (exit {r.returncode})")
        (where / f"{run}.yaml").unlink()
    for run in (where / "runs").iterdir() if name in RESULTS else ():
        # what the report derives is made again from the recording by each
        # copy (explain's attribution, made at the run's end, stays)
        for t in (run / "tables").glob("*.parquet"):
            if t.name != "attribution.parquet":
                t.unlink()
        for f in ("report.html", "report.json"):
            (run / f).unlink()
    for run in RECIPES[name] if name in MONITORS else ():
        # the kept windows and the kernel's formats stay out: the dataset reads the record and its lines
        for d in ("windows", "kernel"):
            shutil.rmtree(where / run / d, ignore_errors=True)
        (where / run / "monitor.lock").unlink(missing_ok=True)


def scrub(where: Path) -> None:
    """This checkout's path out of the recording's documents (commands,
    provenance): a recorded run names no path of the machine it was made on."""
    for f in where.rglob("*.json"):
        text = f.read_text()
        if str(ROOT) in text:
            f.write_text(text.replace(str(ROOT), "/src/loopscope"))


if __name__ == "__main__":
    for n in sys.argv[1:] or sorted(RECIPES):
        record(n)
        scrub(RUNS / n)
