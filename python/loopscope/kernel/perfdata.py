"""Captures recorded by ``perf record`` (runs made before the tracefs capture), as a table.

Runs recorded before loopscope read the kernel's buffers itself kept a
``kernel.perf`` file; ``explain`` still opens them through this module.
One row per event, on the kernel's CLOCK_MONOTONIC.

``perf script --ns`` turns the capture into text; each line is split with
polars string expressions (no per-line Python): the task (comm, pid, tid),
the CPU, the time in ns, the event and its fields. Per event the fields that
attribution needs get columns of their own:

==================  ===========================================================
sched_switch        prev_pid, prev_comm, prev_state, next_pid, next_comm, prev_prio, next_prio
sched_wakeup(ing)   target pid and comm, target_cpu, prio
sched_migrate_task  target pid, orig_cpu, dest_cpu
sched_stat_runtime  target pid and comm, runtime (ns it ran up to this event)
irq_handler_*       irq, name (entry)
softirq_*           vec, name (the action: NET_RX, TIMER, RCU…)
*_entry/_exit       interrupt vectors (local timer, IPIs)
page_fault_user     (the faulting task is the row's task)
hrtimer_expire_*    function (entry)
==================  ===========================================================

Lost events: perf writes a LOST record into a CPU's buffer when that
buffer overflowed, stamped when writing resumed; the events it stands for
happened on that CPU after the last event that did reach the buffer. Each
becomes a window (``lost_windows``: cpu, start, end, events), so an
attribution is marked incomplete only when its window overlaps one. When
perf only says "lost N chunks" (no record to place), the place is unknown
and every attribution over the capture is incomplete.
"""

from __future__ import annotations

import re
import subprocess
from pathlib import Path
from typing import NamedTuple

from typing_extensions import TypedDict

import polars as pl

from loopscope.errors import InputError

LINE = r"^\s*(?P<tid>\d+)\s+\[(?P<cpu>\d+)\]\s+(?P<sec>\d+)\.(?P<ns>\d{9}):\s+(?P<event>\w+:\w+):\s?(?P<args>.*)$"
FIELDS = "tid,cpu,time,event,trace"

SCHEMA = {
    "t_ns": pl.Int64,
    "cpu": pl.Int32,
    "pid": pl.Int32,
    "tid": pl.Int32,
    "comm": pl.String,
    "event": pl.String,
    "target": pl.Int32,
    "target_comm": pl.String,
    "next_pid": pl.Int32,
    "next_comm": pl.String,
    "prev_state": pl.String,
    "irq": pl.Int32,
    "name": pl.String,
    "dest_cpu": pl.Int32,
    "runtime": pl.Int64,
    "expires": pl.Int64,
    "softexpires": pl.Int64,
    "prio": pl.Int32,
    "next_prio": pl.Int32,
}


class KernelReadError(InputError):
    """A run's perf.data that ``perf script`` cannot read."""


def _ncpus(data: Path) -> int:
    r = subprocess.run(["perf", "report", "--header-only", "-i", str(data)], capture_output=True, text=True)
    m = re.search(r"nrcpus avail\s*:\s*(\d+)", r.stdout)
    return int(m.group(1)) if m else 1


class Capture(NamedTuple):
    events: pl.DataFrame
    lost: int  # events perf says were lost
    lost_windows: pl.DataFrame  # cpu, start_ns, end_ns, events; events not placed in any window make ``placed`` False
    placed: bool


LOST_SCHEMA = {"cpu": pl.Int32, "start_ns": pl.Int64, "end_ns": pl.Int64, "events": pl.Int64}
STAMP = r"^\s*\d+\s+\[(\d+)\]\s+(\d+)\.(\d{9}):"


