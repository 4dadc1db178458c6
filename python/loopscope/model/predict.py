"""An app model carried from one node (or condition) to another.

The transform goes through a reference unit, as seeds/004 did: an app's
system time on node A is expressed in *reference calls* (its system time
divided by the cost (median batch), on A, of the calls it makes, weighted by how
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

from typing import Any

import numpy as np

ALIASES = {
    "openat": "open", "openat2": "open", "creat": "open", "newfstatat": "stat", "fstat": "stat", "lstat": "stat", "statx": "stat", "fstatat64": "stat",
    "unlinkat": "unlink", "linkat": "link", "pread64": "read", "readv": "read", "preadv": "read", "pwrite64": "write", "writev": "write",
    "pwritev": "write", "sendmsg": "sendto", "sendmmsg": "sendto", "send": "sendto", "recvmsg": "recvfrom", "recvmmsg": "recvfrom", "recv": "recvfrom",
    "getppid": "getpid", "gettid": "getpid", "clock_gettime": "clock_gettime", "mmap2": "mmap",
}


def _ratio(a: dict[str, Any], b: dict[str, Any]) -> tuple[float, float, float]:
    """b/a of two batch-mean costs, with a 95 % bootstrap CI."""
    from loopscope.model.node import ratio_ci

    return ratio_ci(a["batch_ns"], b["batch_ns"])


def sys_ratio(app: dict[str, Any], na: dict[str, Any], nb: dict[str, Any]) -> dict[str, Any]:
    """Node B's cost of the app's call mix over node A's."""
    states = (app.get("syscalls") or {}).get("states") or {}
    known = set(na["syscalls"]) & set(nb["syscalls"])
    weights: dict[str, float] = {}
    unmodelled = 0.0
    total = 0.0
    for name, st in states.items():
        n = float(st["per_run"])
        total += n
        m = name if name in known else ALIASES.get(name)
        if m in known:
            weights[m] = weights.get(m, 0.0) + n
        else:
            unmodelled += n
    if not weights:
        # no structure (or nothing that maps): every call the node measured, alike
        weights = {k: 1.0 for k in known}
    ca = sum(w * float(np.median(na["syscalls"][k]["batch_ns"])) for k, w in weights.items())
    cb = sum(w * float(np.median(nb["syscalls"][k]["batch_ns"])) for k, w in weights.items())
    # CI: resample each call's batch means together (a weighted sum of bootstraps)
    rng = np.random.default_rng(1)
    boot = np.zeros(400)
    boota = np.zeros(400)
    for k, w in weights.items():
        xa, xb = np.asarray(na["syscalls"][k]["batch_ns"]), np.asarray(nb["syscalls"][k]["batch_ns"])
        boota += w * np.median(xa[rng.integers(0, len(xa), (400, len(xa)))], axis=1)
        boot += w * np.median(xb[rng.integers(0, len(xb), (400, len(xb)))], axis=1)
    r = boot / boota
    return {"ratio": cb / ca, "ci95": [float(np.percentile(r, 2.5)), float(np.percentile(r, 97.5))], "calls_used": sorted(weights),
            "unmodelled_share": unmodelled / total if total else None}


def predict(app: dict[str, Any], na: dict[str, Any], nb: dict[str, Any]) -> dict[str, Any]:
    env = app["environment"]
    r_user, lo_u, hi_u = _ratio(na["environments"][env], nb["environments"][env])
    rs = sys_ratio(app, na, nb)
    u = np.asarray(app["runs"]["user_ns"], dtype=float)
    s = np.asarray(app["runs"]["sys_ns"], dtype=float)
    pred = u * r_user + s * rs["ratio"]
    lo = u * lo_u + s * rs["ci95"][0]
    hi = u * hi_u + s * rs["ci95"][1]
    se = 1.96 * float(pred.std(ddof=1)) / np.sqrt(len(pred)) if len(pred) > 1 else 0.0
    user_share = float(u.sum() / (u.sum() + s.sum())) if (u.sum() + s.sum()) else 0.0
    return {
        "environment": env, "user_ratio": {"ratio": r_user, "ci95": [lo_u, hi_u]}, "sys_ratio": rs, "user_share": user_share,
        "from_mean_ns": float((u + s).mean()),
        # the ratios' uncertainty and the app's own sampling error of the mean
        "pred_mean_ns": float(pred.mean()), "pred_mean_ci95_ns": [float(lo.mean() - se), float(hi.mean() + se)],
        "pred_p95_ns": float(np.percentile(pred, 95)), "pred_p99_ns": float(np.percentile(pred, 99)),
        "runs": len(pred),
        "limits": [
            "user time is scaled by the environment's calibration loop: a load that slows this program's own code differently (another cache footprint or memory traffic) is not seen",
            "only CPU time is predicted: time blocked on I/O or the network is not",
            "page faults and interrupts charged as system time are scaled like the program's system calls",
        ],
    }
