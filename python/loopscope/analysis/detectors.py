"""Detectors for the anomalies Boie & Niehaus 2007 saw and could not name.

Each takes one latency series (record times and values, one repetition of
one probe in one phase) and returns a ``Finding`` only when it fires, with
the numbers a reader needs ("every 30.2 s, +1.8 ms"). Each says how sure it
is and is tested on synthetic series with a known answer and on noise.

- **warm-up**: a change point near the start (the first part's median
  differs from the rest, Mann-Whitney U, p < 1e-4, by more than 20 % and
  3 MADs); says how much to trim.
- **periodic disturbance**: the series of outlier indicators (value above
  the p95, or no record at all in a grid step) on a regular grid has a spectral peak far above the rest (FFT
  periodogram, Fisher's g-test p < 1e-3, and 20× the median power); the
  period is the shortest autocorrelation lag near the best one (a short
  burst spreads its power over many harmonics), the amplitude comes from
  the series folded at that period.
- **gaps**: stretches with no records longer than 10 record intervals (and
  1 ms); their count, lengths, and their period when regular (CV < 0.1).
- **quantization**: values clustered at multiples of a step (the largest
  step whose phases have a mean resultant length above 0.8, Rayleigh).
- **drift within a phase** ("parallel lines"): the running median rises
  along a line that resets periodically (fold at the strongest period of
  the smoothed series and fit), or along the whole phase (Theil–Sen slope
  whose 95 % interval excludes 0 and whose total change exceeds 20 %).
"""

from __future__ import annotations

from dataclasses import dataclass, field

import numpy as np
import polars as pl
from loopscope import stats as S
from loopscope.units import format_ns

MIN_RECORDS = 200


@dataclass
class Finding:
    """What a detector found; ``windows``: the stretches of the series (its
    own clock, ns) where the anomaly is, for explain to say what ran there
    (none: the whole series, as for quantization)."""

    kind: str
    text: str
    values: dict[str, float] = field(default_factory=dict)
    windows: list[tuple[int, int]] = field(default_factory=list)


def _fmt(ns: float) -> str:

    return format_ns(ns)


def _grid(t: np.ndarray) -> float:
    d = np.diff(t)
    d = d[d > 0]
    return float(np.median(d)) if len(d) else 0.0


