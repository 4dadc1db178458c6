"""Offset and drift of one clock against the reference, from causality alone.

A probe sent by host h at h-time ``tx_h`` and stamped on arrival at the
reference at ref-time ``rx_ref`` says that the offset θ = C_h − C_ref at that
moment is at least ``tx_h − rx_ref`` (the probe cannot arrive before it
left); an answer sent at ``tx_ref`` and received at ``rx_h`` says θ is at most
``rx_h − tx_ref``. Within a window where the two clocks keep a constant
frequency ratio θ is a line, θ(t) = b + a·(t − t_c), and every probe is a
half-plane on (a, b): the lines consistent with all probes form a convex
polygon (linear programming, as in the convex-hull methods of the clock-sync
literature). Only the upper convex hull of the lower bounds and the lower
hull of the upper bounds can touch it, so the rest are dropped first.

- The **estimate** is the line that clears both sets of bounds by the widest
  margin (a concave one-dimensional search over the slope); it sits in the middle of the
  corridor the fastest probes leave.
- The **error bound** at time t is how far any other consistent line can be
  from it there: max over the polygon's vertices of |line(t) − estimate(t)|.
  It holds whenever causality holds and θ is linear within the window; no
  distribution of delays is assumed.
- **Drift changes and steps**: when no line satisfies every bound (margin
  below zero) the window is split in two, down to ``min_window_s``; a
  window that is still inconsistent at that length is reported (a clock
  step, or stamps that broke causality) and gets no estimate.

Times are CLOCK_REALTIME ns (kernel stamps); t is the reference's.
"""

from __future__ import annotations

from dataclasses import dataclass, field

import numpy as np


@dataclass
class Window:
    """One linear piece: θ(t) = offset_ns + drift_ppm·1e-3·(t − t_center_ns) [ns, t in ns]."""

    start_ns: int
    end_ns: int
    t_center_ns: int
    offset_ns: float | None = None
    drift_ppm: float | None = None
    margin_ns: float | None = None
    n_lower: int = 0
    n_upper: int = 0
    vertices: np.ndarray = field(default_factory=lambda: np.zeros((0, 2)))  # rows (a ns/s, b ns)
    drift_lo_ppm: float | None = None
    drift_hi_ppm: float | None = None
    status: str = "ok"  # ok | inconsistent | too few probes

    def theta(self, t_ns: np.ndarray) -> np.ndarray:
        x = _rel_s(t_ns, self.t_center_ns)
        return (self.offset_ns or 0.0) + (self.drift_ppm or 0.0) * 1e3 * x

    def bound(self, t_ns: np.ndarray) -> np.ndarray:
        """Largest distance, at each t, between the estimate and any consistent line."""
        x = _rel_s(t_ns, self.t_center_ns)
        if not len(self.vertices):
            return np.full(x.shape, np.inf)
        est = self.theta(t_ns)
        lines = self.vertices[:, 1][:, None] + self.vertices[:, 0][:, None] * x[None, :]
        return np.asarray(np.max(np.abs(lines - est[None, :]), axis=0))


def _rel_s(t_ns: np.ndarray, center_ns: int) -> np.ndarray:
    """Seconds from ``center_ns``, subtracted in integers first: a REALTIME
    value in float64 is only good to 256 ns."""
    return (np.asarray(t_ns).astype(np.int64) - np.int64(center_ns)).astype(np.float64) / 1e9


def _upper_hull(x: np.ndarray, y: np.ndarray) -> np.ndarray:
    """Indices of the upper convex hull of points sorted by x (monotone chain)."""
    h: list[int] = []
    for i in range(len(x)):
        while len(h) >= 2:
            o, a = h[-2], h[-1]
            # keep a only if it turns clockwise (stays above the chord o→i)
            if (x[a] - x[o]) * (y[i] - y[o]) - (y[a] - y[o]) * (x[i] - x[o]) >= 0:
                h.pop()
            else:
                break
        h.append(i)
    return np.array(h, dtype=np.int64)


