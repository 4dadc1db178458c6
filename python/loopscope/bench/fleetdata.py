"""``loopscope bench dataset --monitors N --days D``: the dataset at fleet
scale, the case where reading monitors' lines in place is weakest.

A fleet is synthesised from one real monitor's output: the one this bench
records first (a timer on CPU 1 beside a nice -20 hog that takes the CPU a
tenth of the time, ``record_s`` long) or ``--from DIR``. Each of ``monitors``
hosts gets a monitor directory of its own: its record and session (the host
and its kernel, one of ``kernels``, rewritten), ``days`` of periods of
``period_s`` (each drawn in turn from the real monitor's periods, its times
rewritten), and outliers drawn from the real ones with their causes as they
were, times rewritten, at the rate that makes ``outliers`` in all: the real
proportions of causes, hosts and hours that read like a week of a fleet.

Then each command as a user runs it (a new process; its wall time and its
peak RSS from ``wait4``):

- ``query`` of the top causes by host and hour (target ≤ 2 s), against the
  same question of DuckDB over the files in a bare process (the floor);
- ``runs`` (≤ 3 s);
- ``trend --by host`` of the period maxima of every host (no target: a point
  per host and period, a million of them for 100 hosts × 7 days of minutes);
- ``fleet``, the page (≤ 10 s, ≤ 2 MB).

Peak RSS target: ≤ 1 GB for every one.
"""

from __future__ import annotations

import datetime as _dt
import json
import os
import random
import shutil
import subprocess
import sys
import tempfile
import time
from pathlib import Path
from typing import Callable

from typing_extensions import TypedDict

from loopscope.errors import InputError, RunError
from loopscope.rundir import monitor as mrec

SPEC = """name: fleet-source
probes:
  - {kind: timer, name: t, interval_us: 1000, cpu: [1]}
loads:
  - {name: hog, kind: command, command: "nice -n -20 stress-ng --cpu 1 --taskset 1 --cpu-load 10 --quiet"}
monitor: {period: 10s, threshold: 500us}
"""

#: each host's and hour's top cause: the one that tops most of its outliers
TOP_CAUSES = (
    "SELECT host, hour, top_cause, n FROM (SELECT host, date_trunc('hour', at_utc) AS hour, top_cause, count(*) AS n FROM outliers GROUP BY host, hour, top_cause) "
    "QUALIFY row_number() OVER (PARTITION BY host, hour ORDER BY n DESC, top_cause) = 1 ORDER BY host, hour"
)


#: the floor of the top-causes question: DuckDB straight over the outlier lines in a bare process (no views, no
#: identity, no run records; ``t_ns`` taken as UTC, which only this synthetic fleet's clock allows)
FLOOR = """import duckdb, sys
duckdb.sql("SELECT host, hour, top_cause, n FROM (SELECT host, date_trunc('hour', make_timestamptz(t_ns // 1000)) AS hour, top_cause, count(*) AS n "
           "FROM read_json('" + sys.argv[1] + "/*/outliers.jsonl', format = 'newline_delimited', columns = {'host': 'VARCHAR', 't_ns': 'BIGINT', 'top_cause': 'VARCHAR'}) "
           "GROUP BY ALL) QUALIFY row_number() OVER (PARTITION BY host, hour ORDER BY n DESC, top_cause) = 1 ORDER BY host, hour").fetchall()
"""


class Command(TypedDict):
    """One command as a user runs it: its wall time and peak RSS."""

    argv: list[str]
    seconds: float
    peak_rss_mb: float


class FleetDataBench(TypedDict):
    """What ``loopscope bench dataset --monitors N --json`` prints."""

    hosts: int
    days: float
    outliers: int
    periods: int
    dataset_mb: float
    synthesised_s: float
    source: str
    query_top_causes_s: float
    #: the same question of DuckDB over the files in a bare process, and loopscope's time over it
    query_floor_s: float
    query_ratio: float
    runs_s: float
    trend_s: float
    page_s: float
    page_bytes: int
    peak_rss_mb: float
    commands: dict[str, Command]


