"""Did my change help? Runs against a baseline run, metric by metric.

``loopscope compare`` hands this module each run's measures (the same
steady-state samples the run's own phase comparisons use: probe × phase ×
measure, one array per repetition) and its missed deadlines. Every metric
of every other run is divided by the baseline run's, with a 95 % interval:

- where both runs have two or more repetitions the repetitions are the
  unit: each repetition gives one value of the metric, and the interval of
  the ratio is Welch's t interval on the logarithms of those values, so the
  variation between repetitions is inside it (with two repetitions a run
  has one degree of freedom: the intervals are wide, and honest). A run
  of one repetition is cut into up to ``SEGMENTS`` consecutive segments
  (each of ``SEGMENT_SAMPLES`` samples or more) that take the
  repetitions' place: the machine's drift over the run is then inside the
  interval, which a bootstrap of samples within the run would leave out (on
  this machine one-repetition A/A pairs were called different in 21 % of
  rows that way, 7 % with segments; docs/benchmarks.md). Only a run too
  short to cut is resampled within itself (a block bootstrap of
  consecutive samples). The rows say which (``unit``), and ``within_run``
  that a run had one repetition;
- every metric pools a run's repetitions as the run's own report does
  (``analysis.compare.POOLING``): a quantile or the mean is of every
  repetition's samples together, ``max`` is the largest sample of any
  repetition, missed deadlines are added; the ratio is of those values, and
  where the repetitions are the unit its interval is Welch's width (from the
  repetitions' own values) centred on it;
- ``max`` has no interval (a bootstrap of a maximum only reshuffles it) and
  is never significant;
- ``missed`` is a rate (missed deadlines per deadline): the ratio of two
  Poisson rates, its interval the conditional binomial (Clopper-Pearson)
  one, its p-value the binomial test. Missed deadlines come in bursts (one
  stall skips several periods), more variable than Poisson: where the runs
  have repetitions, the counts are divided by the dispersion the
  repetitions show (quasi-Poisson) before the interval is taken.

Each row's p-value (Welch's test on the logarithms, or the bootstrap's
two-sided one within a run) is Holm-corrected across all rows of the comparison; a row is
significant when its corrected p-value is below 0.05 and its interval lies
wholly outside 1 ± ``min_effect`` (2 % unless asked: a practical threshold,
so that a fixed delay measured twice, 1.000× [1.000×, 1.000×], is no change).

A criterion (``p99 > +10%``, ``timer.p99 > +10%``) has three outcomes: it
*fails* when a matching row's interval lies wholly past the bound, *passes*
when every matching row's interval lies wholly on the good side of it, and
is *inconclusive* otherwise (an interval that straddles the bound, a row
without one, no matching row): the data cannot decide, and a gate says so
instead of guessing.
"""

from __future__ import annotations

import math
import re
from dataclasses import dataclass, field
from typing import Any

from typing_extensions import TypedDict

import numpy as np
from loopscope import lazy

from loopscope.analysis.compare import MIN_SAMPLES, POOLING, _stats, _thin, block_resample
from loopscope.errors import InputError
from loopscope.analysis.phases import Measure
from loopscope.stats import MIN_EFFECT, beyond, dispersion, rate_ratio
from loopscope.rundir import Provenance
import polars as pl
import difflib

METRICS = ("p50", "p99", "p999", "max", "mean", "missed")
#: a run of one repetition is cut into up to this many consecutive segments
#: (of ``SEGMENT_SAMPLES`` samples or more: a p99 needs 200), the units its interval is taken over
SEGMENTS = 5
SEGMENT_SAMPLES = 200
RESAMPLES = 400
ALPHA = 0.05


class CompareError(InputError, ValueError):
    """Runs that cannot be compared (probes that do not match, kinds that differ, a bad criterion)."""


#: one comparison row as ``loopscope compare --json`` prints it (NaN and inf as null)
class RowJson(TypedDict):
    """One row of ``compare --json``: a run's metric against the baseline run's."""

    run: str
    probe: str
    phase: str
    measure: str
    metric: str
    baseline: float | None
    value: float | None
    ratio: float | None
    ci95: list[float] | None
    significant: bool
    p_holm: float | None
    within_run: bool
    unit: str
    pooled: str