def lost_windows(lines: pl.Series) -> pl.DataFrame:
    """Where each LOST record's events went missing: on its CPU, after the
    previous event that CPU recorded and before the record's own stamp.
    ``lines`` are perf script's lines, each CPU's in time order."""
    if not lines.str.contains("PERF_RECORD_LOST", literal=True).any():
        return pl.DataFrame(schema=LOST_SCHEMA)
    df = (
        pl.DataFrame({"line": lines})
        .with_columns(
            pl.col("line").str.extract(STAMP, 1).cast(pl.Int32).alias("cpu"),
            (pl.col("line").str.extract(STAMP, 2).cast(pl.Int64) * 1_000_000_000 + pl.col("line").str.extract(STAMP, 3).cast(pl.Int64)).alias("t"),
            pl.col("line").str.extract(r"PERF_RECORD_LOST lost (\d+)", 1).cast(pl.Int64).alias("n"),
        )
        .drop_nulls("cpu")
    )
    if not len(df) or df["n"].null_count() == len(df):
        return pl.DataFrame(schema=LOST_SCHEMA)
    # the previous stamp on the same CPU that is not itself a LOST record
    df = df.with_columns(pl.when(pl.col("n").is_null()).then(pl.col("t")).alias("ev_t"))
    df = df.with_columns(pl.col("ev_t").forward_fill().shift(1).over("cpu").alias("prev"))
    w = df.filter(pl.col("n").is_not_null())
    return w.select("cpu", pl.coalesce("prev", "t").alias("start_ns"), pl.col("t").alias("end_ns"), pl.col("n").alias("events")).cast(LOST_SCHEMA)  # type: ignore[arg-type]


def script(data: Path) -> tuple[pl.Series, int]:
    """The capture as perf's text lines, one ``perf script`` per CPU in
    parallel, each written to a file that polars reads (a long run has
    millions of lines: they never become Python strings), and the number
    of events perf says were lost."""
    n = _ncpus(data)
    files = [data.with_suffix(f".cpu{c}.txt") for c in range(n)]
    try:
        procs = []
        for c, f in enumerate(files):
            out = open(f, "wb")
            procs.append(
                (
                    subprocess.Popen(
                        ["perf", "script", "--ns", "-F", FIELDS, "--show-lost-events", "--cpu", str(c), "-i", str(data)], stdout=out, stderr=subprocess.PIPE
                    ),
                    out,
                )
            )
        errs = []
        chunks = 0
        for p, out in procs:
            _, err = p.communicate()
            out.close()
            text = err.decode(errors="replace")
            # perf's own warning when the kernel dropped records: "... lost N chunks!"
            chunks += sum(int(m) for m in re.findall(r"lost (\d+) chunks", text))
            if p.returncode != 0:
                errs.append(text.strip()[-300:])
        if errs:
            raise KernelReadError(f"perf script {data}: {errs[0]}")
        parts = [
            pl.read_csv(f, has_header=False, separator="\x1f", quote_char=None, new_columns=["line"], schema={"line": pl.String}, truncate_ragged_lines=True)[
                "line"
            ]
            for f in files
            if f.stat().st_size
        ]
    finally:
        for f in files:
            f.unlink(missing_ok=True)
    lines = pl.concat(parts) if parts else pl.Series("line", [], dtype=pl.String)
    lost_lines = lines.filter(lines.str.contains("LOST", literal=True))
    lost = sum(int(m) for x in lost_lines.to_list() for m in re.findall(r"LOST (\d+) events|lost:? (\d+)", x) for m in m if m)
    # If perf only says how many chunks were lost (each is one or more events),
    # count at least one event per chunk: never report a lossy capture as whole.
    return lines, max(lost, chunks)


