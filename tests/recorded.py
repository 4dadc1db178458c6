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

RECIPES: dict[str, dict[str, str]] = {
    "compare": {"quiet": COMPARE.format(name="quiet", loads=""), "hogged": COMPARE.format(name="hogged", loads="hog")},
}


def copy(name: str, dest: Path) -> dict[str, Path]:
    """The recorded runs of ``name``, copied under ``dest``: run name → its directory."""
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
        r = subprocess.run([str(BIN), "run", f"{run}.yaml", "--run-dir", run, "--no-report"], cwd=where, timeout=600)
        if r.returncode != 0:
            sys.exit(f"recording {name}/{run} failed (exit {r.returncode})")
        (where / f"{run}.yaml").unlink()


if __name__ == "__main__":
    for n in sys.argv[1:] or sorted(RECIPES):
        record(n)
