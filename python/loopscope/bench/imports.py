"""``loopscope bench import``: reading other tools' recordings, against their own readers.

A busy recording is made here (``stress-ng --switch`` on every CPU: context
switches, wake-ups, timers and interrupts, the densest traffic a scheduler
trace has), as trace-cmd writes it (``trace-cmd extract``: version 7,
zstd) and converted to version 6 and to uncompressed version 7, and as
``perf record -e sched:… `` and ``perf sched record`` write it (the latter's
events in two sample formats). For each file, ``repeat`` times,
alternating:

- ``loopscope import`` into the segment format: events per second, its
  peak RSS (the import's memory is bounded by a batch, not by the file),
  and its count of events against the recorder's own reader's;
- for a perf.data, the same import through the linux-perf-data crate's
  sorted reader (``--perf-reader sorted``), right after: the baseline of
  the file-order walk (``walk_over_sorted``);
- the peer: ``trace-cmd report`` / ``perf script`` reading the same file
  into text (the recorder's own way out of its format), events per second;
- ``loopscope threads RUN`` on the imported run, events of the capture per
  second of analysis (interpreter start-up included) and peak RSS, twice:
  ``--comm stress-ng``, the weakest case (the threads measured are in
  nearly every event: a million activations and thousands of outliers to
  explain per 8 M events), and ``--comm 'rcu|ksoftirqd|kworker'``, the
  common one (a few threads of a busy machine: the capture is streamed
  past them);
- once per file, the attribution's weakest case for memory: one wake-up
  window of the busiest thread over the whole capture (a thread starved
  for the whole recording), attributed in a process of its own
  (``long_window_s``, ``long_window_rss_mb``): its events are split a row
  group at a time, so the memory is the split's picture of the CPUs, not
  the events.

``large`` adds the case at scale: a version-6 trace.dat of ``stress-ng
--switch`` for ``LARGE_SECONDS`` into a ``LARGE_BUFFER_KB`` buffer per CPU
(some 30 M events, 2 GB), read once (each reading takes a minute). Its
``threads`` weakest case is where memory that grows with the activations
shows.

Figures are medians over the repetitions; the ratio is loopscope's rate
over the peer's.
"""

from __future__ import annotations

import json
import os
import shutil
import statistics
import subprocess
import sys
import time
from collections.abc import Callable
from pathlib import Path

from typing_extensions import NotRequired, TypedDict

from loopscope.bench import foreign as F
from loopscope.errors import RunError
from loopscope.host import scratch
from loopscope.kernel.imported import kind_of

#: the common case for ``threads``: a few kernel threads of the busy machine
FEW = "rcu|ksoftirqd|kworker"
#: the large case: how long the load is recorded, into how large a buffer per CPU
LARGE_SECONDS = 36
LARGE_BUFFER_KB = 1_400_000
#: what the busy recordings enable
EVENTS = [
    "sched/sched_switch",
    "sched/sched_wakeup",
    "sched/sched_waking",
    "sched/sched_migrate_task",
    "sched/sched_stat_runtime",
    "irq",
    "timer/hrtimer_start",
    "timer/hrtimer_expire_entry",
]


class FileFigures(TypedDict):
    file: str
    bytes: int
    events: int
    reported: int
    counts_equal: bool
    import_events_per_s: float
    import_rss_mb: float
    peer: str
    peer_events_per_s: float
    ratio: float
    #: perf.data only: the same import through the crate's sorted reader (``--perf-reader sorted``), a median
    sorted_reader_events_per_s: float | None
    #: perf.data only: ``import_events_per_s`` over ``sorted_reader_events_per_s`` (the file-order walk's gain)
    walk_over_sorted: float | None
    threads_events_per_s: float | None
    threads_rss_mb: float | None
    threads_few_events_per_s: float | None
    threads_few_rss_mb: float | None
    #: one window over the whole capture, attributed: seconds (the attribution alone) and the process's peak RSS
    long_window_s: float
    long_window_rss_mb: float


class ImportBench(TypedDict):
    """What ``loopscope bench import --json`` prints."""

    files: list[FileFigures]
    repeat: int
    seconds: float
    #: the large case's file (``--large``), read once
    large: NotRequired[FileFigures]


def _rss_of(cmd: list[str]) -> tuple[float, float, subprocess.CompletedProcess[str]]:
    """Wall seconds and peak RSS (MB) of one command (its own, through wait4)."""
    t0 = time.perf_counter()
    p = subprocess.Popen(cmd, stdout=subprocess.PIPE, stderr=subprocess.PIPE)
    assert p.stdout is not None and p.stderr is not None
    out, err = p.stdout.read(), p.stderr.read()
    _, status, ru = os.wait4(p.pid, 0)
    p.returncode = os.waitstatus_to_exitcode(status)
    return time.perf_counter() - t0, ru.ru_maxrss / 1024, subprocess.CompletedProcess(cmd, p.returncode, out.decode(), err.decode())


