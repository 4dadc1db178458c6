"""An app model carried from one node (or condition) to another.

The transform goes through a reference unit, as Carlinet et al. 2000 did: an app's
system time on node A is expressed in *reference calls* (its system time
divided by the typical batch's cost (``node.typical``), on A, of the calls it makes, weighted by how
often it makes each), its user time in *reference operations* of its
execution environment (user time divided by A's cost of one operation);
on node B both are multiplied back by B's costs. Each measured run is
carried over, so the prediction is a distribution (mean, p95, p99), and
the ratios used are given with their 95 % CIs (bootstrap of the node
models' batch means).

System calls the node model does not measure are mapped to the one that
does the same work (openat → open, pread64 → read, sendmsg → sendto, …);
calls with no counterpart take the weighted ratio of those that have one,
and their share is stated (``unmodelled_share``). What the model cannot
see is said with the prediction: a load that slows user code differently
from the environment's calibration loop (other cache footprints, other
memory traffic), time the program spends blocked (not CPU time), page
faults and interrupts charged as system time.
"""

from __future__ import annotations

from typing_extensions import TypedDict

import numpy as np

from loopscope.model.app import AppModel
from loopscope.model.node import Condition, Cost
from loopscope.model.node import ratio_ci
from loopscope.model.node import boot_typical, cost_curve, typical

ALIASES = {
    "openat": "open",
    "openat2": "open",
    "creat": "open",
    "newfstatat": "stat",
    "fstat": "stat",
    "lstat": "stat",
    "statx": "stat",
    "fstatat64": "stat",
    "unlinkat": "unlink",
    "linkat": "link",
    "pread64": "read",
    "readv": "read",
    "preadv": "read",
    "pwrite64": "write",
    "writev": "write",
    "pwritev": "write",
    "sendmsg": "sendto",
    "sendmmsg": "sendto",
    "send": "sendto",
    "recvmsg": "recvfrom",
    "recvmmsg": "recvfrom",
    "recv": "recvfrom",
    "getppid": "getpid",
    "gettid": "getpid",
    "clock_gettime": "clock_gettime",
    "mmap2": "mmap",
}


class SysRatio(TypedDict):
    """Node B's system time for the app over node A's, with how it was priced."""

    ratio: float
    ci95: list[float]
    calls_used: list[str]
    unmodelled_share: float | None
    priced_by_size_share: float | None
    calls_share: float
    fixed_share_of_calls: float
    argument_share_of_calls: float
    fixed_ratio: float
    memory_ratio: float


class Ratio(TypedDict):
    ratio: float
    ci95: list[float]


class Prediction(TypedDict):
    """An app's CPU time per run on node B, from its runs on node A (ns)."""

    environment: str
    user_ratio: Ratio
    sys_ratio: SysRatio
    user_share: float
    from_mean_ns: float
    pred_mean_ns: float
    pred_mean_ci95_ns: list[float]
    pred_p95_ns: float
    pred_p99_ns: float
    runs: int
    limits: list[str]


#: the nodes and conditions a prediction is between, as ``model predict --json`` names them
Ends = TypedDict("Ends", {"from": str, "to": str})


class PredictJson(Ends, Prediction):
    """What ``loopscope model predict --json`` prints: the prediction between the two nodes."""


class CheckJson(PredictJson):
    """What ``loopscope model check --json`` prints: the prediction, what was measured here now, and the error."""

    meas_mean_ns: float
    meas_p95_ns: float
    meas_p99_ns: float
    err_mean_pct: float
    err_p99_pct: float


def _ratio(a: Cost, b: Cost) -> tuple[float, float, float]:
    """b/a of two batch-mean costs, with a 95 % bootstrap CI."""

    return ratio_ci(a, b)


def _val(entry: Cost, k: int | None, rng: np.random.Generator) -> np.ndarray:
    """An entry's typical cost, or ``k`` bootstrap draws of it."""
    return np.asarray([typical(entry.batch_ns)]) if k is None else boot_typical(entry, k, rng)


def _cost(node: dict[str, Cost], m: str, classes: list[list[float]] | None, k: int | None, rng: np.random.Generator) -> np.ndarray:
    """The node's cost of call ``m`` at the app's size classes (piecewise-linear between the node's sizes)."""
    if not classes:
        return _val(node[m], k, rng)
    pts = cost_curve(node, m)
    zs = np.asarray([z for z, _ in pts])
    ys = [_val(node[key], k, rng) for _, key in pts]
    total = 0.0
    for size, frac in classes:
        i = int(np.clip(np.searchsorted(zs, size) - 1, 0, len(zs) - 2))
        w = max(0.0, (size - zs[i]) / (zs[i + 1] - zs[i]))  # below the first point: its cost; beyond the last: the last slope
        total = total + frac * (ys[i] + w * (ys[i + 1] - ys[i]))
    return np.asarray(total)


