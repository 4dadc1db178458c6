"""Slowed with no kernel event: a span's own run time beyond the same work's
run time in the phase it is compared with.

A thread can run the whole of an outlier and still be late: its work took
longer because something no kernel event shows took what it needed (the
memory bandwidth, the shared cache, an SMT sibling's half of the core, the
hypervisor's time). The native split calls that time ``running``. For a
span (an interval of the program's own, ``span`` True) in a phase compared
with another (``compare_with``, else the baseline phase), the running time
beyond the median length of the same span in that reference phase is
``slowed: no kernel event`` (osnoise's "hardware noise", applied to any
thread's own work). The reference phase keeps its running time as it is: a
phase is not slowed against itself, and its spread is the program's own.
Nor is a phase whose median span is less than ``SHIFT`` times the
reference's: its long spans are that same spread, not a slower machine.
The measure assumes the span does the same work every time; a span whose
work varies is not slowed, it is busier, and the report says what the
reference was so a reader can tell. The candidates it cannot tell apart
are named from the machine: memory bandwidth, the shared cache and memory
another CPU writes (false sharing: each read takes the line back) always,
an SMT sibling where the CPU has one, the hypervisor where the kernel
counts steal time (``/proc/stat``).
"""

from __future__ import annotations

from pathlib import Path

import polars as pl

from loopscope.analysis.phases import baseline_of

LABEL = "slowed: no kernel event"
#: how much longer a phase's median span must be than its reference's before its spans can be slowed
SHIFT = 1.10


def references(wins: pl.DataFrame, phases: list[str], against: dict[str, str]) -> pl.DataFrame:
    """Per probe and phase that has a reference: the median length of the
    same probe's spans in the phase it is compared with (columns probe,
    phase, ref_phase, ref_ns)."""
    empty = pl.DataFrame(schema={"probe": pl.String, "phase": pl.String, "ref_phase": pl.String, "ref_ns": pl.Int64})
    if not phases or not len(wins):
        return empty
    base = baseline_of(phases)
    ref_of = {p: against.get(p, base) for p in phases if against.get(p, base) != p}
    if not ref_of:
        return empty
    med = (
        wins.lazy()
        .filter(pl.col("span"))
        .group_by(pl.col("probe").cast(pl.String), pl.col("phase").cast(pl.String))
        .agg(pl.col("latency_ns").median().cast(pl.Int64).alias("ref_ns"))
        .collect()
    )
    pairs = pl.DataFrame({"phase": list(ref_of), "ref_phase": list(ref_of.values())})
    out = pairs.join(med.rename({"phase": "ref_phase"}), on="ref_phase").join(med.rename({"ref_ns": "own_ns"}), on=["probe", "phase"])
    # the body of the phase moved, not only its tail: else its long spans are the program's own spread
    return out.filter(pl.col("own_ns") >= SHIFT * pl.col("ref_ns")).select("probe", "phase", "ref_phase", "ref_ns")


def split(att: pl.DataFrame, outl: pl.DataFrame, refs: pl.DataFrame) -> pl.DataFrame:
    """``att`` (the native split's rows: id, cause, ns, …) with each span
    outlier's ``running`` beyond its reference moved to ``LABEL``; ``outl``
    gives each outlier's id, probe, phase and span."""
    if not len(refs) or not len(att) or "running" not in set(att["cause"].unique().to_list()):
        return att
    keys = outl.filter(pl.col("span")).select("id", pl.col("probe").cast(pl.String), pl.col("phase").cast(pl.String)).join(refs, on=["probe", "phase"])
    run = att.filter(pl.col("cause") == "running").join(keys.select("id", "ref_ns"), on="id")
    if not len(run):
        return att
    run = run.with_columns((pl.col("ns") - pl.col("ref_ns")).clip(lower_bound=0).alias("extra"))
    kept = run.with_columns(pl.col("ns") - pl.col("extra")).select(att.columns)
    slow = run.filter(pl.col("extra") > 0).with_columns(pl.lit(LABEL).alias("cause"), pl.col("extra").alias("ns")).select(att.columns)
    rest = att.join(run.select("id", "cause"), on=["id", "cause"], how="anti")
    return pl.concat([rest, kept.filter(pl.col("ns") > 0), slow]).sort("id", maintain_order=True)


def candidates(cpus: list[int]) -> list[str]:
    """What can slow a thread with no kernel event on this machine, for the probe's CPUs."""
    out = ["memory bandwidth", "shared cache", "memory another CPU writes (false sharing)"]
    for c in cpus:
        sib = Path(f"/sys/devices/system/cpu/cpu{c}/topology/thread_siblings_list")
        try:
            if "," in sib.read_text() or "-" in sib.read_text():
                out.append("SMT sibling")
                break
        except OSError:
            pass
    try:
        head = Path("/proc/stat").read_text().split("\n", 1)[0].split()
        if len(head) > 8 and int(head[8]) > 0:
            out.append("hypervisor (steal time)")
        elif "hypervisor" in Path("/proc/cpuinfo").read_text():
            out.append("hypervisor (a VM that counts no steal time)")
    except (OSError, ValueError):
        pass
    return out