#: one wake-up window of the busiest thread over the capture of the run ``argv[1]``, attributed; prints its seconds
LONG_WINDOW = """
import pathlib, sys, time
import polars as pl
from loopscope.analysis.explain import MARGIN_NS, attribute_store
from loopscope.kernel import store as S
st = S.open_dir(next(pathlib.Path(sys.argv[1]).rglob("segments.jsonl")).parent)
a, b = st.t_first + MARGIN_NS, st.t_last - MARGIN_NS
sw = pl.scan_parquet(st.files()).filter((pl.col("event") == st.event_names.index("sched_switch")) & (pl.col("next_pid") > 0))
tid = int(sw.group_by("next_pid").len().sort("len").collect()["next_pid"][-1])
t0 = time.perf_counter()
att = attribute_store(st, pl.DataFrame({"id": [0], "tid": [tid], "start_k": [a], "end_k": [b], "span": [False]}))
assert att["ns"].sum() == b - a, att
print(time.perf_counter() - t0)
"""


def _peer_rate(path: Path, events: int) -> tuple[str, float]:
    with open(path, "rb") as f:
        dat = f.read(3) == b"\x17\x08\x44"
    cmd = ["trace-cmd", "report", "-i", str(path)] if dat else ["perf", "script", "-i", str(path)]
    t0 = time.perf_counter()
    subprocess.run(cmd, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL, check=False)
    return cmd[0] + " " + cmd[1], events / (time.perf_counter() - t0)


def _one(path: Path, repeat: int, work: Path, progress: Callable[[str], None] | None) -> FileFigures:
    reported = F.reported(path)
    imp: list[tuple[float, float, int]] = []
    peer: list[float] = []
    thr: list[float] = []
    few: list[float] = []
    thr_rss: list[float] = []
    few_rss: list[float] = []
    sorted_rates: list[float] = []
    name = ""
    perf = kind_of(path) == "perf.data"
    long_s, long_rss = 0.0, 0.0
    for i in range(repeat):
        out = work / f"run-{path.stem}-{i}"
        cmd = [sys.executable, "-m", "loopscope.cli", "import", str(path), "-o", str(out), "--json"]
        secs, rss, r = _rss_of(cmd)
        if r.returncode != 0:
            raise RunError(f"loopscope import {path.name} failed: {r.stderr.strip()[-300:]}", component="bench")
        n = int(json.loads(r.stdout.strip().splitlines()[-1])["kernel_events"])
        imp.append((secs, rss, n))
        if perf:
            # the baseline of the file-order walk: the crate's sorted reader, on the same file, right after
            sorted_out = work / f"run-{path.stem}-{i}-sorted"
            ss, _, sr = _rss_of([*cmd[:-3], "-o", str(sorted_out), "--json", "--perf-reader", "sorted"])
            if sr.returncode != 0 or int(json.loads(sr.stdout.strip().splitlines()[-1])["kernel_events"]) != n:
                raise RunError(f"loopscope import --perf-reader sorted {path.name} failed or counted otherwise: {sr.stderr.strip()[-300:]}", component="bench")
            sorted_rates.append(n / ss)
            shutil.rmtree(sorted_out, ignore_errors=True)
        name, rate = _peer_rate(path, n)
        peer.append(rate)
        for comm, into, mem in (("stress-ng", thr, thr_rss), (FEW, few, few_rss)):
            ts, trss, tr = _rss_of([sys.executable, "-m", "loopscope.cli", "threads", str(out), "--comm", comm, "--json"])
            if tr.returncode != 0:  # a figure missing would hide the failure: it is the bench's
                raise RunError(f"loopscope threads {out.name} --comm {comm!r} failed: {tr.stderr.strip()[-300:]}", component="bench")
            into.append(n / ts)
            mem.append(trss)
        if i == 0:
            _, long_rss, lw = _rss_of([sys.executable, "-c", LONG_WINDOW, str(out)])
            if lw.returncode != 0:
                raise RunError(f"one window over {out.name}'s capture was not attributed: {lw.stderr.strip()[-300:]}", component="bench")
            long_s = float(lw.stdout.strip().splitlines()[-1])
        shutil.rmtree(out, ignore_errors=True)
        if progress:
            progress(
                f"{path.name} #{i + 1}: import {n / secs / 1e6:.2f} M events/s ({rss:.0f} MB), {name} {rate / 1e6:.2f} M/s"
                + (f", threads {thr[-1] / 1e6:.2f} M/s" if thr else "")
                + (f" ({few[-1] / 1e6:.2f} M/s for a few)" if few else "")
            )
    # the rate of the command as a user runs it (interpreter start-up included)
    rates = [n / s for s, _, n in imp]
    ir, pr = statistics.median(rates), statistics.median(peer)
    return {
        "file": path.name,
        "bytes": path.stat().st_size,
        "events": imp[0][2],
        "reported": reported,
        "counts_equal": imp[0][2] == reported,
        "import_events_per_s": ir,
        "import_rss_mb": max(x[1] for x in imp),
        "peer": name,
        "peer_events_per_s": pr,
        "ratio": ir / pr,
        "sorted_reader_events_per_s": statistics.median(sorted_rates) if sorted_rates else None,
        "walk_over_sorted": ir / statistics.median(sorted_rates) if sorted_rates else None,
        "threads_events_per_s": statistics.median(thr) if thr else None,
        "threads_rss_mb": max(thr_rss) if thr_rss else None,
        "threads_few_events_per_s": statistics.median(few) if few else None,
        "threads_few_rss_mb": max(few_rss) if few_rss else None,
        "long_window_s": long_s,
        "long_window_rss_mb": long_rss,
    }


