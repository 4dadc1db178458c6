"""A metric of one probe over many runs: ``loopscope trend``.

One point per run (and per host, for a probe measured on several), in the
order the runs started: the run's figure from the dataset's ``summary``
(pooled over its repetitions as its report pools them) with its 95 %
interval. ``by`` splits the points into series by host or by kernel. Within
a series, a run whose whole interval lies above (below) the previous run's
interval, by more than the minimum effect, is marked ``▲`` (``▼``): a step
worth a look, told apart from runs that only move inside each other's
intervals. The same points go to a page in the report's style (``report/trend.py``).

A monitor's probe trends over its periods: one point per host × period
(``periods``: p50, p99, p99.9 or the maximum of the period), in time order
with the runs' points, without an interval (a period is one sample of the
fleet's day, not a pooled estimate).
"""

from __future__ import annotations

import datetime as _dt
from dataclasses import dataclass, field
from typing import Any

from typing_extensions import TypedDict

from loopscope.dataset.query import Query, _lit
from loopscope.errors import InputError
from loopscope.stats import MIN_EFFECT


@dataclass
class Point:
    run_id: str
    started_utc: _dt.datetime | None
    series: str
    host: str
    kernel: str | None
    phase: str
    value_ns: float
    lo_ns: float | None
    hi_ns: float | None
    reps: int | None
    change: str = ""

    def to_json(self) -> PointJson:
        return {
            "run_id": self.run_id,
            "started_utc": self.started_utc.isoformat() if self.started_utc else None,
            "series": self.series,
            "host": self.host,
            "kernel": self.kernel,
            "phase": self.phase,
            "value_ns": self.value_ns,
            "lo_ns": self.lo_ns,
            "hi_ns": self.hi_ns,
            "reps": self.reps,
            "change": self.change,
        }


class PointJson(TypedDict):
    """One point of ``trend --json``: a run's figure, with its interval and the change it marks."""

    run_id: str
    started_utc: str | None
    series: str
    host: str
    kernel: str | None
    phase: str
    value_ns: float
    lo_ns: float | None
    hi_ns: float | None
    reps: int | None
    change: str


class TrendJson(TypedDict):
    """What ``loopscope trend --json`` prints."""

    probe: str
    measure: str
    metric: str
    by: str | None
    phase: str | None
    min_effect: float
    points: list[PointJson]
    missing: list[str]
    notes: list[str]


@dataclass
class Trend:
    probe: str
    measure: str
    metric: str
    by: str | None
    phase: str | None
    min_effect: float
    points: list[Point] = field(default_factory=list)
    #: runs of the dataset without this probe's figure, with why
    missing: list[str] = field(default_factory=list)
    #: what a reader of the points should know (how monitors' periods were thinned)
    notes: list[str] = field(default_factory=list)

    @property
    def series(self) -> dict[str, list[Point]]:
        out: dict[str, list[Point]] = {}
        for p in self.points:
            out.setdefault(p.series, []).append(p)
        return out


#: a period's figures, by the metric's name
PERIOD_METRICS = {"p50": "p50_ns", "p99": "p99_ns", "p999": "p999_ns", "max": "max_ns"}
#: most points a monitored host's series holds (longer ones take the largest of each span of periods)
MAX_POINTS = 1000


def _monitored(q: Query, probe: str) -> bool:
    return any(m.readable and probe in m.probes for m in q.ds.monitors)


def _measure(q: Query, probe: str, measure: str | None, main: dict[str, str]) -> str:
    rows = q.run(f"SELECT measure, count(*) FROM summary WHERE probe = {_lit(probe)} GROUP BY measure ORDER BY count(*) DESC, measure").rows
    if not rows and _monitored(q, probe):
        # a monitor's periods hold its probe's main measure
        monitored_kind = next(k for m in q.ds.monitors if probe in m.probes for k, _ in [m.probes[probe]])
        return measure or main.get(str(monitored_kind), "latency")
    if not rows:
        probes = [r[0] for r in q.run("SELECT DISTINCT probe FROM summary ORDER BY probe").rows]
        raise InputError(f"trend: no run of the dataset has a probe named {probe!r}; its probes are: {', '.join(probes) or 'none (no run has comparisons)'}")
    names = [str(r[0]) for r in rows]
    if measure is not None:
        if measure not in names:
            raise InputError(f"trend: probe {probe} has no measure {measure!r}; its measures are: {', '.join(names)}")
        return measure
    if len(names) == 1:
        return names[0]
    kind = q.run(f"SELECT DISTINCT kind FROM probes WHERE probe = {_lit(probe)}").rows
    first = main.get(str(kind[0][0])) if kind else None
    if first in names:
        return str(first)
    raise InputError(f"trend: probe {probe} has several measures ({', '.join(names)}); choose one with --measure")