def warmup(t: np.ndarray, v: np.ndarray) -> Finding | None:
    n = len(v)
    if n < MIN_RECORDS:
        return None
    rest_med = float(np.median(v[n // 2 :]))
    mad = S.mad(v[n // 2 :]) or 1.0
    cuts = []
    for frac in np.linspace(0.01, 0.3, 30):
        c = max(20, int(frac * n))
        hm = float(np.median(v[:c]))
        if abs(hm - rest_med) >= max(0.2 * rest_med, 3 * mad):
            cuts.append((c, hm))
    best = None
    for (c, hm), p in zip(cuts, S.rank_sum_splits(np.asarray(v, dtype=np.float64), [c for c, _ in cuts]) if cuts else []):
        if p < 1e-4 and (best is None or p < best[1]):
            best = (c, p, hm)
    if best is None:
        return None
    c, p, hm = best
    # the cut: the last point of the head whose running median still differs
    trim_s = (t[c] - t[0]) / 1e9
    return Finding(
        "warm-up",
        f"warm-up: the first {trim_s:.2f} s ({c} records) run at a median of {_fmt(hm)} against {_fmt(rest_med)} after; left out of the phase comparisons",
        {"records": c, "seconds": trim_s, "median_ns": hm, "steady_median_ns": rest_med, "p_value": p},
        [(int(t[0]), int(t[c]))],
    )


def _fisher_g_p(g: float, m: int) -> float:
    """P-value of Fisher's g statistic (the largest periodogram ordinate's share
    of the total over m ordinates), by its first term m·(1 − g)^(m−1), which is
    an upper bound and exact enough where it matters (small p)."""
    if g <= 0 or g >= 1:
        return 1.0 if g <= 0 else 0.0
    return float(min(1.0, np.exp(np.log(m) + (m - 1) * np.log1p(-g))))


def periodic(t: np.ndarray, v: np.ndarray) -> Finding | None:
    n = len(v)
    if n < MIN_RECORDS:
        return None
    dt = _grid(t)
    if dt <= 0:
        return None
    span = t[-1] - t[0]
    bins = int(span / dt) + 1
    if bins < 64:
        return None
    idx = ((t - t[0]) / dt).astype(np.int64).clip(0, bins - 1)
    thr = np.percentile(v, 95)
    x = np.zeros(bins)
    # Each outlier weighs by how far it is past the threshold (in e-folds,
    # plus one): a disturbance of milliseconds outweighs the machine's
    # everyday periodic noise just above the p95.
    w = np.where(v > thr, 1.0 + np.log(np.maximum(v, thr) / max(thr, 1.0)), 0.0)
    np.maximum.at(x, idx, w)
    # A grid step with no record is a record that never came (a deadline
    # missed while the thread could not run): as heavy as the worst outlier.
    seen = np.zeros(bins, dtype=bool)
    seen[idx] = True
    x[~seen] = max(1.0, float(w.max()))
    x -= x.mean()
    if not x.any():
        return None
    f = np.fft.rfft(x)
    pw = (np.abs(f) ** 2)[1:]
    freqs = np.fft.rfftfreq(bins, d=dt)[1:]
    # periods between 4 grid steps and a third of the span
    ok = (freqs > 3 / span) & (freqs < 1 / (4 * dt))
    if not ok.any():
        return None
    pw, freqs = pw[ok], freqs[ok]
    k = int(np.argmax(pw))
    g = float(pw[k] / pw.sum())
    p = _fisher_g_p(g, len(pw))
    if p > 1e-3 or pw[k] < 20 * float(np.median(pw)):
        return None
    # A short burst repeating has its power spread over many harmonics, so the
    # period comes from the autocorrelation: the shortest lag whose
    # correlation is close to the best one between 4 steps and a third of the span.
    acf = np.fft.irfft(np.abs(np.fft.rfft(x, 2 * bins)) ** 2)[:bins]
    acf /= acf[0]
    hi = max(5, bins // 3)
    # past the central lobe: lags over which the burst overlaps itself
    lo = 1
    while lo < hi and acf[lo] > 0.5 * acf[1]:
        lo += 1
    lo = max(lo, 4)
    seg = acf[lo:hi]
    if not len(seg) or seg.max() < 0.1:
        return None
    top = lo + int(np.argmax(seg))
    # the best lag may be a multiple of the period: take the smallest sub-multiple that is as good
    for m in range(12, 1, -1):
        c = int(round(top / m))
        if c >= lo and acf[max(lo, c - 1) : c + 2].max() >= 0.8 * acf[top]:
            top = max(lo, c - 1) + int(np.argmax(acf[max(lo, c - 1) : c + 2]))
            break
    period = top * dt
    phase = ((t - t[0]) % period) / period
    nb = 20
    b = np.minimum((phase * nb).astype(int), nb - 1)
    means = np.array([np.mean(v[b == i]) if np.any(b == i) else np.nan for i in range(nb)])
    base = float(np.median(v))
    amp = float(np.nanmax(means) - base)
    # how much bigger the outliers are on the peak phase than elsewhere
    peak_bin = int(np.nanargmax(means))
    peak_top = float(np.percentile(v[b == peak_bin], 90)) - base if np.any(b == peak_bin) else amp
    # the spikes: on the peak phase (a bin either side), once per period
    lo_ph, hi_ph = (peak_bin - 1) / nb * period, (peak_bin + 2) / nb * period
    spikes = [(int(t[0] + k * period + lo_ph), int(t[0] + k * period + hi_ph)) for k in range(int(span // period) + 1)]
    return Finding(
        "periodic",
        f"periodic disturbance: every {_fmt(period)}, +{_fmt(max(amp, peak_top))} at its peak (spectral peak p = {p:.1e})",
        {"period_s": period / 1e9, "amplitude_ns": max(amp, peak_top), "p_value": p},
        spikes,
    )


def gaps(t: np.ndarray, v: np.ndarray) -> Finding | None:
    if len(t) < MIN_RECORDS:
        return None
    dt = _grid(t)
    d = np.diff(t)
    big = np.flatnonzero(d > max(10 * dt, 1_000_000))
    if len(big) < 1:
        return None
    lens = d[big]
    starts = t[big]
    text = (
        f"gaps: {len(big)} stretches without records, {_fmt(float(lens.min()))}–{_fmt(float(lens.max()))} long"
        if len(big) > 1
        else f"gaps: 1 stretch without records, {_fmt(float(lens.min()))} long"
    )
    vals: dict[str, float] = {"count": int(len(big)), "min_ns": float(lens.min()), "max_ns": float(lens.max()), "total_ns": float(lens.sum())}
    if len(big) >= 3:
        iv = np.diff(starts)
        cv = float(np.std(iv) / np.mean(iv)) if np.mean(iv) > 0 else 1.0
        if cv < 0.1:
            vals["period_s"] = float(np.mean(iv)) / 1e9
            text += f", every {_fmt(vals['period_s'] * 1e9)}"
    return Finding("gaps", text, vals, [(int(a), int(a + n)) for a, n in zip(starts, lens)])


STEPS_NS = np.unique(
    np.concatenate([np.array([a * 10**e for e in range(4, 9) for a in (1, 2, 2.5, 4, 5)]), np.array([1e6 * k for k in (1, 2, 3, 4, 5, 8, 10, 16, 20, 40, 50)])])
)


def quantization(t: np.ndarray, v: np.ndarray) -> Finding | None:
    v = v[v > 0]
    if len(v) < MIN_RECORDS:
        return None
    best = None
    for s in STEPS_NS:
        big = v[v >= s]
        if len(big) < 0.5 * len(v) or len(big) < 100 or np.percentile(big, 90) < 2 * s:
            continue
        ph = 2 * np.pi * (big % s) / s
        z = np.mean(np.exp(1j * ph))
        r = float(np.abs(z))
        if r <= 0.8:
            continue
        # A narrow unimodal distribution is "clustered" for any large step:
        # quantization needs the values spread over several multiples.
        off = float(np.angle(z) / (2 * np.pi) * s) % s
        k = np.round((big - off) / s)
        _, counts = np.unique(k, return_counts=True)
        share = np.sort(counts)[::-1] / len(big)
        levels = int((share >= 0.05).sum())
        # Two clusters a step apart, away from the multiples, are only bimodal:
        # with an offset, quantization needs three levels or more.
        aligned = min(off, s - off) <= 0.1 * s
        if len(share) >= 2 and share[1] >= 0.1 and (aligned or levels >= 3):
            best = (s, r, len(big), off, levels)
    if best is None:
        return None
    s, r, n, off, levels = best
    at = f"multiples of {_fmt(float(s))}" + (f" plus {_fmt(off)}" if min(off, s - off) > 0.1 * s else "")
    return Finding(
        "quantization",
        f"quantization: latencies cluster at {at} ({levels} levels, resultant length {r:.2f} over {n} records)",
        {"step_ns": float(s), "offset_ns": off, "resultant": r, "levels": levels},
    )


def drift(t: np.ndarray, v: np.ndarray) -> Finding | None:
    n = len(v)
    if n < MIN_RECORDS:
        return None
    w = max(5, n // 100)
    # running median on blocks
    nb = n // w
    tm = np.median(t[: nb * w].reshape(nb, w), axis=1)
    vm = np.median(v[: nb * w].reshape(nb, w), axis=1)
    if nb < 20:
        return None
    # sawtooth: strongest period of the smoothed series, then a line against the phase
    x = vm - vm.mean()
    f = np.fft.rfft(x)
    pw = (np.abs(f) ** 2)[1:]
    fr = np.fft.rfftfreq(nb, d=float(np.median(np.diff(tm))))[1:]
    span = tm[-1] - tm[0]
    ok = fr > 1.9 / span  # at least two resets
    if ok.any():
        k = int(np.argmax(np.where(ok, pw, 0)))
        period = 1 / fr[k]
        ph = (tm - tm[0]) % period
        best: tuple[float, float, float] | None = None
        for shift in np.linspace(0, period, 16, endpoint=False):
            phs = (ph + shift) % period
            fit = S.line_fit(phs, vm)
            if best is None or fit[1] ** 2 > best[1] ** 2:
                best = fit
        assert best is not None  # 16 shifts were fitted
        slope, r, p = best
        if r**2 > 0.6 and p < 1e-6 and slope * period > 0.2 * np.median(vm):
            return Finding(
                "drift",
                f"drift within the phase: the typical value rises {_fmt(slope * 1e9)} per s and resets every {_fmt(period)} (the 'parallel lines' pattern, r² {r**2:.2f})",
                {"slope_ns_per_s": slope * 1e9, "period_s": period / 1e9, "r2": r**2},
            )
    slope, low, high = S.theil_sen(tm, vm)
    change = slope * span
    if (low > 0 or high < 0) and abs(change) > 0.2 * np.median(vm):
        return Finding(
            "drift",
            f"drift within the phase: the typical value moves {_fmt(slope * 1e9)} per s, {change / np.median(vm) * 100:+.0f} % over the phase",
            {"slope_ns_per_s": slope * 1e9, "change_ns": change},
        )
    return None


DETECTORS = (warmup, periodic, gaps, quantization, drift)


def detect(t: np.ndarray, v: np.ndarray) -> list[Finding]:
    """Every detector on one series (sorted by time); only those that fire."""
    order = np.argsort(t, kind="stable")
    t, v = np.asarray(t, dtype=np.float64)[order], np.asarray(v, dtype=np.float64)[order]
    return [f for d in DETECTORS if (f := d(t, v)) is not None]


def trim_warmup(df: pl.DataFrame, value: str, by: tuple[str, ...] = ()) -> tuple[pl.DataFrame, list[str]]:
    """``df`` (a probe table with probe, phase, rep, t_ns and ``value``) without
    the warm-up of each series where the detector fires, and what was trimmed.
    ``by``: further columns that tell series apart (a program's intervals)."""

    if not len(df) or value not in df.columns:
        return df, []
    keep, notes = [], []
    for key, g in df.group_by(["probe", *by, "phase", "rep"], maintain_order=True):
        probe, phase, rep = " ".join(str(k) for k in key[: 1 + len(by)]), key[-2], key[-1]
        g = g.sort("t_ns")
        f = warmup(g["t_ns"].to_numpy().astype(np.float64), g[value].to_numpy().astype(np.float64))
        if f is not None:
            keep.append(g.slice(int(f.values["records"])))
            notes.append(
                f"{probe}, {phase}, rep {rep}: a warm-up of {f.values['seconds']:.2f} s ({int(f.values['records'])} records, median {_fmt(f.values['median_ns'])} against {_fmt(f.values['steady_median_ns'])}) is left out of the comparisons"
            )
        else:
            keep.append(g)
    return pl.concat(keep), notes
