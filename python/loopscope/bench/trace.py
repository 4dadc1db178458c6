"""``loopscope bench trace``: what a record costs, against its floor and LTTng.

Measured in one run, back to back:

- ``floor_ns``: a TSC read and a 16-byte store into an 8 MiB buffer (the size
  of a thread's trace ring), in the same C program and loop shape as the
  logging modes; ``c_ns``, ``c_2threads_ns``, ``disabled_ns`` from that
  program through ``include/loopscope.h``; ``rust_ns`` and ``py_ns`` in this
  process through the Rust API and the Python binding. Each figure is the
  median over repetitions of a loop that fits the ring, with a flush between
  repetitions, and the run checks that no record was dropped while timing (a
  dropped record would be cheaper than a written one). Floor and event
  repetitions alternate, and the ratios are medians of per-pair ratios, so
  that the machine's drift (this VM's TSC read alone varies from 10 to 14
  ns between minutes) cancels;
- ``write_mevents_per_s``: one thread logging as fast as it can for 30 s
  into a file on disk; records that reached the file (counted by reading it
  back) over the time until close and fsync returned;
- ``read_mrecords_per_s``: ``loopscope.trace.read`` of a 20 M record trace
  into a DataFrame (sorted by time, the default);
- ``lost_records``: records dropped at a paced 1 M events/s for 10 s;
- ``lttng_ns``: the same loop with an LTTng-UST tracepoint in an active
  session, when LTTng is installed (else null, with the reason).
"""

from __future__ import annotations

import json
import os
import shutil
import statistics
import subprocess
import tempfile
import time
from pathlib import Path
from typing import Callable

from typing_extensions import TypedDict

from loopscope import _native, cbuild
from loopscope.host import procs
from loopscope.errors import RunError
from loopscope.trace import api as lt
from loopscope.trace import reader

HERE = Path(__file__).resolve().parent
Progress = Callable[[str], None] | None


def _median(v: list[float]) -> float:
    return float(statistics.median(v))


def _spread(v: list[float]) -> list[float]:
    """Interquartile range: how noisy the repetitions were."""
    if len(v) < 4:
        return [min(v), max(v)]
    q = statistics.quantiles(v, n=4)
    return [round(q[0], 3), round(q[2], 3)]


def _say(progress: Progress, msg: str) -> None:
    if progress:
        progress(msg)


def _run_c(exe: Path, mode: str, n: int, reps: int, trace: Path) -> tuple[dict[str, list[float]], int]:
    """Run one mode of the C program: ({mode: ns per repetition}, records lost)."""
    r = subprocess.run([str(exe), mode, str(n), str(reps), str(trace)], capture_output=True, text=True, timeout=600)
    if r.returncode != 0:
        raise RunError(f"benchmark program {exe.name} {mode} failed (exit {r.returncode}): {r.stderr.strip()[-500:]}")
    lines = [json.loads(l) for l in r.stdout.splitlines() if l.startswith("{")]
    ns = {l["mode"]: l["ns"] for l in lines if "ns" in l}
    lost = next(l["lost"] for l in lines if "lost" in l)
    return ns, lost


def _paired_ratio(num: list[float], den: list[float]) -> float:
    """Median of the per-repetition ratios of alternating measurements."""
    return float(statistics.median(a / b for a, b in zip(num, den)))