def trend(
    q: Query,
    probe: str,
    metric: str,
    by: str | None = None,
    measure: str | None = None,
    phase: str | None = None,
    main: dict[str, str] | None = None,
    min_effect: float = MIN_EFFECT,
) -> Trend:
    """The metric of ``probe`` over the dataset's runs (``main``: each kind's
    main measure, taken when a probe has several and none is named)."""
    m = _measure(q, probe, measure, main or {})
    where = f"probe = {_lit(probe)} AND measure = {_lit(m)} AND metric = {_lit(metric)} AND " + (
        f"phase = {_lit(phase)}" if phase else "phase = baseline_phase"
    )
    rows = q.run(
        f"SELECT run_id, started_utc, host, kernel, phase, value_ns, lo_ns, hi_ns, reps FROM summary WHERE {where} "
        "ORDER BY started_utc NULLS LAST, run_id, host"
    ).rows
    t = Trend(probe, m, metric, by, phase, min_effect)
    for run_id, started, host, kernel, ph, v, lo, hi, reps in rows:
        if v is None:
            continue
        key = {"host": host, "kernel": kernel or "kernel unknown"}.get(by or "", "every run")
        t.points.append(Point(run_id, started, str(key), host, kernel, ph, float(v), _num(lo), _num(hi), reps))
    _periods(q, t, probe, metric, by)
    have = {p.run_id for p in t.points}
    for r in q.ds.runs:
        if r.run_id in have:
            continue
        if not r.readable:
            t.missing.append(f"{r.run_id}: {r.why}")
        elif probe not in r.probes:
            continue  # another experiment: not this probe's run
        else:
            t.missing.append(f"{r.run_id}: " + (r.why or (f"no {metric} of {m} in phase {phase}" if phase else f"no {metric} of {m}")))
    _mark(t)
    return t


def _periods(q: Query, t: Trend, probe: str, metric: str, by: str | None) -> None:
    """The monitors' periods of ``probe`` as points, merged with the runs' in
    time order: one per host and period, or, when a host's periods are more
    than ``MAX_POINTS``, one per host and span of periods holding the span's
    largest figure (a week of minutes is 10,080 periods a host; the spikes stay)."""
    col = PERIOD_METRICS.get(metric)
    if col is None or t.phase or not _monitored(q, probe):
        return
    lit = _lit(probe)
    most, first, last = q.run(
        f"SELECT max(n), min(s), max(s) FROM (SELECT count(*) AS n, min(start_utc) AS s FROM periods WHERE probe = {lit} GROUP BY run_id, host)"
    ).rows[0]
    span = max(1, -(-int(most or 0) // MAX_POINTS))
    rows = q.run(
        f"SELECT run_id, min(start_utc) AS s, host, kernel, min(period), max(period), max({col}) FROM periods WHERE probe = {lit} AND {col} IS NOT NULL "
        f"GROUP BY run_id, host, kernel, (period - 1) // {span} ORDER BY s, run_id, host"
    ).rows
    for run_id, start, host, kernel, a, b, v in rows:
        key = {"host": host, "kernel": kernel or "kernel unknown"}.get(by or "", "every run")
        t.points.append(Point(run_id, start, str(key), host, kernel, f"period {a}" if a == b else f"periods {a}-{b}", float(v), None, None, None))
    if span > 1:
        t.notes.append(f"each point holds the largest {metric} of {span} periods (a series has at most {MAX_POINTS:,} points)")
    far = _dt.datetime.max.replace(tzinfo=_dt.timezone.utc)
    t.points.sort(key=lambda p: p.started_utc or far)


def _num(x: Any) -> float | None:
    try:
        v = float(x)
    except (TypeError, ValueError):
        return None
    return v if v == v else None


def _mark(t: Trend) -> None:
    """▲/▼: a run whose interval lies wholly above/below the previous run's of its series, by more than the minimum effect."""
    up, down = 1 + t.min_effect, 1 - t.min_effect
    for pts in t.series.values():
        for prev, p in zip(pts, pts[1:]):
            if None in (p.lo_ns, p.hi_ns, prev.lo_ns, prev.hi_ns) or prev.value_ns <= 0:
                continue
            r = p.value_ns / prev.value_ns
            if p.lo_ns > prev.hi_ns and r > up:  # type: ignore[operator]
                p.change = "▲"
            elif p.hi_ns < prev.lo_ns and r < down:  # type: ignore[operator]
                p.change = "▼"