def hull_lower_bounds(t: np.ndarray, v: np.ndarray) -> np.ndarray:
    """Lower bounds that can matter: the upper hull of (t, v)."""
    o = np.lexsort((-v, t))
    t, v = t[o], v[o]
    keep = np.r_[True, np.diff(t) != 0]  # one point per t: the largest v
    idx = o[keep]
    tk = t[keep]
    return np.asarray(idx[_upper_hull((tk - tk[0]).astype(np.float64) if len(tk) else tk.astype(np.float64), v[keep].astype(np.float64))])


def hull_upper_bounds(t: np.ndarray, v: np.ndarray) -> np.ndarray:
    """Upper bounds that can matter: the lower hull of (t, v)."""
    return hull_lower_bounds(t, -v)


def _fit(xl: np.ndarray, lo: np.ndarray, xu: np.ndarray, up: np.ndarray) -> tuple[float, float, float] | None:
    """Max-margin line b + a·x between lower bounds lo(xl) and upper bounds up(xu): (a, b, margin).

    For a given slope a the best line sits halfway between L(a) = max(lo − a·xl)
    and U(a) = min(up − a·xu), with margin (U − L)/2. U − L is concave and
    piecewise linear in a, so its maximum lies on a break point: a slope where
    two lower or two upper bounds meet. Those are sorted and the top is found
    by bisection on the sign of the rise, each step one pass over the bounds.
    None when the margin grows without end (every lower bound after every upper one)."""
    if xl.min() > xu.max() or xl.max() < xu.min():
        return None

    def gap(a: np.ndarray) -> np.ndarray:
        u = np.min(up[None, :] - a[:, None] * xu[None, :], axis=1)
        lw = np.max(lo[None, :] - a[:, None] * xl[None, :], axis=1)
        return np.asarray(u - lw)

    cands = np.unique(np.concatenate([_meets(xl, lo), _meets(xu, up)]))
    if not len(cands):
        return None
    lo_i, hi_i = 0, len(cands) - 1
    while hi_i - lo_i > 2:  # the top is within [lo_i, hi_i]; gap is concave over cands
        m1 = lo_i + (hi_i - lo_i) // 2
        g = gap(cands[m1 : m1 + 2])
        if g[1] >= g[0]:
            lo_i = m1
        else:
            hi_i = m1 + 1
    pick = cands[lo_i : hi_i + 1]
    g = gap(pick)
    a = pick[int(np.argmax(g))]
    u = float(np.min(up - a * xu))
    lw = float(np.max(lo - a * xl))
    return float(a), (u + lw) / 2, (u - lw) / 2


def _meets(x: np.ndarray, c: np.ndarray) -> np.ndarray:
    """Slopes a at which two of the bounds c − a·x meet."""
    i, j = np.triu_indices(len(x), 1)
    dx = x[i] - x[j]
    ok = dx != 0
    return np.asarray((c[i][ok] - c[j][ok]) / dx[ok])


def _vertices(xl: np.ndarray, lo: np.ndarray, xu: np.ndarray, up: np.ndarray, tol: float) -> np.ndarray:
    """Vertices of {(a, b): a·xl + b ≥ lo, a·xu + b ≤ up} (few constraints: all pairs)."""
    # each constraint is a line b = c − a·x in the (a, b) plane
    xs = np.concatenate([xl, xu])
    cs = np.concatenate([lo, up])
    n = len(xs)
    i, j = np.triu_indices(n, 1)
    dx = xs[i] - xs[j]
    ok = np.abs(dx) > 1e-12
    i, j, dx = i[ok], j[ok], dx[ok]
    a = (cs[i] - cs[j]) / dx
    b = cs[i] - a * xs[i]
    feas = np.all(a[:, None] * xl[None, :] + b[:, None] >= lo[None, :] - tol, axis=1) & np.all(
        a[:, None] * xu[None, :] + b[:, None] <= up[None, :] + tol, axis=1
    )
    return np.column_stack([a[feas], b[feas]])