def _lttng(work: Path, n: int, reps: int, progress: Progress) -> tuple[list[float] | None, str]:
    """LTTng-UST's cost on the same loop, or (None, why not)."""
    inc = Path("/usr/include/x86_64-linux-gnu/lttng/tracepoint.h")
    if not shutil.which("lttng") or not shutil.which("lttng-sessiond"):
        return None, "lttng-tools is not installed (Debian: lttng-tools, liblttng-ust-dev)"
    if not inc.exists() and not Path("/usr/include/lttng/tracepoint.h").exists():
        return None, "LTTng-UST headers are not installed (Debian: liblttng-ust-dev)"
    exe = work / "lttng_bench"
    src = work / "lttng_bench.c"
    shutil.copy(HERE / "lttng_bench.c", src)
    shutil.copy(HERE / "lttng_tp.h", work / "lttng_tp.h")
    r = subprocess.run([cbuild.compiler(), "-O2", "-I", str(work), str(src), "-o", str(exe), "-llttng-ust", "-ldl"], capture_output=True, text=True)
    if r.returncode != 0:
        return None, f"compiling the LTTng benchmark failed: {r.stderr.strip()[-300:]}"
    before = _pids("lttng-sessiond")
    started: set[int] = set()
    if not before:
        s = subprocess.run(["lttng-sessiond", "--daemonize"], capture_output=True, text=True)
        if s.returncode != 0:
            return None, f"lttng-sessiond would not start: {s.stderr.strip()[-200:]}"
        started = _pids("lttng-sessiond") - before
    session = f"loopscope-bench-{os.getpid()}"
    env = dict(os.environ)
    try:
        steps = [
            ["lttng", "create", session, f"--output={work / 'lttng-out'}"],
            ["lttng", "enable-channel", "-u", "--session", session, "--subbuf-size=8M", "--num-subbuf=4", "ch"],
            ["lttng", "enable-event", "-u", "--session", session, "--channel", "ch", "loopscope_bench:ev"],
            ["lttng", "start", session],
        ]
        for st in steps:
            c = subprocess.run(st, capture_output=True, text=True, timeout=60)
            if c.returncode != 0:
                return None, f"{' '.join(st[:2])} failed: {(c.stderr or c.stdout).strip()[-200:]}"
        _say(progress, "  LTTng-UST loop …")
        b = subprocess.run([str(exe), str(n), str(reps)], capture_output=True, text=True, timeout=600, env=env)
        if b.returncode != 0:
            return None, f"the LTTng benchmark program failed (exit {b.returncode}): {b.stderr.strip()[-200:]}"
        ns = json.loads(b.stdout.strip().splitlines()[-1])["ns"]
        return ns, "LTTng-UST in an active session, 4 x 8 MiB per-UID sub-buffers"
    finally:
        subprocess.run(["lttng", "stop", session], capture_output=True, timeout=60)
        subprocess.run(["lttng", "destroy", session], capture_output=True, timeout=60)
        for pid in started:
            procs.terminate_pid(pid, grace=5.0)


def _pids(name: str) -> set[int]:
    out = set()
    for d in Path("/proc").iterdir():
        if d.name.isdigit():
            try:
                if (d / "comm").read_text().strip() == name:
                    out.add(int(d.name))
            except OSError:
                pass
    return out


class Loops(TypedDict):
    """ns per event of each repetition: Rust against its floor, Python against an empty loop."""

    rust_floor: list[float]
    rust: list[float]
    py: list[float]
    loop: list[float]
    lost: int


class Sustained(TypedDict):
    seconds: float
    elapsed: float
    logged: int
    written: int
    lost: int
    bytes: int


class Paced(TypedDict):
    events: int
    seconds: float
    written: int
    lost_records: int
    end_lost: int


class Read(TypedDict):
    times: list[float]
    records: int


class Context(TypedDict):
    repetitions: int
    events_per_repetition: int
    lost_while_timing: int
    quick: bool


class TraceBench(TypedDict):
    """What ``loopscope bench trace --json`` prints: medians, paired ratios,
    spreads (IQR) and the context of every figure."""

    floor_ns: float
    c_ns: float
    rust_ns: float
    py_ns: float
    c_2threads_ns: float
    disabled_ns: float
    write_mevents_per_s: float
    read_mrecords_per_s: float
    lost_records: int
    lttng_ns: float | None
    ratios: dict[str, float | None]
    spread_iqr_ns: dict[str, list[float] | None]
    context: dict[str, int | float | bool | str | list[float] | None]


def run(*, quick: bool = False, write_seconds: float | None = None, workdir: str | None = None, progress: Progress = None) -> TraceBench:
    """Run every measurement; returns the JSON object ``--json`` prints."""
    n = 250_000  # 4 MB of records: half a thread's default ring
    reps = 5 if quick else 21
    write_s = write_seconds if write_seconds is not None else (2.0 if quick else 30.0)
    paced_s = 1.0 if quick else 10.0
    read_n = 2_000_000 if quick else 20_000_000
    tmp = tempfile.TemporaryDirectory(prefix="loopscope-bench-", dir=workdir)
    work = Path(tmp.name)
    if _native.is_open():
        raise RunError("a trace is already open in this process; the benchmark needs its own")
    try:
        _say(progress, f"building the C benchmark against libloopscope.a in {work} …")
        exe = cbuild.build([HERE / "trace_bench.c"], work / "trace_bench")
        c: dict[str, list[float]] = {}
        lost_timing = 0
        for mode in ("paired", "disabled", "threads2"):
            _say(progress, f"  C {mode}: {reps} x {n:,} …")
            ns, lost = _run_c(exe, mode, n, reps, work / f"c-{mode}.lstrace")
            c.update(ns)
            lost_timing += lost
        _say(progress, "  Rust and Python loops …")
        loops = _loops(work, n, reps)
        lost_timing += loops["lost"]
        wr = _sustained(work, write_s, progress)
        _say(progress, "  paced 1 M events/s …")
        paced = _paced(work, paced_s)
        _say(progress, f"  reader: {read_n:,} records …")
        rd = _read(work, n, read_n)
        lttng_ns, lttng_note = _lttng(work, n, reps, progress)
        return _result(
            c, loops, wr, paced, rd, (lttng_ns, lttng_note), {"repetitions": reps, "events_per_repetition": n, "lost_while_timing": lost_timing, "quick": quick}
        )
    finally:
        tmp.cleanup()


