"""``loopscope bench compare``: does ``loopscope compare`` call a change
only when there is one?

- **A/A**: the same experiment (a timer probe pinned to CPU 0, an idle and a
  CPU-loaded phase, 3 repetitions) run twice, ``pairs`` times on this
  machine; each pair compared. The figure is the share of rows marked
  significant (Holm-corrected): with nothing changed it should be at most
  5 %. This is the case the method is weakest in: a machine that drifts
  between runs (another tenant, a frequency change) is a real difference
  the intervals cannot tell from the change under test.
- **A/B**: the same experiment with stress-ng pinned to the probe's CPU in
  every phase: the timer's p99 must be marked significant and
  ``--fail-if 'p99 > +20%'`` must trip.
"""

from __future__ import annotations

import shutil
import subprocess
import sys
import tempfile
from pathlib import Path
from typing import Any, Callable

from typing_extensions import TypedDict

from loopscope.errors import RunError

SPEC = """name: {name}
probes:
  - {{kind: timer, interval_us: 1000, cpu: [0]}}
loads:
  - {{name: cpu, kind: cpu, level: 1}}
  - {{name: hog, kind: command, command: "nice -n -20 stress-ng --cpu 1 --taskset 0 --quiet"}}
phases:
  - {{name: idle, loads: [{idle}]}}
  - {{name: loaded, loads: [{loaded}]}}
duration: {duration}
repetitions: 3
kernel: {{capture: off}}
"""


def _run(work: Path, name: str, hog: bool, duration: str) -> Path:
    spec = work / f"{name}.yaml"
    spec.write_text(SPEC.format(name=name, idle="hog" if hog else "", loaded="cpu, hog" if hog else "cpu", duration=duration))
    r = subprocess.run([sys.executable, "-m", "loopscope.cli", "run", str(spec), "--run-dir", str(work / name), "--no-report"], capture_output=True, text=True, timeout=900)
    if r.returncode != 0:
        raise RunError(f"bench compare: run {name} failed: {r.stderr.strip()[-400:]}")
    return work / name


class AaPair(TypedDict):
    """One A/A pair: its comparison rows, and which came out significant."""

    rows: int
    significant: int
    which: list[str]


class P99Row(TypedDict):
    ratio: float
    ci95: list[float] | None
    significant: bool


class AbCase(TypedDict):
    """Quiet against hogged: each phase's p99 ratio, and whether the gate trips."""

    p99: dict[str, P99Row]
    gate_tripped: bool


class CompareBench(TypedDict):
    """What ``loopscope bench compare --json`` prints: the A/A pairs' false
    positives and the A/B case's p99 rows and gate."""

    pairs: int
    aa: list[AaPair]
    aa_rows: int
    aa_significant: int
    aa_share: float | None
    ab: AbCase


def bench(kinds: Any, pairs: int = 5, duration: str = "1s", say: Callable[[str], None] | None = None) -> CompareBench:
    from loopscope.analysis.runcompare import Criterion, compare
    from loopscope.report.compare import load

    if shutil.which("stress-ng") is None:
        raise RunError("bench compare needs stress-ng for its A/B case (scripts/install-deps.sh installs it)")
    aa: list[AaPair] = []
    with tempfile.TemporaryDirectory(prefix="ls-bench-compare-") as tmp:
        work = Path(tmp)
        for i in range(pairs):
            a, b = _run(work, f"a{i}", False, duration), _run(work, f"b{i}", False, duration)
            rows = compare([load(a, kinds), load(b, kinds)])
            sig = [f"{r.probe} {r.phase} {r.metric} {r.ratio:.2f}" for r in rows if r.significant]
            aa.append({"rows": len(rows), "significant": len(sig), "which": sig})
            if say:
                say(f"  A/A pair {i + 1}: {len(sig)} of {len(rows)} rows significant {sig}")
            shutil.rmtree(a)
            shutil.rmtree(b)
        a, b = _run(work, "quiet", False, duration), _run(work, "hog", True, duration)
        rows = compare([load(a, kinds), load(b, kinds)])
        crit = Criterion.parse("p99 > +20%", {"timer"})
        p99 = {r.phase: r for r in rows if r.metric == "p99"}
        ab: AbCase = {
            "p99": {ph: {"ratio": round(r.ratio or 0, 2), "ci95": [round(x, 2) for x in r.ci95] if r.ci95 else None, "significant": r.significant} for ph, r in p99.items()},
            "gate_tripped": bool(crit.tripped_by(rows)),
        }
        if say:
            say(f"  A/B: {ab}")
    total = sum(x["rows"] for x in aa)
    n_sig = sum(x["significant"] for x in aa)
    return {"pairs": pairs, "aa": aa, "aa_rows": total, "aa_significant": n_sig, "aa_share": round(n_sig / total, 4) if total else None, "ab": ab}