def run(
    quick: bool = False, seconds: float | None = None, repeat: int | None = None, large: bool = False, progress: Callable[[str], None] | None = None
) -> ImportBench:
    for tool in ("trace-cmd", "stress-ng"):
        if shutil.which(tool) is None:
            raise RunError(f"bench import needs {tool}", component="bench")
    secs = float(max(1, round(seconds or (1 if quick else 4))))  # stress-ng takes whole seconds (0.5 would be "forever")
    reps = repeat or (1 if quick else 3)
    with scratch.directory("bench-import") as d:
        work = Path(d)
        # quick: a light load (the smoke test's files are small); else the densest scheduler traffic
        load = ["stress-ng", "--cpu", "1", "-t", f"{secs:g}", "-q"] if quick else ["stress-ng", "--switch", str(os.cpu_count() or 2), "-t", f"{secs:g}", "-q"]
        buf = int(64 * 1024 * secs)
        v7 = F.trace_dat(work / "busy-v7.dat", load, events=EVENTS, buffer_kb=buf, clock="mono")
        files = [v7, F.trace_dat(work / "busy-v6.dat", load, events=EVENTS, buffer_kb=buf, clock="mono", version=6, compression="none")]
        if shutil.which("perf"):
            files.append(F.perf_data(work / "busy-perf.data", load, events=[e.replace("/", ":") for e in EVENTS if "/" in e]))
            # what users bring: perf sched record's events come in two sample formats, told apart by their ids
            files.append(F.perf_data(work / "busy-perf-sched.data", load))
        out = [_one(f, reps, work, progress) for f in files]
        got: ImportBench = {"files": out, "repeat": reps, "seconds": secs}
        for f in files:
            f.unlink()
        if large:
            # the buffer holds the whole load: nothing is overwritten, so every switch is in the file
            load = ["stress-ng", "--switch", str(os.cpu_count() or 2), "-t", f"{LARGE_SECONDS}", "-q"]
            big = F.trace_dat(work / "large-v6.dat", load, events=EVENTS, buffer_kb=LARGE_BUFFER_KB, clock="mono", version=6, compression="none")
            got["large"] = _one(big, 1, work, progress)
    return got


def print_human(r: ImportBench) -> None:
    for f in r["files"]:
        th = (
            f"; threads {f['threads_events_per_s'] / 1e6:.2f} M events/s in {f['threads_rss_mb']:.0f} MB (every event a target's)"
            if f["threads_events_per_s"] and f["threads_rss_mb"]
            else ""
        )
        th += (
            f", {f['threads_few_events_per_s'] / 1e6:.2f} M events/s in {f['threads_few_rss_mb']:.0f} MB (a few threads)"
            if f["threads_few_events_per_s"] and f["threads_few_rss_mb"]
            else ""
        )
        th += f"; one window over the capture attributed in {f['long_window_s']:.2f} s, {f['long_window_rss_mb']:.0f} MB"
        print(
            f"{f['file']} ({f['bytes'] / 1e6:.0f} MB, {f['events']:,} events, {f['peer']} counts {f['reported']:,}: {'equal' if f['counts_equal'] else 'DIFFERENT'}): "
            f"import {f['import_events_per_s'] / 1e6:.2f} M events/s in {f['import_rss_mb']:.0f} MB, {f['peer']} {f['peer_events_per_s'] / 1e6:.2f} M/s "
            f"(× {f['ratio']:.1f}){th}"
            + (
                f"; the crate's sorted reader {sr / 1e6:.2f} M events/s (the walk × {f['walk_over_sorted'] or 0:.1f})"
                if (sr := f.get("sorted_reader_events_per_s"))
                else ""
            )
        )
    print(f"medians of {r['repeat']} repetitions; recordings of stress-ng --switch for {r['seconds']:g} s")
    if "large" in r:
        f = r["large"]
        th = (
            f"; threads (weakest) {f['threads_events_per_s'] / 1e6:.2f} M events/s in {f['threads_rss_mb']:.0f} MB"
            if f["threads_events_per_s"] and f["threads_rss_mb"]
            else ""
        )
        th += f"; one window over the capture attributed in {f['long_window_s']:.2f} s, {f['long_window_rss_mb']:.0f} MB"
        print(
            f"large: {f['file']} ({f['bytes'] / 1e9:.2f} GB, {f['events']:,} events, counts {'equal' if f['counts_equal'] else 'DIFFERENT'}): "
            f"import {f['import_events_per_s'] / 1e6:.2f} M events/s in {f['import_rss_mb']:.0f} MB{th}"
        )