def _loops(work: Path, n: int, reps: int) -> Loops:
    """The Rust logging loop against its empty floor, and a Python loop of events against an empty one, alternating."""
    ses = lt.open(work / "rust.lstrace", groups=["bench"])
    out: Loops = {"rust_floor": [], "rust": [], "py": [], "loop": [], "lost": 0}
    try:
        for _ in range(reps):  # alternating, like the C pairs
            out["rust_floor"] += _native.bench_floor(n, 1)
            out["rust"] += _native.bench_events(n, 1, 1)
        ev = lt.event("bench", "py", "benchmark event (Python loop)")
        n_py = 100_000
        rng = range(n_py)
        for _ in range(reps):
            t0 = time.perf_counter_ns()
            for i in rng:
                ev(i)
            out["py"].append((time.perf_counter_ns() - t0) / n_py)
            t0 = time.perf_counter_ns()
            for i in rng:
                pass
            out["loop"].append((time.perf_counter_ns() - t0) / n_py)
            lt.flush()
    finally:
        end = ses.close()
    out["lost"] = end.lost_records
    return out


def _sustained(work: Path, write_s: float, progress: Progress) -> Sustained:
    """Logging flat out for ``write_s`` seconds, fsync on: what reaches the file."""
    free = shutil.disk_usage(work).free
    # The flat-out writer can reach the disk's speed; keep 10 GB spare.
    if free < 12e9:
        write_s = min(write_s, max(1.0, (free - 10e9) / 400e6))
    _say(progress, f"  sustained write to {work} for {write_s:g} s …")
    wpath = work / "write.lstrace"
    ses = lt.open(wpath, groups=["bench"], fsync=True)
    t0 = time.perf_counter()
    try:
        logged, _ = _native.bench_sustained(0.0, write_s)
    finally:
        wend = ses.close()
    elapsed = time.perf_counter() - t0
    written = reader.check(wpath).records
    wbytes = wpath.stat().st_size
    wpath.unlink()
    return {"seconds": write_s, "elapsed": elapsed, "logged": logged, "written": written, "lost": wend.lost_records, "bytes": wbytes}


def _paced(work: Path, paced_s: float) -> Paced:
    """1 M events/s for ``paced_s`` seconds: whether anything is lost."""
    ppath = work / "paced.lstrace"
    ses = lt.open(ppath, groups=["bench"])
    try:
        paced_n, paced_el = _native.bench_sustained(1e6, paced_s)
    finally:
        pend = ses.close()
    pinf = reader.check(ppath)
    return {"events": paced_n, "seconds": paced_el, "written": pinf.records, "lost_records": pinf.lost_records, "end_lost": pend.lost_records}


