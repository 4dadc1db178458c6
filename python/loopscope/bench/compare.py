"""``loopscope bench compare``: does ``loopscope compare`` call a change
only when there is one, and does its gate fail only then?

Each of ``pairs`` rounds records three runs of one experiment (a timer
probe pinned to CPU 0, an idle and a CPU-loaded phase, 3 repetitions):
A, A' (the same again) and B (stress-ng at nice −20 pinned to the probe's
CPU in every phase).

- **A/A** (A against A'): the rows marked significant (Holm-corrected,
  outside 1 ± 2 %: with nothing changed, at most 5 % of them), and the gate
  ``--fail-if 'p99 > +10%'``: it must fail in **no** pair (pass or
  inconclusive are both right answers to noise). This is the case the
  method is weakest in: a machine that drifts between runs (another
  tenant, a frequency change) is a real difference the intervals cannot
  tell from the change under test.
- **A/B** (A against B): the same gate must **fail** in every pair, and the
  timer's p99 be marked significant.
- **The weak case, one repetition**: the same pairs with only each run's
  first repetition, so compare can only resample within a run (a block
  bootstrap): its interval holds none of the drift between runs. The gate's
  outcomes there say how far a one-repetition gate can be trusted.
"""

from __future__ import annotations

import shutil
import subprocess
import sys
from pathlib import Path
from typing import Any, Callable

from typing_extensions import TypedDict

from loopscope.analysis.registry import Registry
from loopscope.errors import RunError
import dataclasses
import polars as pl
from loopscope.analysis.runcompare import Criterion, compare
from loopscope.report.compare import load
from loopscope.host import scratch

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
    r = subprocess.run(
        [sys.executable, "-m", "loopscope.cli", "run", str(spec), "--run-dir", str(work / name), "--no-report"], capture_output=True, text=True, timeout=900
    )
    if r.returncode != 0:
        raise RunError(f"bench compare: run {name} failed: {r.stderr.strip()[-400:]}")
    return work / name


GATE = "p99 > +10%"


class AaPair(TypedDict):
    """One A/A pair: its comparison rows, which came out significant, and the gate's outcome."""

    rows: int
    significant: int
    which: list[str]
    gate: str


class P99Row(TypedDict):
    ratio: float
    ci95: list[float] | None
    significant: bool


class AbPair(TypedDict):
    """Quiet against hogged: each phase's p99 ratio, and the gate's outcome."""

    p99: dict[str, P99Row]
    gate: str


class CompareBench(TypedDict):
    """What ``loopscope bench compare --json`` prints: the A/A pairs' false
    positives and gate outcomes, the A/B pairs' p99 rows and gate outcomes."""

    pairs: int
    gate: str
    aa: list[AaPair]
    aa_rows: int
    aa_significant: int
    aa_share: float | None
    aa_gate: dict[str, int]
    ab: list[AbPair]
    ab_gate: dict[str, int]
    #: the same pairs with each run's first repetition only (within-run intervals)
    one_rep_aa_gate: dict[str, int]
    one_rep_ab_gate: dict[str, int]
    one_rep_aa_significant: int
    one_rep_aa_rows: int


def first_rep(d: Any) -> Any:
    """A run's data with its first repetition only."""

    ms = [dataclasses.replace(m, frame=m.frame.filter(pl.col("rep") == pl.col("rep").min())) for m in d.measures]
    missed = {k: v[:1] for k, v in d.missed.items()}
    return dataclasses.replace(d, reps=1, measures=ms, missed=missed)


def bench(kinds: Registry, pairs: int = 20, duration: str = "1s", say: Callable[[str], None] | None = None) -> CompareBench:
    if shutil.which("stress-ng") is None:
        raise RunError("bench compare needs stress-ng for its A/B case (scripts/install-deps.sh installs it)")
    aa: list[AaPair] = []
    ab: list[AbPair] = []
    one: dict[str, list[str]] = {"aa": [], "ab": []}
    one_sig = one_rows = 0
    crit = Criterion.parse(GATE, {"timer"})
    with scratch.directory("bench-compare") as tmp:
        work = Path(tmp)
        for i in range(pairs):
            a, a2, b = _run(work, f"a{i}", False, duration), _run(work, f"aa{i}", False, duration), _run(work, f"b{i}", True, duration)
            base, same, hog = load(a, kinds), load(a2, kinds), load(b, kinds)
            rows = compare([base, same])
            sig = [f"{r.probe} {r.phase} {r.metric} {r.ratio:.2f}" for r in rows if r.significant]
            aa.append({"rows": len(rows), "significant": len(sig), "which": sig, "gate": crit.judge(rows)["outcome"]})
            rows1 = compare([first_rep(base), first_rep(same)])
            one["aa"].append(crit.judge(rows1)["outcome"])
            one_sig += sum(r.significant for r in rows1)
            one_rows += len(rows1)
            one["ab"].append(crit.judge(compare([first_rep(base), first_rep(hog)]))["outcome"])
            rows = compare([base, hog])
            p99 = {r.phase: r for r in rows if r.metric == "p99"}
            ab.append(
                {
                    "p99": {
                        ph: {"ratio": round(r.ratio or 0, 2), "ci95": [round(x, 2) for x in r.ci95] if r.ci95 else None, "significant": r.significant}
                        for ph, r in p99.items()
                    },
                    "gate": crit.judge(rows)["outcome"],
                }
            )
            if say:
                say(
                    f"  pair {i + 1}: A/A {len(sig)} of {aa[-1]['rows']} rows significant {sig}, gate {aa[-1]['gate']}; "
                    f"A/B gate {ab[-1]['gate']}, p99 "
                    + ", ".join(f"{ph} {x['ratio']}x {x['ci95']}" for ph, x in ab[-1]["p99"].items())
                    + f"; one repetition: A/A gate {one['aa'][-1]}, A/B gate {one['ab'][-1]}"
                )
            for d in (a, a2, b):
                shutil.rmtree(d)
    total = sum(x["rows"] for x in aa)
    n_sig = sum(x["significant"] for x in aa)

    def count(xs: list[str]) -> dict[str, int]:
        return {k: xs.count(k) for k in ("pass", "fail", "inconclusive")}

    return {
        "pairs": pairs,
        "gate": GATE,
        "aa": aa,
        "aa_rows": total,
        "aa_significant": n_sig,
        "aa_share": round(n_sig / total, 4) if total else None,
        "aa_gate": count([x["gate"] for x in aa]),
        "ab": ab,
        "ab_gate": count([x["gate"] for x in ab]),
        "one_rep_aa_gate": count(one["aa"]),
        "one_rep_ab_gate": count(one["ab"]),
        "one_rep_aa_significant": one_sig,
        "one_rep_aa_rows": one_rows,
    }