def sys_ratio(app: AppModel, na: Condition, nb: Condition, resamples: int = 400) -> SysRatio:
    """Node B's system time for the app over node A's.

    A call's cost is the node's cost of that call at the sizes the app's
    calls moved (the node's cost-by-size curve, read piecewise-linearly at
    each size class of the app's calls; the minimal call for calls that
    move no data or a node without sizes) plus the rest of the work its
    arguments ask for (a longer path, page-cache misses): the app's traced
    mean on-CPU duration of the call beyond the node's cost. The first part
    scales with the node's cost of that call, the rest like memory-bound
    work (the compiled environment's ratio). Calls the node model lacks
    scale like the modelled calls' fixed parts; system time outside any
    traced call (exec, page faults) like memory-bound work."""

    states = app.syscalls.states
    known = set(na.syscalls) & set(nb.syscalls)
    sa = {k: v for k, v in na.syscalls.items() if k in known}
    sb = {k: v for k, v in nb.syscalls.items() if k in known}
    rows: list[tuple[str, float, float | None, list[list[float]] | None]] = []  # node call, calls per run, traced mean ns, size classes
    priced_by_size = 0.0
    un_n, un_t, total = 0.0, 0.0, 0.0
    for name, st in states.items():
        n = st.per_run
        total += n
        m = name if name in known else ALIASES.get(name)
        # a call's CPU time: its mean on-CPU duration (the tracer took off
        # the time it was switched out)
        d = st.dur_mean_ns
        if m is not None and m in known:
            classes = st.bytes_classes if len(cost_curve(sa, m)) > 1 else None
            priced_by_size += n if classes else 0.0
            rows.append((m, n, float(d) if d is not None else None, classes))
        else:
            un_n += n
            un_t += n * float(d or 0.0)
    structured = bool(rows)
    if not rows:
        # no structure (or nothing that maps): every call the node measured, alike, no argument work
        rows = [(k, 1.0, None, None) for k in sorted(known) if ":" not in k]
    sys_mean = float(np.mean(app.runs.sys_ns)) if app.runs.sys_ns else 0.0
    rng = np.random.default_rng(1)

    def estimate(boot: bool) -> tuple[np.ndarray, dict[str, float]]:
        k = resamples if boot else 1
        draws = k if boot else None
        r_mem = _val(nb.environments["compiled"], draws, rng) / _val(na.environments["compiled"], draws, rng)
        fa = np.zeros(k)
        fb = np.zeros(k)
        extra = np.zeros(k)
        for m, n, d, classes in rows:
            ca, cb = _cost(sa, m, classes, draws, rng), _cost(sb, m, classes, draws, rng)
            fa += n * ca
            fb += n * cb
            if d is not None:
                extra += n * np.maximum(0.0, d - ca)
        traced = fa + extra + un_t
        calls_share = np.minimum(1.0, traced / sys_mean) if sys_mean > 0 and structured else np.ones(k)
        fixed_r = fb / fa
        calls_b = fb + extra * r_mem + un_t * fixed_r
        ratio = calls_share * calls_b / traced + (1 - calls_share) * r_mem
        parts = {
            "calls_share": float(np.mean(calls_share)),
            "fixed_share_of_calls": float(np.mean(fa / traced)),
            "argument_share_of_calls": float(np.mean(extra / traced)),
            "fixed_ratio": float(np.mean(fixed_r)),
            "memory_ratio": float(np.mean(r_mem)),
        }
        return ratio, parts

    point, parts = estimate(False)
    boot, _ = estimate(True)
    return {
        "ratio": float(point[0]),
        "ci95": [float(np.percentile(boot, 2.5)), float(np.percentile(boot, 97.5))],
        "calls_used": sorted({m for m, *_ in rows}),
        "unmodelled_share": un_n / total if total else None,
        "priced_by_size_share": priced_by_size / total if total else None,
        "calls_share": parts["calls_share"],
        "fixed_share_of_calls": parts["fixed_share_of_calls"],
        "argument_share_of_calls": parts["argument_share_of_calls"],
        "fixed_ratio": parts["fixed_ratio"],
        "memory_ratio": parts["memory_ratio"],
    }


def predict(app: AppModel, na: Condition, nb: Condition) -> Prediction:
    env = app.environment
    r_user, lo_u, hi_u = _ratio(na.environments[env], nb.environments[env])
    rs = sys_ratio(app, na, nb)
    u = np.asarray(app.runs.user_ns, dtype=float)
    s = np.asarray(app.runs.sys_ns, dtype=float)
    pred = u * r_user + s * rs["ratio"]
    lo = u * lo_u + s * rs["ci95"][0]
    hi = u * hi_u + s * rs["ci95"][1]
    se = 1.96 * float(pred.std(ddof=1)) / np.sqrt(len(pred)) if len(pred) > 1 else 0.0
    user_share = float(u.sum() / (u.sum() + s.sum())) if (u.sum() + s.sum()) else 0.0
    return {
        "environment": env,
        "user_ratio": {"ratio": r_user, "ci95": [lo_u, hi_u]},
        "sys_ratio": rs,
        "user_share": user_share,
        "from_mean_ns": float((u + s).mean()),
        # the ratios' uncertainty and the app's own sampling error of the mean
        "pred_mean_ns": float(pred.mean()),
        "pred_mean_ci95_ns": [float(lo.mean() - se), float(hi.mean() + se)],
        "pred_p95_ns": float(np.percentile(pred, 95)),
        "pred_p99_ns": float(np.percentile(pred, 99)),
        "runs": len(pred),
        "limits": [
            "user time is scaled by the environment's calibration loop: a load that slows this program's own code differently (another cache footprint or memory traffic) is not seen",
            "only CPU time is predicted: time blocked on I/O or the network is not",
            "page faults and interrupts charged as system time are scaled like the program's system calls",
        ],
    }