def _read(work: Path, n: int, read_n: int) -> Read:
    """Reading ``read_n`` records into a frame, three times."""
    rpath = work / "read.lstrace"
    ses = lt.open(rpath, groups=["bench"])
    try:
        _native.bench_events(n, read_n // n, 1)
    finally:
        ses.close()
    rtimes = []
    nrec = 0
    for _ in range(3):
        t0 = time.perf_counter()
        df = reader.read(rpath)
        rtimes.append(time.perf_counter() - t0)
        nrec = len(df)
        del df
    return {"times": rtimes, "records": nrec}


def _result(c: dict[str, list[float]], loops: Loops, wr: Sustained, paced: Paced, rd: Read, lttng: tuple[list[float] | None, str], ctx: Context) -> TraceBench:
    """The JSON object: medians, paired ratios, spreads and the context of each figure."""
    lttng_ns, lttng_note = lttng
    rust, rust_floor, py = loops["rust"], loops["rust_floor"], loops["py"]
    floor = _median(c["floor"])
    cns = _median(c["event"])
    return {
        "floor_ns": round(floor, 2),
        "c_ns": round(cns, 2),
        "rust_ns": round(_median(rust), 2),
        "py_ns": round(_median(py), 1),
        "c_2threads_ns": round(_median(c["threads2"]), 2),
        "disabled_ns": round(_median(c["disabled"]), 3),
        "write_mevents_per_s": round(wr["written"] / wr["elapsed"] / 1e6, 2),
        "read_mrecords_per_s": round(rd["records"] / _median(rd["times"]) / 1e6, 2),
        "lost_records": paced["lost_records"],
        "lttng_ns": round(_median(lttng_ns), 2) if lttng_ns else None,
        "ratios": {
            "c_over_floor": round(_paired_ratio(c["event"], c["floor"]), 3),
            "rust_over_floor": round(_paired_ratio(rust, rust_floor), 3),
            "c_2threads_over_floor": round(_median(c["threads2"]) / floor, 3),
            "lttng_over_c": round(_median(lttng_ns) / cns, 2) if lttng_ns else None,
        },
        "spread_iqr_ns": {
            "floor": _spread(c["floor"]),
            "c": _spread(c["event"]),
            "rust": _spread(rust),
            "py": _spread(py),
            "c_2threads": _spread(c["threads2"]),
            "disabled": _spread(c["disabled"]),
            "lttng": _spread(lttng_ns) if lttng_ns else None,
        },
        "context": {
            "repetitions": ctx["repetitions"],
            "events_per_repetition": ctx["events_per_repetition"],
            "rust_floor_ns": round(_median(rust_floor), 2),
            "py_empty_loop_ns": round(_median(loops["loop"]), 1),
            "lost_while_timing": ctx["lost_while_timing"],
            "write_seconds": wr["seconds"],
            "write_elapsed_s": round(wr["elapsed"], 2),
            "write_logged": wr["logged"],
            "write_written": wr["written"],
            "write_lost_records": wr["lost"],
            "write_bytes": wr["bytes"],
            "write_mb_per_s": round(wr["bytes"] / wr["elapsed"] / 1e6, 1),
            "paced_events": paced["events"],
            "paced_seconds": round(paced["seconds"], 3),
            "paced_written": paced["written"],
            "paced_end_lost": paced["end_lost"],
            "read_records": rd["records"],
            "read_seconds": [round(t, 3) for t in rd["times"]],
            "lttng": lttng_note,
            "clock": _native.clock_info()[0],
            "quick": ctx["quick"],
        },
    }


def print_human(r: TraceBench) -> None:
    c = r["context"]
    rt = r["ratios"]
    lines = [
        "per event (median of {} repetitions of {:,}; IQR in brackets)".format(c["repetitions"], c["events_per_repetition"]),
        f"  floor (TSC read + 16-byte store)  {r['floor_ns']:8.2f} ns  {r['spread_iqr_ns']['floor']}",
        f"  C                                 {r['c_ns']:8.2f} ns  {r['spread_iqr_ns']['c']}   {rt['c_over_floor']:.2f}x floor",
        f"  Rust                              {r['rust_ns']:8.2f} ns  {r['spread_iqr_ns']['rust']}   {rt['rust_over_floor']:.2f}x floor",
        f"  C, 2 threads at once              {r['c_2threads_ns']:8.2f} ns  {r['spread_iqr_ns']['c_2threads']}",
        f"  Python                            {r['py_ns']:8.1f} ns  (empty loop {c['py_empty_loop_ns']} ns)",
        f"  disabled                          {r['disabled_ns']:8.3f} ns",
    ]
    if r["lttng_ns"] is not None:
        lines.append(f"  LTTng-UST, same loop              {r['lttng_ns']:8.2f} ns  {r['spread_iqr_ns']['lttng']}   {rt['lttng_over_c']:.1f}x loopscope C")
    else:
        lines.append(f"  LTTng-UST: not measured ({c['lttng']})")
    lines += [
        f"records dropped while timing: {c['lost_while_timing']}",
        f"sustained write, one thread, {c['write_seconds']:g} s to disk with fsync: {r['write_mevents_per_s']} M events/s "
        f"({c['write_mb_per_s']} MB/s; {c['write_lost_records']:,} of {c['write_logged']:,} logged dropped while the disk kept up)",
        f"paced 1 M events/s for {c['paced_seconds']} s: {r['lost_records']} lost of {c['paced_events']:,}",
        f"reader: {r['read_mrecords_per_s']} M records/s into a DataFrame ({c['read_records']:,} records)",
    ]
    for l in lines:
        print(l)
