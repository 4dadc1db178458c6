"""A kernel capture as a table: one row per event, on the kernel's CLOCK_MONOTONIC.

``perf script --ns`` turns the capture into text; each line is split with
polars string expressions (no per-line Python): the task (comm, pid, tid),
the CPU, the time in ns, the event and its fields. Per event the fields that
attribution needs get columns of their own:

==================  ===========================================================
sched_switch        prev_pid, prev_comm, prev_state, next_pid, next_comm, prio
sched_wakeup(ing)   target pid and comm, target_cpu
sched_migrate_task  target pid, orig_cpu, dest_cpu
sched_stat_runtime  target pid and comm, runtime (ns it ran up to this event)
irq_handler_*       irq, name (entry)
softirq_*           vec, name (the action: NET_RX, TIMER, RCU…)
*_entry/_exit       interrupt vectors (local timer, IPIs)
page_fault_user     (the faulting task is the row's task)
hrtimer_expire_*    function (entry)
==================  ===========================================================

Lost events (perf's count of samples it could not take) are returned with
the table; the windows they fall in are unknown, so any attribution over the
capture is marked incomplete when they are not zero.
"""

from __future__ import annotations

import re
import subprocess
from pathlib import Path
from typing import Any

import polars as pl

LINE = r"^\s*(?P<comm>.*?)\s+(?P<pid>\d+)/(?P<tid>\d+)\s+\[(?P<cpu>\d+)\]\s+(?P<sec>\d+)\.(?P<ns>\d{9}):\s+(?P<event>[\w]+:[\w]+):\s?(?P<args>.*)$"

SCHEMA = {
    "t_ns": pl.Int64, "cpu": pl.Int32, "pid": pl.Int32, "tid": pl.Int32, "comm": pl.String, "event": pl.String,
    "target": pl.Int32, "target_comm": pl.String, "next_pid": pl.Int32, "next_comm": pl.String, "prev_state": pl.String,
    "irq": pl.Int32, "name": pl.String, "dest_cpu": pl.Int32, "runtime": pl.Int64,
}


class KernelReadError(Exception):
    pass


def script(data: Path) -> tuple[pl.Series, int]:
    """The capture as perf's text lines (read by polars from a file, not
    through Python strings: a long run has millions), and the number of
    events perf says were lost."""
    txt = data.with_suffix(".txt")
    try:
        with open(txt, "wb") as out:
            r = subprocess.run(["perf", "script", "--ns", "-F", "comm,pid,tid,cpu,time,event,trace", "--show-lost-events", "-i", str(data)], stdout=out, stderr=subprocess.PIPE)
        if r.returncode != 0:
            raise KernelReadError(f"perf script {data}: {r.stderr.decode(errors='replace').strip()[-300:]}")
        if txt.stat().st_size == 0:
            return pl.Series("line", [], dtype=pl.String), 0
        lines = pl.read_csv(txt, has_header=False, separator="\x1f", quote_char=None, new_columns=["line"], schema={"line": pl.String}, truncate_ragged_lines=True)["line"]
    finally:
        txt.unlink(missing_ok=True)
    lost_lines = lines.filter(lines.str.contains("LOST ", literal=True))
    lost = sum(int(m) for x in lost_lines.to_list() for m in re.findall(r"LOST (\d+) events", x))
    return lines, lost