def parse(text: str | pl.Series) -> pl.DataFrame:
    lines = pl.Series("line", text.splitlines(), dtype=pl.String) if isinstance(text, str) else text
    df = lines.str.extract_groups(LINE).struct.unnest().drop_nulls("event")
    if not len(df):
        return pl.DataFrame(schema=SCHEMA)
    df = df.with_columns(
        (pl.col("sec").cast(pl.Int64) * 1_000_000_000 + pl.col("ns").cast(pl.Int64)).alias("t_ns"),
        pl.col("cpu").cast(pl.Int32),
        pl.col("tid").cast(pl.Int32),
        pl.col("event").str.split(":").list.get(1).alias("event"),
    ).drop("sec", "ns")
    a = pl.col("args")
    parts = []
    # Each event's fields by its own pattern, on its own rows only.
    sw = df.filter(pl.col("event") == "sched_switch")
    if len(sw):
        g = (
            sw["args"]
            .str.extract_groups(
                r"prev_comm=(?P<target_comm>.*?) prev_pid=(?P<target>\d+) prev_prio=(?P<prio>-?\d+) prev_state=(?P<prev_state>\S+) ==> next_comm=(?P<next_comm>.*?) next_pid=(?P<next_pid>\d+) next_prio=(?P<next_prio>-?\d+)"
            )
            .struct.unnest()
        )
        parts.append(pl.concat([sw, g], how="horizontal"))
    wk = df.filter(pl.col("event").is_in(["sched_wakeup", "sched_waking", "sched_migrate_task"]))
    if len(wk):
        g = (
            wk["args"]
            .str.extract_groups(
                r"comm=(?P<target_comm>.*?) pid=(?P<target>\d+) prio=(?P<prio>-?\d+)(?: target_cpu=(?P<wt>\d+))?(?: orig_cpu=\d+ dest_cpu=(?P<dc>\d+))?"
            )
            .struct.unnest()
        )
        g = g.with_columns(pl.coalesce("dc", "wt").alias("dest_cpu")).drop("dc", "wt")
        parts.append(pl.concat([wk, g], how="horizontal"))
    rt = df.filter(pl.col("event") == "sched_stat_runtime")
    if len(rt):
        g = rt["args"].str.extract_groups(r"comm=(?P<target_comm>.*?) pid=(?P<target>\d+) runtime=(?P<runtime>\d+)").struct.unnest()
        parts.append(pl.concat([rt, g], how="horizontal"))
    other = df.filter(~pl.col("event").is_in(["sched_switch", "sched_wakeup", "sched_waking", "sched_migrate_task", "sched_stat_runtime"]))
    if len(other):
        ev = pl.col("event")
        parts.append(
            other.with_columns(
                pl.when(ev.str.starts_with("irq_handler")).then(a.str.extract(r"irq=(\d+)")).alias("irq"),
                pl.when(ev == "irq_handler_entry")
                .then(a.str.extract(r"name=(\S+)"))
                .when(ev.str.starts_with("softirq"))
                .then(a.str.extract(r"action=(\w+)"))
                .when(ev == "hrtimer_expire_entry")
                .then(a.str.extract(r"function=(\S+)"))
                .when(ev.is_in(["napi_poll", "netif_receive_skb"]))
                .then(a.str.extract(r"dev=(\S+)"))
                .alias("name"),
            )
        )
    out = pl.concat(parts, how="diagonal_relaxed")
    for c, dt in SCHEMA.items():
        if c not in out.columns:
            out = out.with_columns(pl.lit(None, dtype=dt).alias(c))
    # the task current at the event: the thread id (perf's pid column is the same for threads)
    out = out.with_columns(pl.col("tid").alias("pid"), pl.lit(None, dtype=pl.String).alias("comm"))
    return out.select(list(SCHEMA)).cast(SCHEMA).sort("t_ns", maintain_order=True)  # type: ignore[arg-type]


def read(data: Path) -> Capture:
    text, lost = script(data)
    win = lost_windows(text)
    return Capture(parse(text), lost, win, int(win["events"].sum()) >= lost)


class Summary(TypedDict):
    """A perf.data capture's counts: events (by event), lost, first and last time."""

    events: int
    lost_events: int
    by_event: dict[str, int]
    t_first_ns: int | None
    t_last_ns: int | None


def summary(df: pl.DataFrame, lost: int) -> Summary:
    counts = df.group_by("event").len().sort("len", descending=True)
    return {
        "events": len(df),
        "lost_events": lost,
        "by_event": {r["event"]: r["len"] for r in counts.iter_rows(named=True)},
        "t_first_ns": int(df["t_ns"].min()) if len(df) else None,  # type: ignore[arg-type]
        "t_last_ns": int(df["t_ns"].max()) if len(df) else None,  # type: ignore[arg-type]
    }