class CriterionResult(TypedDict):
    """A ``--fail-if`` criterion: its outcome (``pass``, ``fail``,
    ``inconclusive``), whether it tripped (failed), the rows that failed it
    and the rows that could not decide it (each with why), per probe."""

    expr: str
    outcome: str
    tripped: bool
    rows: list[str]
    undecided: list[str]
    probes: dict[str, str]


class Differences(TypedDict):
    """What differs between runs: platform facts per host (value per run) and the experiment file."""

    facts: dict[str, dict[str, object]]
    spec_diff: dict[str, str]


class RunRef(TypedDict):
    """One compared run, as ``compare --json`` names it."""

    label: str
    path: str
    reps: int
    baseline: bool


class CompareJson(TypedDict):
    """What ``loopscope compare --json`` prints."""

    runs: list[RunRef]
    min_effect: float
    rows: list[RowJson]
    criteria: list[CriterionResult]
    outcome: str | None
    differences: Differences


@dataclass
class RunData:
    """What compare needs of one run."""

    label: str
    path: str
    reps: int
    measures: list[Measure]
    #: (probe, phase) → (missed deadlines, deadlines) of each repetition
    missed: dict[tuple[str, str], list[tuple[int, int]]] = field(default_factory=dict)
    provenance: Provenance = field(default_factory=Provenance)
    spec_text: str = ""

    def kinds(self) -> dict[str, str]:
        return {m.probe: m.kind for m in self.measures}


@dataclass
class Row:
    run: str
    probe: str
    phase: str
    measure: str
    metric: str
    baseline: float | None
    value: float | None
    ratio: float | None
    ci95: list[float] | None
    p_value: float | None
    significant: bool = False
    within_run: bool = False
    #: what the interval was taken over: the repetitions, a lone repetition's segments, or blocks of samples
    unit: str = "repetitions"

    @property
    def pooled(self) -> str:
        """How the metric pools a run's repetitions."""
        return POOLING.get(self.metric, "every repetition's samples together")

    def line(self) -> str:
        """The row in one line, for criteria and messages."""
        ci = f" [{self.ci95[0]:.3f}, {self.ci95[1]:.3f}]" if self.ci95 else " (no interval)"
        ratio = "n/a" if self.ratio is None else f"{self.ratio:.3f}"
        return f"{self.run} {self.probe} {self.phase} {self.measure} {self.metric} {ratio}{ci}"

    def to_json(self) -> RowJson:
        def num(v: float | None) -> float | None:
            return None if v is None or not math.isfinite(v) else v

        return {
            "run": self.run,
            "probe": self.probe,
            "phase": self.phase,
            "measure": self.measure,
            "metric": self.metric,
            "baseline": num(self.baseline),
            "value": num(self.value),
            "ratio": num(self.ratio),
            "ci95": self.ci95,
            "significant": self.significant,
            "p_holm": num(self.p_value),
            "within_run": self.within_run,
            "unit": self.unit,
            "pooled": self.pooled,
        }


