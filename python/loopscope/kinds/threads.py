"""The ``threads`` kind: any program's threads, measured from the run's kernel capture.

Nothing is instrumented. Each step's process (``probes/threads.py``) starts
the command or attaches to threads already running, and says which threads
it saw and when it measured; the lab's kernel capture of that host recorded
them. After the run every activation of those threads inside the step's
window is found (``analysis.activations``): its wake-up latency, its timer
lateness (from the expiry of the thread's own sleep timer), its run time,
its response (from the timer's expiry, else the wake-up, to the sleep
after: what a ``deadline_us`` is held to), preemptions and migrations.
Threads are pooled by name across repetitions and phases (a thread id
changes with every start, its name does not), so each name's wake-up
latency, timer lateness and run time are compared across phases like any
kind's measures, and every wake-up above its probe's p99 is explained
through the kind hook (``windows``) by the native attribution.

Without a kernel capture (``kernel.capture: off``, no tracefs, no root) the
kind measures nothing and says so.

In a monitor (``live_capture``) there is no run capture: each period's
threads are recorded by a capture of their own that records nothing else
(``kernel.capture.WATCH_EVENTS`` for the threads in its ``set_event_pid``,
which the probe fills), read every half second; the monitor's source
gives that store (``live_store``), the threads seen so far (the probe's
``.seen.json``) and where its last read ended (``since``), so each read
finds only the new activations.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any, Literal

import polars as pl
from pydantic import Field

from loopscope.analysis.phases import Measure
from loopscope.analysis.registry import Columns, Tables
from loopscope.kinds.base import WINDOWS, ProbeKind, RunFiles, Series, StepRows, Tag, WindowSource, groups, no_windows
from loopscope.probes.params import ThreadsParams
from loopscope.rundir import RunDir, RunRecord, Step
from loopscope.spec.models import Duration, Name, ProbeModel
from loopscope.analysis.activations import activations
from loopscope.kernel import store as S
import json

ROWS: Columns = {
    "comm": pl.String,
    "tid": pl.Int64,
    "t_ns": pl.Int64,
    "wakeup_latency_ns": pl.Int64,
    "timer_lateness_ns": pl.Int64,
    "runtime_ns": pl.Int64,
    "response_ns": pl.Int64,
    "period_ns": pl.Int64,
    "preemptions": pl.Int64,
    "migrations": pl.Int64,
    "on_bound_ns": pl.Int64,
}
#: a step's activations are read from its window widened by this much (a wake-up just before it)
MARGIN_NS = 50_000_000
#: a monitor's read goes back this far before the last one's newest activation (one still running then)
SINCE_BACK_NS = 1_000_000_000


class ThreadsProbe(ThreadsParams, ProbeModel):
    """Any program's threads, uninstrumented, measured from the kernel capture: how late each
    woke, how late its timers fired, how long it ran, and why the late ones were late."""

    kind: Literal["threads"]
    deadline_us: float | None = Field(
        None,
        gt=0,
        description="each activation must end (sleep again) within this many µs of its timer's expiry (else of its wake-up); those that do not are missed deadlines",
    )
    duration: Duration | None = Field(None, description="this probe's time per phase (default: the experiment's duration)")
    host: Name | None = Field(None, description="the host it runs on (default: the first host)")


def step_activations(run_dir: Path, run: RunRecord, step: Step, result: dict[str, Any], store: Any = None, since_ns: int | None = None) -> pl.DataFrame | None:
    """The activations of the threads a step saw, inside its window (kernel
    CLOCK_MONOTONIC), with ``comm``; None when no capture covers its host.
    ``since_ns``: only those from about then on (a monitor's next read)."""

    host = run.host_of(step)
    if store is None:
        cap = next((c for c in run.captures if c.data and (host in c.covers or c.host == host)), None)
        if cap is None:
            return None
        try:
            store = S.open_capture(run_dir, cap)
        except S.CaptureError:
            return None
    names = {int(t): str(n) for t, n in (result.get("seen") or {}).items()}
    win = result.get("window_ns") or []
    if not names or len(win) != 2:
        return pl.DataFrame(schema={**ROWS, "woken_ns": pl.Int64, "on_ns": pl.Int64, "complete": pl.Boolean})
    a, b = int(win[0]), int(win[1])
    if since_ns is not None:
        a = max(a, since_ns - SINCE_BACK_NS)
    ev = store.load(a - MARGIN_NS, b + MARGIN_NS)
    act = activations(ev, list(names), store.lost, store.clock)
    act = act.filter(pl.coalesce("woken_ns", "on_ns").is_between(a, b))
    release = pl.coalesce(pl.when(pl.col("timer_lateness_ns").is_not_null()).then(pl.col("timer_expires_ns")), pl.col("woken_ns"), pl.col("on_ns"))
    return act.with_columns(
        pl.col("tid").replace_strict(names, default="?", return_dtype=pl.String).alias("comm"),
        pl.coalesce("woken_ns", "on_ns").alias("t_ns"),
        (pl.col("off_ns") - release).alias("response_ns"),
    )


class Threads(ProbeKind[ThreadsProbe]):
    name = "threads"
    windows_need_capture = True
    live_capture = True
    model = ThreadsProbe
    params = ThreadsParams
    describe = (
        "Any program's threads, uninstrumented, from the kernel capture: per thread name, how long after its wake-up each activation ran "
        "(wake-up latency), how late its own sleep timers fired (timer lateness, cyclictest's figure), and how long it ran."
    )
    tables = {"threads": ROWS}
    records = (
        ("threads", "comm || ' wakeup'", "wakeup_latency_ns"),
        ("threads", "comm || ' timer'", "timer_lateness_ns"),
        ("threads", "comm || ' runtime'", "runtime_ns"),
    )
    main = ("threads", "wakeup_latency_ns")
    labels = {"wakeup": "wake-up latency", "timer": "timer lateness", "runtime": "run time"}

    def local_programs(self, probe: ThreadsProbe) -> list[Any]:
        """A command it starts (checked at preflight like a program's)."""
        return [probe] if probe.command else []

    def rows(self, step: Step, trace: pl.DataFrame, result: dict[str, object], read: RunFiles, tag: Tag) -> StepRows:
        out = StepRows()
        host = read.run.host_of(step)
        store = read.kernel(host)
        got = step_activations(read.run_dir, read.run, step, result, store) if store is not None else None
        if got is not None and len(got):
            out.add("threads", tag(got.filter(pl.col("complete")).select(list(ROWS)).cast(ROWS)))  # type: ignore[arg-type]
        return out

    def _per_name(self, tables: Tables) -> list[tuple[str, str, pl.DataFrame]]:
        return [(probe, str(comm), gc) for probe, g in groups(tables.threads) for (comm,), gc in g.group_by("comm", maintain_order=True)]

    def measures(self, tables: Tables) -> list[Measure]:
        out = []
        for probe, comm, g in self._per_name(tables):
            for col, what in (("wakeup_latency_ns", "wakeup"), ("timer_lateness_ns", "timer"), ("runtime_ns", "runtime")):
                v = g.filter(pl.col(col).is_not_null()).select("rep", "phase", "loads", pl.col(col).alias("value"))
                if len(v):
                    out.append(Measure(probe, "threads", f"{comm} {what}", v, ("p50", "p99", "mean"), 32))
        return out

    def series(self, tables: Tables, probe: str) -> list[Series]:
        out = []
        for p, comm, g in self._per_name(tables):
            if p != probe:
                continue
            out.append(Series(f"{comm} wakeup", f"{comm}: wake-up latency", g.select("rep", "phase", "t_ns", pl.col("wakeup_latency_ns").alias("value"))))
            lat = g.filter(pl.col("timer_lateness_ns").is_not_null())
            if len(lat):
                out.append(Series(f"{comm} timer", f"{comm}: timer lateness", lat.select("rep", "phase", "t_ns", pl.col("timer_lateness_ns").alias("value"))))
        return out

    def missed(self, tables: Tables, probe: str) -> dict[str, list[tuple[int, int]]]:
        """Activations that ended later than ``deadline_us`` after their release, per repetition."""
        dl = next((p.get("deadline_us") for p in tables.spec.get("probes") or [] if p.get("name") == probe), None)
        df = tables.threads.filter(pl.col("probe") == probe) if len(tables.threads) else tables.threads
        if not dl or not len(df):
            return {}
        out: dict[str, list[tuple[int, int]]] = {}
        for (rep, phase), g in df.filter(pl.col("response_ns").is_not_null()).group_by("rep", "phase", maintain_order=True):
            out.setdefault(str(phase), []).append((int((g["response_ns"] > dl * 1000).sum()), len(g)))
        return out

    def windows(self, step: Step, src: WindowSource) -> pl.DataFrame:
        """Every complete wake-up of the step's threads, from the wake-up to the switch-in."""

        live = getattr(src, "live_store", None)
        try:
            result = json.loads((src.run_dir / step.json_).read_text().strip().splitlines()[-1])
        except (OSError, ValueError, IndexError):
            if live is None:
                return no_windows()
            try:  # a monitor's period still running: what its probe has seen so far
                result = json.loads((src.run_dir / step.trace).with_suffix(".seen.json").read_text())
            except (OSError, ValueError, TypeError):
                return no_windows()
        store = live(step) if live is not None else None
        if live is not None and store is None:
            return no_windows()
        act = step_activations(src.run_dir, src.run, step, result, store, getattr(src, "since", {}).get(step.probe))
        if act is None or not len(act):
            return no_windows()
        host = src.host_of(step)
        # windows are on the host's clock, the capture on the kernel's
        off = src.offset(host) if hasattr(src, "offset") else RunDir(src.run_dir).provenance().offsets().get(host, 0)
        # A monitor's histogram holds every activation: one whose switch-in the
        # kernel did not trace (this VM never traces a switch from CPU 1's idle
        # task) counts at its bound, the latest the switch-in can have been (a
        # watching capture has few other events on the CPU to place it by, so
        # its lower bound is often the wake-up itself: 11 % of a 1 kHz
        # cyclictest's activations came out as 0 and would have been dropped).
        lat = pl.col("wakeup_latency_ns") + (pl.col("on_bound_ns").fill_null(0) if live is not None else 0)
        ok = act.filter(pl.col("complete") & pl.col("wakeup_latency_ns").is_not_null() & (lat > 0))
        return ok.select(
            pl.lit(step.rep).alias("rep"),
            pl.lit(step.phase).alias("phase"),
            pl.lit(step.probe).alias("probe"),
            pl.lit(host).alias("host"),
            pl.col("tid"),
            (pl.col("woken_ns") + off).alias("t_ns"),
            lat.alias("latency_ns"),
            pl.lit(False).alias("span"),
        ).cast(WINDOWS)  # type: ignore[arg-type]

    def silent(self, results: list[dict[str, Any]]) -> str:
        seen = sum(len(r.get("seen") or {}) for r in results)
        if not seen:
            return f"saw no thread of its target in its {len(results)} step(s): {'; '.join(sorted({str(r.get('note') or r.get('ended')) for r in results}))}"
        return (
            f"saw {seen} thread(s) in its {len(results)} step(s) but found no activation of them in a kernel capture: "
            "the threads kind needs kernel.capture on (and tracefs and root on the host)"
        )


KIND = Threads()