def parse(text: str | pl.Series) -> pl.DataFrame:
    lines = pl.Series("line", text.splitlines(), dtype=pl.String) if isinstance(text, str) else text
    df = lines.str.extract_groups(LINE).struct.unnest().drop_nulls("event")
    if not len(df):
        return pl.DataFrame(schema=SCHEMA)
    df = df.with_columns(
        (pl.col("sec").cast(pl.Int64) * 1_000_000_000 + pl.col("ns").cast(pl.Int64)).alias("t_ns"),
        pl.col("cpu").cast(pl.Int32), pl.col("pid").cast(pl.Int32), pl.col("tid").cast(pl.Int32),
        pl.col("event").str.split(":").list.get(1).alias("event"),
    )
    a = pl.col("args")
    ev = pl.col("event")
    sw = a.str.extract_groups(r"prev_comm=(?P<pc>.*?) prev_pid=(?P<pp>\d+) prev_prio=(?P<ppr>-?\d+) prev_state=(?P<ps>\S+) ==> next_comm=(?P<nc>.*?) next_pid=(?P<np>\d+) next_prio=(?P<npr>-?\d+)")
    wk = a.str.extract_groups(r"comm=(?P<wc>.*?) pid=(?P<wp>\d+) prio=(?P<wpr>-?\d+)(?: target_cpu=(?P<wt>\d+))?(?: orig_cpu=(?P<oc>\d+) dest_cpu=(?P<dc>\d+))?")
    df = df.with_columns(sw.alias("_sw"), wk.alias("_wk"))
    df = df.with_columns(
        pl.when(ev == "sched_switch").then(pl.col("_sw").struct.field("np").cast(pl.Int32)).alias("next_pid"),
        pl.when(ev == "sched_switch").then(pl.col("_sw").struct.field("nc")).alias("next_comm"),
        pl.when(ev == "sched_switch").then(pl.col("_sw").struct.field("ps")).alias("prev_state"),
        pl.when(ev == "sched_switch").then(pl.col("_sw").struct.field("pp").cast(pl.Int32))
        .when(ev.is_in(["sched_wakeup", "sched_waking", "sched_migrate_task"])).then(pl.col("_wk").struct.field("wp").cast(pl.Int32))
        .when(ev == "sched_stat_runtime").then(a.str.extract(r"pid=(\d+) runtime=").cast(pl.Int32))
        .alias("target"),
        pl.when(ev == "sched_switch").then(pl.col("_sw").struct.field("pc"))
        .when(ev.is_in(["sched_wakeup", "sched_waking", "sched_migrate_task"])).then(pl.col("_wk").struct.field("wc"))
        .when(ev == "sched_stat_runtime").then(a.str.extract(r"comm=(.*?) pid=\d+ runtime="))
        .alias("target_comm"),
        pl.when(ev == "sched_stat_runtime").then(a.str.extract(r"runtime=(\d+)").cast(pl.Int64)).alias("runtime"),
        pl.when(ev == "sched_migrate_task").then(pl.col("_wk").struct.field("dc").cast(pl.Int32))
        .when(ev.is_in(["sched_wakeup", "sched_waking"])).then(pl.col("_wk").struct.field("wt").cast(pl.Int32))
        .alias("dest_cpu"),
        pl.when(ev.str.starts_with("irq_handler")).then(a.str.extract(r"irq=(\d+)").cast(pl.Int32)).alias("irq"),
        pl.when(ev == "irq_handler_entry").then(a.str.extract(r"name=(\S+)"))
        .when(ev.str.starts_with("softirq")).then(a.str.extract(r"action=(\w+)"))
        .when(ev == "hrtimer_expire_entry").then(a.str.extract(r"function=(\S+)"))
        .when(ev == "napi_poll").then(a.str.extract(r"dev=(\S+)"))
        .when(ev == "netif_receive_skb").then(a.str.extract(r"dev=(\S+)"))
        .alias("name"),
    )
    return df.select(list(SCHEMA)).cast(SCHEMA).sort("t_ns", maintain_order=True)  # type: ignore[arg-type]


def read(data: Path) -> tuple[pl.DataFrame, int]:
    text, lost = script(data)
    return parse(text), lost


def summary(df: pl.DataFrame, lost: int) -> dict[str, Any]:
    counts = df.group_by("event").len().sort("len", descending=True)
    return {
        "events": len(df),
        "lost_events": lost,
        "by_event": {r["event"]: r["len"] for r in counts.iter_rows(named=True)},
        "t_first_ns": int(df["t_ns"].min()) if len(df) else None,  # type: ignore[arg-type]
        "t_last_ns": int(df["t_ns"].max()) if len(df) else None,  # type: ignore[arg-type]
    }