def _units(series: list[np.ndarray]) -> list[np.ndarray]:
    """The units an interval is taken over: the repetitions, or, for a run of
    one, up to ``SEGMENTS`` consecutive segments of it (one unit when it is too short)."""
    kept = [s for s in series if len(s)]
    if len(kept) != 1:
        return kept
    k = min(SEGMENTS, len(kept[0]) // SEGMENT_SAMPLES)
    return [c for c in np.array_split(kept[0], k)] if k >= 2 else kept


def _series(m: Measure, phase: str) -> list[np.ndarray]:

    f = m.frame.filter(pl.col("phase") == phase)
    return [g["value"].to_numpy().astype(np.float64) for _, g in f.group_by("rep", maintain_order=True)]


def _boot(
    series: list[np.ndarray], metrics: list[str], block: int, by_rep: bool, rng: np.random.Generator
) -> tuple[dict[str, float], dict[str, np.ndarray], int]:
    """Point values and bootstrap replicates of ``metrics``."""
    full = [s for s in series if len(s)]
    parts = [_thin(s, 40_000, len(series)) for s in full]
    if not parts:
        return {m: math.nan for m in metrics}, {}, 0
    allv = np.concatenate(parts)
    every = np.concatenate(full)  # the point values are of every sample (POOLING); only the resampling thins
    point = {m: float(v[0]) for m, v in _stats(every[None, :], [m for m in metrics if m != "max"]).items()}
    if "max" in metrics:
        point["max"] = float(every.max())
    qm = [m for m in metrics if m != "max"]
    if by_rep:
        return point, _per_rep(series, qm), len(allv)
    return point, _stats(block_resample(parts, RESAMPLES, block, rng), qm), len(allv)


def _per_rep(series: list[np.ndarray], metrics: list[str]) -> dict[str, np.ndarray]:
    """Each repetition's value of each metric (repetitions with too few samples for it left out)."""
    out: dict[str, list[float]] = {m: [] for m in metrics}
    for s in series:
        if not len(s):
            continue
        st = _stats(np.asarray(s, dtype=np.float64)[None, :], metrics)
        for m in metrics:
            if len(s) >= MIN_SAMPLES.get(m, 20):
                out[m].append(float(st[m][0]))
    return {m: np.array(v) for m, v in out.items()}


def welch_log_ratio(a: np.ndarray, b: np.ndarray) -> tuple[list[float], float] | None:
    """95 % interval of the ratio of b's to a's geometric mean and the two-sided
    p-value, from Welch's t test on the logarithms (None: too few values)."""
    sp = lazy.special()
    a, b = a[a > 0], b[b > 0]
    if len(a) < 2 or len(b) < 2:
        return None
    la, lb = np.log(a), np.log(b)
    va, vb = la.var(ddof=1) / len(la), lb.var(ddof=1) / len(lb)
    d = float(lb.mean() - la.mean())
    se = math.sqrt(va + vb)
    if se == 0:
        return ([math.exp(d), math.exp(d)], 1.0 if d == 0 else 0.0)
    df = (va + vb) ** 2 / ((va**2 / (len(la) - 1)) + (vb**2 / (len(lb) - 1))) if va + vb > 0 else 1.0
    # Student's t: its quantile and survival function
    t = float(sp.stdtrit(df, 0.975))
    p = float(2 * sp.stdtr(df, -abs(d) / se))
    return [math.exp(d - t * se), math.exp(d + t * se)], p


def _ratio_row(run: str, probe: str, phase: str, measure: str, metric: str, b: tuple[Any, ...], o: tuple[Any, ...], within: bool) -> Row:
    (bp, bb, bn), (op, ob, on) = b, o
    bv, ov = bp.get(metric, math.nan), op.get(metric, math.nan)
    ratio = ov / bv if bv and math.isfinite(bv) and math.isfinite(ov) else None
    row = Row(run, probe, phase, measure, metric, bv, ov, ratio, None, None, within_run=within)
    if metric == "max" or ratio is None or min(bn, on) < MIN_SAMPLES.get(metric, 20) or metric not in bb or metric not in ob:
        return row
    if not within:  # the repetitions' values: Welch's width, centred on the pooled ratio the row shows
        got = welch_log_ratio(bb[metric], ob[metric])
        if got is not None:
            (lo, hi), row.p_value = got
            half = math.sqrt(hi / lo) if lo > 0 else math.inf
            row.ci95 = [ratio / half, ratio * half]
        return row
    with np.errstate(divide="ignore", invalid="ignore"):
        r = ob[metric] / bb[metric]
    r = r[np.isfinite(r)]
    if len(r) < 20:
        return row
    row.ci95 = [float(np.percentile(r, 2.5)), float(np.percentile(r, 97.5))]
    row.p_value = float(min(1.0, 2 * max(min(np.mean(r <= 1), np.mean(r >= 1)), 1 / len(r))))
    return row


def holm(rows: list[Row], min_effect: float = MIN_EFFECT) -> None:
    """Replace each row's p-value by its Holm-corrected one and mark the
    significant rows (corrected p below 0.05, the interval outside 1 ± ``min_effect``)."""
    tested = sorted((r for r in rows if r.p_value is not None), key=lambda r: r.p_value)  # type: ignore[arg-type,return-value]
    m, running = len(tested), 0.0
    for i, r in enumerate(tested):
        running = max(running, min(1.0, (m - i) * float(r.p_value)))  # type: ignore[arg-type]
        r.p_value = running
        r.significant = bool(running < ALPHA and r.ci95 is not None and beyond(r.ratio, r.ci95[0], r.ci95[1], min_effect))


def check_match(runs: list[RunData]) -> None:
    """Runs compare only when their probes are the same, by name and kind."""
    base = runs[0].kinds()
    for r in runs[1:]:
        k = r.kinds()
        if set(k) != set(base):
            only_b, only_r = sorted(set(base) - set(k)), sorted(set(k) - set(base))
            raise CompareError(
                f"{r.path}: its probes do not match {runs[0].path}'s"
                + (f" (only in {runs[0].label}: {', '.join(only_b)})" if only_b else "")
                + (f" (only in {r.label}: {', '.join(only_r)})" if only_r else "")
                + "; compare runs of the same experiment, or of experiments whose probes share names"
            )
        for p, kind in k.items():
            if base[p] != kind:
                raise CompareError(f"{r.path}: probe {p} is a {kind} probe there and a {base[p]} probe in {runs[0].path}; they measure different things")


def compare(runs: list[RunData], min_effect: float = MIN_EFFECT) -> list[Row]:
    """Every other run against ``runs[0]``, row by row; significant past 1 ± ``min_effect``."""
    check_match(runs)
    base = runs[0]
    rows: list[Row] = []
    rng = np.random.default_rng(20261124)
    cache: dict[tuple[Any, ...], tuple[Any, ...]] = {}

    def units(i: int, m: Measure, phase: str) -> list[np.ndarray]:
        key = ("units", i, m.probe, m.name, phase)
        if key not in cache:
            cache[key] = tuple(_units(_series(m, phase)))
        return list(cache[key])

    def stats(i: int, m: Measure, phase: str, by_unit: bool) -> tuple[Any, ...]:
        key: tuple[Any, ...] = (i, m.probe, m.name, phase) + (("unit",) if by_unit else ())
        if key not in cache:
            metrics = [x for x in METRICS if x != "missed"] if "p99" in m.metrics else list(m.metrics)
            cache[key] = _boot(units(i, m, phase) if by_unit else _series(m, phase), metrics, m.block, by_unit, rng)
        return cache[key]

    for j, run in enumerate(runs[1:], start=1):
        by_rep = base.reps > 1 and run.reps > 1
        theirs = {(m.probe, m.name): m for m in run.measures}
        for m in base.measures:
            other = theirs.get((m.probe, m.name))
            if other is None:
                continue
            phases_b = list(dict.fromkeys(m.frame["phase"].to_list()))
            phases_o = set(other.frame["phase"].to_list())
            for ph in [p for p in phases_b if p in phases_o]:
                by_unit = len(units(0, m, ph)) >= 2 and len(units(j, other, ph)) >= 2
                b, o = stats(0, m, ph, by_unit), stats(j, other, ph, by_unit)
                metrics = [x for x in METRICS if x != "missed"] if "p99" in m.metrics else list(m.metrics)
                unit = "repetitions" if by_rep else ("segments of a run of one repetition" if by_unit else "blocks of samples within the run")
                for metric in metrics:
                    rows.append(_ratio_row(run.label, m.probe, ph, m.name, metric, b, o, not by_unit))
                    rows[-1].within_run, rows[-1].unit = not by_rep, unit
        for (probe, ph), reps_b in run.missed.items():
            if (probe, ph) not in base.missed:
                continue
            reps_a = base.missed[(probe, ph)]
            k_a, n_a = sum(x for x, _ in reps_a), sum(y for _, y in reps_a)
            k_b, n_b = sum(x for x, _ in reps_b), sum(y for _, y in reps_b)
            phi = max(dispersion(reps_a), dispersion(reps_b))
            point, ci, p = rate_ratio(k_a, n_a, k_b, n_b, phi)
            rows.append(
                Row(run.label, probe, ph, "deadlines", "missed", k_a / n_a if n_a else None, k_b / n_b if n_b else None, point, ci, p, within_run=not by_rep)
            )
    holm(rows, min_effect)
    return rows


CRITERION = re.compile(
    r"^\s*(?:(?P<probe>[A-Za-z0-9][A-Za-z0-9._-]*)\.)?(?P<metric>p50|p99|p999|max|mean|missed)\s*(?P<op>[<>])\s*(?P<pct>[+-]?[0-9]+(?:\.[0-9]+)?)\s*%\s*$"
)


@dataclass
class Criterion:
    expr: str
    probe: str | None
    metric: str
    op: str
    bound: float  # a ratio: +10% → 1.10

    @classmethod
    def parse(cls, text: str, probes: set[str]) -> Criterion:
        m = CRITERION.match(text)
        if m is None:
            raise CompareError(
                f"--fail-if {text!r}: write METRIC > +N% or METRIC < -N% (METRIC: p50, p99, p999, max, mean, missed; optionally PROBE.METRIC), e.g. 'p99 > +10%'"
            )
        if m["probe"] and m["probe"] not in probes:
            raise CompareError(f"--fail-if {text!r}: no probe named {m['probe']!r}; the probes are {', '.join(sorted(probes))}")
        return cls(text, m["probe"], m["metric"], m["op"], 1 + float(m["pct"]) / 100)

    def matches(self, r: Row) -> bool:
        return r.metric == self.metric and (self.probe is None or r.probe == self.probe)

    def verdict(self, r: Row) -> str:
        """One row against the bound: ``fail`` (its interval wholly past
        it), ``pass`` (wholly on the good side) or ``inconclusive``."""
        if r.ci95 is None or r.ratio is None:
            return "inconclusive"
        lo, hi = r.ci95
        if self.op == ">":
            return "fail" if lo > self.bound else ("pass" if hi <= self.bound else "inconclusive")
        return "fail" if hi < self.bound else ("pass" if lo >= self.bound else "inconclusive")

    def tripped_by(self, rows: list[Row]) -> list[Row]:
        """The rows whose interval lies wholly past the bound (a row without one never trips)."""
        return [r for r in rows if self.matches(r) and self.verdict(r) == "fail"]

    def judge(self, rows: list[Row]) -> CriterionResult:
        """The criterion over every matching row, and per probe: ``fail`` when
        any row fails, else ``inconclusive`` when any cannot decide (or none
        matches), else ``pass``."""
        mine = [(r, self.verdict(r)) for r in rows if self.matches(r)]
        per: dict[str, list[str]] = {}
        for r, v in mine:
            per.setdefault(r.probe, []).append(v)
        probes = {p: _outcome(v) for p, v in per.items()}
        undecided = [r.line() + (": no interval" if r.ci95 is None else ": the interval straddles the bound") for r, v in mine if v == "inconclusive"]
        failed = [r.line() for r, v in mine if v == "fail"]
        outcome = _outcome([v for _, v in mine])
        if not mine:
            undecided = [f"no row has {self.metric}" + (f" for probe {self.probe}" if self.probe else "")]
        return {"expr": self.expr, "outcome": outcome, "tripped": outcome == "fail", "rows": failed, "undecided": undecided, "probes": probes}


def gate_outcome(criteria: list[CriterionResult]) -> str | None:
    """The gate's outcome over every criterion (None: there is none)."""
    return _outcome([c["outcome"] for c in criteria]) if criteria else None


def _outcome(verdicts: list[str]) -> str:
    if "fail" in verdicts:
        return "fail"
    if "inconclusive" in verdicts or not verdicts:
        return "inconclusive"
    return "pass"


PROVENANCE = (
    ("kernel", ("kernel", "release")),
    ("kernel command line", ("kernel", "cmdline")),
    ("preemption", ("preempt",)),
    ("CPU model", ("cpu", "model")),
    ("CPUs", ("cpu", "cpus")),
    ("isolated CPUs", ("cpu", "isolated")),
    ("governors", ("cpufreq", "governors")),
    ("idle driver", ("cpuidle_driver",)),
    ("clock source", ("clocksource",)),
    ("loopscope", ("software", "loopscope")),
    ("loopscope commit", ("loopscope_git", "sha")),
)


def differences(runs: list[RunData]) -> Differences:
    """What differs between the runs: each host's platform facts that differ,
    the tunings each run applied, and the experiment file as a diff."""

    facts: dict[str, dict[str, object]] = {}
    for r in runs:
        for host, machine in r.provenance.hosts.items():
            prov = machine.model_dump(mode="json")  # the machine's facts, free-form as its agent gathered them
            for label, path in PROVENANCE:
                v: Any = prov
                for k in path:
                    v = v.get(k) if isinstance(v, dict) else None
                facts.setdefault(f"{host}: {label}", {})[r.label] = v
    differ = {k: v for k, v in facts.items() if len({repr(x) for x in v.values()}) > 1 or len(v) < len(runs)}
    diffs = {}
    for r in runs[1:]:
        d = list(difflib.unified_diff(runs[0].spec_text.splitlines(), r.spec_text.splitlines(), runs[0].label, r.label, lineterm=""))
        if d:
            diffs[r.label] = "\n".join(d)
    return {"facts": differ, "spec_diff": diffs}