def record_source(work: Path, seconds: float, say: Callable[[str], None]) -> Path:
    """A real monitor, ``seconds`` long, beside a periodic hog: the fleet's source."""
    if shutil.which("stress-ng") is None:
        raise InputError("bench dataset --monitors records its source monitor beside stress-ng: install it (scripts/install-deps.sh test), or give --from DIR")
    spec = work / "source.yaml"
    spec.write_text(SPEC)
    out = work / "source"
    say(f"recording the source monitor ({seconds:g} s beside a hog)")
    r = subprocess.run(
        [sys.executable, "-m", "loopscope.cli", "monitor", str(spec), "-o", str(out), "--for", f"{seconds:g}s"],
        capture_output=True,
        text=True,
        timeout=seconds + 300,
    )
    if r.returncode != 0:
        raise RunError(f"bench dataset: the source monitor failed: {r.stderr.strip()[-600:]}")
    return out


def _utc(t: float) -> str:
    return _dt.datetime.fromtimestamp(t, _dt.timezone.utc).isoformat(timespec="milliseconds")


def synthesise(src: Path, root: Path, monitors: int, days: float, outliers: int, period_s: float, kernels: int, seed: int = 1) -> tuple[int, int]:
    """The fleet under ``root`` from monitor ``src``: (periods, outliers) written."""
    periods = [p for p in mrec.periods(src) if p.get("probe") and p.get("max_ns") is not None]
    lines = [o for o in mrec.outliers(src) if o.get("causes")]
    if not periods or not lines:
        raise InputError(f"{src}: the source monitor has no closed period or no explained outlier to draw a fleet from; record a longer one")
    rec = mrec.read(src)
    session = next(iter(sorted((src / "sessions").glob("*"))), None)
    if session is None:
        raise InputError(f"{src}: the source monitor has no session directory")
    rng = random.Random(seed)
    n_periods = int(days * 86400 // period_s)
    per_host = max(1, outliers // monitors)
    t_start = time.time() - days * 86400
    wrote_p = wrote_o = 0
    for i in range(monitors):
        host = f"host{i + 1:03d}"
        d = root / f"monitor-{host}"
        (d / "sessions").mkdir(parents=True)
        s = d / "sessions" / session.name
        shutil.copytree(session, s, ignore=shutil.ignore_patterns("steps"))
        kernel = f"6.{i % kernels}.0-fleet"
        for name in ("run.json", "provenance.json", "spec.json"):
            f = s / name
            if f.exists():
                f.write_text(
                    f.read_text().replace('"localhost"', json.dumps(host)).replace('"release": "', f'"release": "{kernel}-').replace("localhost", host)
                )
        with open(d / "periods.jsonl", "w") as pf:
            for k in range(n_periods):
                p = dict(periods[k % len(periods)])
                a = t_start + k * period_s
                base_t = int(a * 1e9)  # the synthetic monotonic clock: UTC in ns
                p.update(period=k + 1, start_utc=_utc(a), end_utc=_utc(a + period_s), seconds=period_s, gap_s=0.0)
                max_t = base_t + rng.randrange(int(period_s * 1e9))
                p["max_t_ns"], p["max_at_utc"] = max_t, _utc(max_t / 1e9)
                pf.write(json.dumps(p) + "\n")
        wrote_p += n_periods
        with open(d / "outliers.jsonl", "w") as of:
            for k in range(per_host):
                o = dict(lines[rng.randrange(len(lines))])
                o["t_ns"] = int((t_start + rng.random() * days * 86400) * 1e9)
                o["host"] = host
                of.write(json.dumps(o) + "\n")
        wrote_o += per_host
        counts: mrec.Counts = {**rec["counts"], "outliers_above": per_host, "kept": per_host, "explained": per_host, "not_kept": {}}
        mine: mrec.MonitorJson = {
            **rec,
            "name": f"fleet-{host}",
            "periods": n_periods,
            "started_utc": _utc(t_start),
            "updated_utc": _utc(t_start + days * 86400),
            "counts": counts,
        }
        mrec.write(d, mine)
    return wrote_p, wrote_o


def timed(argv: list[str], out: Path | None = None) -> Command:
    """``argv`` as a new process: its wall time and its own peak RSS (``wait4``)."""
    t0 = time.perf_counter()
    with open(out or os.devnull, "w") as f:
        p = subprocess.Popen(argv, stdout=f, stderr=subprocess.PIPE, text=True)
        _, status, ru = os.wait4(p.pid, 0)
        dt = time.perf_counter() - t0
        p.returncode = os.waitstatus_to_exitcode(status)
        err = p.stderr.read() if p.stderr else ""
    if p.returncode != 0:
        raise RunError(f"bench dataset: {' '.join(argv[3:6])} failed: {err.strip()[-600:]}")
    return {
        "argv": argv[3:] if argv[1:3] == ["-m", "loopscope.cli"] else ["python", "-c", "FLOOR", *argv[3:]],
        "seconds": round(dt, 2),
        "peak_rss_mb": round(ru.ru_maxrss / 1024, 1),
    }


def bench(
    monitors: int = 100,
    days: float = 7.0,
    outliers: int = 500_000,
    period_s: float = 60.0,
    kernels: int = 4,
    source: str | None = None,
    record_s: float = 180.0,
    keep: str | None = None,
    say: Callable[[str], None] | None = None,
) -> FleetDataBench:
    say = say or (lambda _t: None)
    work = Path(keep) if keep else Path(tempfile.mkdtemp(prefix="loopscope-bench-fleet-"))
    try:
        work.mkdir(parents=True, exist_ok=True)
        src = Path(source) if source else record_source(work, record_s, say)
        if not mrec.exists(src):
            raise InputError(f"{src}: not a monitor directory (no monitor.json); give --from a directory `loopscope monitor` wrote")
        root = work / "fleet"
        shutil.rmtree(root, ignore_errors=True)
        say(f"synthesising {monitors} hosts × {days:g} days of {period_s:g} s periods, {outliers:,} outliers, from {src}")
        t0 = time.perf_counter()
        n_p, n_o = synthesise(src, root, monitors, days, outliers, period_s, kernels)
        synth = time.perf_counter() - t0
        mb = sum(f.stat().st_size for f in root.rglob("*") if f.is_file()) / 1e6
        cli = [sys.executable, "-m", "loopscope.cli"]
        say(f"  {mb:.0f} MB in {synth:.0f} s; timing query, runs, trend and fleet")
        cmds: dict[str, Command] = {
            "query_top_causes": timed([*cli, "query", str(root), TOP_CAUSES, "--format", "csv"]),
            "query_floor": timed([sys.executable, "-c", FLOOR, str(root)]),
            "runs": timed([*cli, "runs", str(root), "--format", "json"]),
            "trend": timed([*cli, "trend", str(root), "--probe", "t", "--metric", "max", "--by", "host", "--json"]),
            "page": timed([*cli, "fleet", str(root), "-o", str(work / "fleet.html")]),
        }
        return {
            "hosts": monitors,
            "days": days,
            "outliers": n_o,
            "periods": n_p,
            "dataset_mb": round(mb, 1),
            "synthesised_s": round(synth, 1),
            "source": str(src),
            "query_top_causes_s": cmds["query_top_causes"]["seconds"],
            "query_floor_s": cmds["query_floor"]["seconds"],
            "query_ratio": round(cmds["query_top_causes"]["seconds"] / max(cmds["query_floor"]["seconds"], 1e-3), 2),
            "runs_s": cmds["runs"]["seconds"],
            "trend_s": cmds["trend"]["seconds"],
            "page_s": cmds["page"]["seconds"],
            "page_bytes": (work / "fleet.html").stat().st_size,
            "peak_rss_mb": max(c["peak_rss_mb"] for k, c in cmds.items() if k != "query_floor"),
            "commands": cmds,
        }
    finally:
        if not keep:
            shutil.rmtree(work, ignore_errors=True)
