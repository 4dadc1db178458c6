"""Which CPU-limited cgroup each thread of a capture was in, so a throttled wait is named by its group.

The kernel records no event when a group is throttled, and none of its
scheduling events says a task's cgroup. Two sources do: the lab's looks at
the kernel's groups with a CPU limit after every probe step
(``Capture.cpu_limits``: each group's path, hierarchy, limit and the
threads in it then, ``host.cpulimit.snapshot``), and the capture's own
``cgroup_attach_task`` events (a task moved into a group during the run:
its path in which hierarchy). A thread is in a limited group when a look saw
it there, or when it was moved into one. A thread that never met
either (started inside a limited group after the last look and gone before
the next, never moved) stays unnamed: its throttled time is
``throttled: CPU limit``.
"""

from __future__ import annotations

import polars as pl

from loopscope.kernel import store as S
from loopscope.rundir import CpuLimit

ATTACH = "cgroup_attach_task"


def moves(st: S.Store) -> list[tuple[int, int, str]]:
    """Every move of a task into a cgroup in the capture, in time order: (tid, hierarchy, path)."""
    if ATTACH not in st.event_names or not st.files():
        return []
    code = st.event_names.index(ATTACH)
    # one scan of every segment (a segment written before a column existed has it as nulls)
    ev = (
        pl.scan_parquet(st.files(), missing_columns="insert", extra_columns="ignore")
        .filter(pl.col("event") == code)
        .select("t_ns", "target", "irq", "name")
        .collect()
        .drop_nulls(["target", "name"])
        .sort("t_ns")
    )
    table = st.strings
    return [(int(t), int(h if h is not None else 0), table[int(n)] if 0 <= int(n) < len(table) else "?") for _, t, h, n in ev.iter_rows()]


def _limited_at(limited: dict[tuple[int, str], CpuLimit], h: int, path: str) -> CpuLimit | None:
    """The group at ``path`` or the nearest one above it with a CPU limit."""
    p = path.rstrip("/") or "/"
    while True:
        if (h, p) in limited:
            return limited[(h, p)]
        if p == "/":
            return None
        p = p.rsplit("/", 1)[0] or "/"


def groups_of(limits: list[CpuLimit], st: S.Store | None) -> dict[int, str]:
    """Threads under a CPU limit → the limited group's path: a look that saw
    it there, or its latest move into a limited group (or below one)."""
    out: dict[int, str] = {}
    limited = {(g.hierarchy, g.path.rstrip("/") or "/"): g for g in limits}
    for g in limits:
        for t in g.tids:
            out[t] = g.path
    for tid, h, path in moves(st) if st is not None else []:
        into = _limited_at(limited, h, path)
        if into is not None:
            out[tid] = into.path
    return out