def fit_window(t_lo: np.ndarray, lo: np.ndarray, t_up: np.ndarray, up: np.ndarray, start: int, end: int, min_each: int = 3) -> Window:
    """Fit one window; ``status`` says when it cannot."""
    tc = (start + end) // 2
    w = Window(start_ns=int(start), end_ns=int(end), t_center_ns=int(tc), n_lower=len(lo), n_upper=len(up))
    if len(lo) < min_each or len(up) < min_each:
        w.status = "too few probes"
        return w
    hl = hull_lower_bounds(t_lo, lo)
    hu = hull_upper_bounds(t_up, up)
    xl = _rel_s(t_lo[hl], tc)
    xu = _rel_s(t_up[hu], tc)
    lv, uv = lo[hl].astype(np.float64), up[hu].astype(np.float64)
    f = _fit(xl, lv, xu, uv)
    if f is None:
        w.status = "no solution"
        return w
    a, b, m = f
    w.margin_ns = m
    if m < 0:
        w.status = "inconsistent"
        return w
    w.offset_ns, w.drift_ppm = b, a / 1e3
    w.vertices = _vertices(xl, lv, xu, uv, tol=1e-6 * max(1.0, abs(b)) + 1e-3)
    if len(w.vertices):
        w.drift_lo_ppm = float(w.vertices[:, 0].min() / 1e3)
        w.drift_hi_ppm = float(w.vertices[:, 0].max() / 1e3)
    return w


def fit(t_lo: np.ndarray, lo: np.ndarray, t_up: np.ndarray, up: np.ndarray, *, min_window_s: float = 2.0, max_window_s: float = 120.0) -> list[Window]:
    """Piecewise-linear θ(t) over the whole span: split where no line fits."""
    t_lo, lo, t_up, up = (np.asarray(x, dtype=np.int64) for x in (t_lo, lo, t_up, up))
    if not len(t_lo) and not len(t_up):
        return []
    start = int(min(t_lo.min() if len(t_lo) else t_up.min(), t_up.min() if len(t_up) else t_lo.min()))
    end = int(max(t_lo.max() if len(t_lo) else t_up.max(), t_up.max() if len(t_up) else t_lo.max())) + 1
    out: list[Window] = []
    todo = [(start, end)]
    n_max = max(1, int(np.ceil((end - start) / (max_window_s * 1e9))))
    if n_max > 1:
        edges = np.linspace(start, end, n_max + 1).astype(np.int64)
        todo = list(zip(edges[:-1].tolist(), edges[1:].tolist()))
    todo.reverse()
    while todo:
        s, e = todo.pop()
        ml, mu = (t_lo >= s) & (t_lo < e), (t_up >= s) & (t_up < e)
        w = fit_window(t_lo[ml], lo[ml], t_up[mu], up[mu], s, e)
        if w.status in ("inconsistent", "no solution") and (e - s) / 2 >= min_window_s * 1e9:
            mid = (s + e) // 2
            todo += [(mid, e), (s, mid)]
            continue
        out.append(w)
    return out


def evaluate(windows: list[Window], t_ns: np.ndarray) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    """θ(t), its bound and the index of the window used, for reference times t.

    A time before the first or after the last window takes the nearest
    window with an estimate (the bound grows with the distance, as the
    consistent lines fan out); a time inside a window without an estimate
    gets NaN and an infinite bound: it cannot be placed, and says so.
    """
    t = np.asarray(t_ns, dtype=np.int64)
    theta = np.full(t.shape, np.nan)
    bound = np.full(t.shape, np.inf)
    if not windows or not len(t):
        return theta, bound, np.full(t.shape, -1, dtype=np.int64)
    starts = np.array([w.start_ns for w in windows])
    ends = np.array([w.end_ns for w in windows])
    good = np.array([w.offset_ns is not None for w in windows])
    k = np.clip(np.searchsorted(starts, t, side="right") - 1, 0, len(windows) - 1)
    inside = (t >= starts[k]) & (t < ends[k])
    use = np.where(good[k], k, -1)
    if good.any():
        gi = np.flatnonzero(good)
        out = ~inside
        if out.any():
            centers = np.array([windows[i].t_center_ns for i in gi], dtype=np.int64)
            use[out] = gi[np.argmin(np.abs(centers[None, :] - t[out][:, None]), axis=1)]
    for u in np.unique(use[use >= 0]):
        sel = use == u
        theta[sel] = windows[u].theta(t[sel])
        bound[sel] = windows[u].bound(t[sel])
    return theta, bound, use
