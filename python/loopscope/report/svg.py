"""Charts drawn straight to SVG: a figure of panels, each with a linear or
log scale on either axis, ticks at round numbers, and lines, steps, dots,
bars, bands and error bars in data coordinates.

Why not matplotlib: its text layout (every tick label measured, the
figure drawn twice for a tight box) cost about 2.5 s of a demo report's
6 s, and every `loopscope run` builds a report. Here a chart is a few
milliseconds of numpy and string joins. Text widths are estimated (0.6 em
a character in a sans-serif face), so margins fit the labels they hold
with some slack, and no text is smaller than 12 px at the chart's own size
(the page never widens a chart past 1,000 px, so never shrinks one).

Many points stay light: a line keeps one point per half pixel it moves,
and dots one per pixel they cover, so a chart of a million samples weighs
what one of a few thousand does.
"""

from __future__ import annotations

import base64
import html
import math
import struct
import textwrap
import zlib
from dataclasses import dataclass, field

import numpy as np

FONT = 12  # px: tick labels, legends, axis labels
TITLE = 13  # px
EM = 0.6  # an average character's width in em (sans-serif), for margins
INK = "#1d2125"
MUTED = "#5f6b76"
GRID = "#e9ecef"

# Up to 20 causes in one chart, each its own colour (the tab20 palette).
MANY = [
    "#1f77b4", "#aec7e8", "#ff7f0e", "#ffbb78", "#2ca02c", "#98df8a", "#d62728", "#ff9896", "#9467bd", "#c5b0d5",
    "#8c564b", "#c49c94", "#e377c2", "#f7b6d2", "#7f7f7f", "#c7c7c7", "#bcbd22", "#dbdb8d", "#17becf", "#9edae5",
]  # fmt: skip
# viridis at nine evenly spaced points (a heat map's colours, dark to bright)
VIRIDIS = ["#440154", "#472d7b", "#3b528b", "#2c728e", "#21918c", "#28ae80", "#5ec962", "#addc30", "#fde725"]
PALETTE = ["#1f5fa8", "#d9480f", "#2b8a3e", "#862e9c", "#e67700", "#0b7285", "#c2255c", "#5c940d", "#495057", "#364fc7"]


def heat(v: np.ndarray) -> np.ndarray:
    """Values in 0..1 (NaN: none) as RGBA pixels on VIRIDIS, NaN transparent."""
    stops = np.array([[int(c[i : i + 2], 16) for i in (1, 3, 5)] for c in VIRIDIS], dtype=np.float64)
    x = np.clip(np.nan_to_num(v, nan=0.0), 0, 1) * (len(stops) - 1)
    k = np.minimum(x.astype(np.int64), len(stops) - 2)
    f = (x - k)[..., None]
    rgb = stops[k] * (1 - f) + stops[k + 1] * f
    alpha = np.where(np.isnan(v), 0, 255)[..., None]
    return np.concatenate([rgb, alpha], axis=-1).round().astype(np.uint8)


def png(rgba: np.ndarray) -> bytes:
    """An (h, w, 4) uint8 image as a PNG file (zlib and the format's four chunks)."""
    h, w = rgba.shape[:2]
    raw = b"".join(b"\x00" + row.tobytes() for row in np.ascontiguousarray(rgba, dtype=np.uint8))

    def chunk(kind: bytes, data: bytes) -> bytes:
        return struct.pack(">I", len(data)) + kind + data + struct.pack(">I", zlib.crc32(kind + data) & 0xFFFFFFFF)

    return b"\x89PNG\r\n\x1a\n" + chunk(b"IHDR", struct.pack(">IIBBBBB", w, h, 8, 6, 0, 0, 0)) + chunk(b"IDAT", zlib.compress(raw, 6)) + chunk(b"IEND", b"")


def width_of(s: str, size: float = FONT) -> float:
    """The estimated width of ``s`` in px at ``size``."""
    return len(s) * size * EM


def esc(s: str) -> str:
    return html.escape(s, quote=True)


def wrap(s: str, px: float, size: float = TITLE) -> list[str]:
    """``s`` broken into lines of at most ``px`` wide (estimated)."""
    return textwrap.wrap(s, max(10, int(px / (size * EM)))) or [""]


def _num(v: float) -> str:
    return f"{v:g}"


def _lin_ticks(lo: float, hi: float, n: int = 5) -> list[float]:
    span = hi - lo if hi > lo else (abs(hi) or 1.0)
    raw = span / n
    mag = 10 ** math.floor(math.log10(raw))
    step = next(m * mag for m in (1, 2, 2.5, 5, 10) if m * mag >= raw * 0.999)
    first = math.ceil(lo / step - 1e-9) * step
    out = [first + i * step for i in range(int((hi - first) / step + 1e-9) + 1)]
    return [0.0 if abs(v) < step * 1e-9 else float(f"{v:.12g}") for v in out]


def _log_ticks(lo: float, hi: float, most: int = 8) -> list[float]:
    """Powers of ten, with 2 and 5 (or every digit) between them when the
    range is short, the finest set of at most ``most``."""
    a, b = math.floor(math.log10(lo)), math.ceil(math.log10(hi))
    out: list[float] = []
    span = math.log10(hi / lo)
    sets = ((1, 2, 3, 4, 5, 6, 7, 8, 9), (1, 2, 5), (1,))
    for mults in sets[(2 if span >= 2 else 1 if span >= 0.7 else 0) :]:
        out = [float(f"{m * 10.0**k:.12g}") for k in range(a, b + 1) for m in mults if lo * 0.9999 <= m * 10.0**k <= hi * 1.0001]
        if len(out) <= most and (len(out) >= 3 or mults == (1,)):
            break
    if len(out) > most:
        out = out[:: math.ceil(len(out) / most)]
    return out if len(out) >= 2 else _lin_ticks(lo, hi, min(4, most))


@dataclass
class Scale:
    """Data ``lo..hi`` onto pixels ``a..b`` (``b < a`` for a y axis)."""

    lo: float
    hi: float
    a: float
    b: float
    log: bool = False

    def __post_init__(self) -> None:
        if self.log:
            self.lo, self.hi = max(self.lo, 1e-12), max(self.hi, 1e-12)
        if not self.hi > self.lo:
            self.lo, self.hi = (self.lo / 2, self.lo * 2) if self.log else (self.lo - 0.5, self.lo + 0.5)

    def __call__(self, v: np.ndarray | float) -> np.ndarray:
        x = np.asarray(v, dtype=np.float64)
        if self.log:
            x = np.log10(np.maximum(x, self.lo * 1e-3))
            lo, hi = math.log10(self.lo), math.log10(self.hi)
        else:
            lo, hi = self.lo, self.hi
        return self.a + (x - lo) / (hi - lo) * (self.b - self.a)

    def ticks(self) -> list[float]:
        """Round values inside the domain, at least about 24 px apart."""
        most = max(2, int(abs(self.b - self.a) / 24)) if self.a != self.b else 8
        out = _log_ticks(self.lo, self.hi, most) if self.log else _lin_ticks(self.lo, self.hi, min(5, most))
        return out[:: math.ceil(len(out) / most)] if len(out) > most else out


def domain(values: np.ndarray, log: bool = False, zero: bool = False, pad: float = 0.04) -> tuple[float, float]:
    """A scale's ``lo, hi`` holding every finite value (positive ones on a
    log scale), a little beyond; from 0 when ``zero``."""
    v = np.asarray(values, dtype=np.float64)
    v = v[np.isfinite(v) & (v > 0)] if log else v[np.isfinite(v)]
    if not len(v):
        return (1.0, 10.0) if log else (0.0, 1.0)
    lo, hi = float(v.min()), float(v.max())
    if log:
        k = max(math.log10(hi / lo), 0.2) * pad
        return lo / 10**k, hi * 10**k
    if zero:
        lo = min(lo, 0.0)
    d = (hi - lo) or abs(hi) or 1.0
    return (lo if zero and lo == 0 else lo - d * pad), hi + d * pad


def _pts(x: np.ndarray, y: np.ndarray) -> str:
    return " ".join(f"{a:.1f},{b:.1f}" for a, b in zip(x.tolist(), y.tolist()))


def _thin(px: np.ndarray, py: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    """A line's points, one per half pixel moved (its turns kept)."""
    if len(px) < 3:
        return px, py
    kx, ky = np.round(px * 2), np.round(py * 2)
    keep = np.ones(len(px), dtype=bool)
    keep[1:] = (np.diff(kx) != 0) | (np.diff(ky) != 0)
    keep[-1] = True
    return px[keep], py[keep]


@dataclass
class Panel:
    """One plotting area: ``x, y`` its top left, ``w, h`` its size, in px."""

    x: float
    y: float
    w: float
    h: float
    xs: Scale
    ys: Scale
    parts: list[str] = field(default_factory=list)

    @classmethod
    def at(cls, x: float, y: float, w: float, h: float, xd: tuple[float, float], yd: tuple[float, float], xlog: bool = False, ylog: bool = False) -> Panel:
        return cls(x, y, w, h, Scale(xd[0], xd[1], x, x + w, xlog), Scale(yd[0], yd[1], y + h, y, ylog))

    def _xy(self, x: np.ndarray | list[float], y: np.ndarray | list[float]) -> tuple[np.ndarray, np.ndarray]:
        px = np.clip(self.xs(np.asarray(x, dtype=np.float64)), self.x, self.x + self.w)
        py = np.clip(self.ys(np.asarray(y, dtype=np.float64)), self.y, self.y + self.h)
        ok = np.isfinite(px) & np.isfinite(py)
        return px[ok], py[ok]

    def line(self, x: np.ndarray | list[float], y: np.ndarray | list[float], color: str, width: float = 1.4, dash: str = "", opacity: float = 1.0) -> None:
        px, py = _thin(*self._xy(x, y))
        if len(px):
            d = f' stroke-dasharray="{dash}"' if dash else ""
            o = f' stroke-opacity="{opacity}"' if opacity < 1 else ""
            self.parts.append(f'<polyline fill="none" stroke="{color}" stroke-width="{width}"{d}{o} stroke-linejoin="round" points="{_pts(px, py)}"/>')

    def step(self, x: np.ndarray, y: np.ndarray, color: str, width: float = 1.4) -> None:
        """A step line holding each ``y`` from its ``x`` to the next one."""
        if len(x):
            sx = np.repeat(np.asarray(x, dtype=np.float64), 2)[1:]
            sy = np.repeat(np.asarray(y, dtype=np.float64), 2)[:-1]
            self.line(sx, sy, color, width)

    def dots(self, x: np.ndarray, y: np.ndarray, color: str, r: float = 1.3, opacity: float = 0.5) -> None:
        """A dot per point, one per pixel covered (a path of zero-length round caps)."""
        px, py = self._xy(x, y)
        if not len(px):
            return
        cells = np.unique(np.round(px).astype(np.int64) * 65536 + np.round(py).astype(np.int64))
        d = "".join(f"M{c >> 16} {c & 0xFFFF}h0" for c in cells.tolist())
        self.parts.append(f'<path d="{d}" stroke="{color}" stroke-opacity="{opacity}" stroke-width="{2 * r}" stroke-linecap="round"/>')

    def markers(self, x: np.ndarray | list[float], y: np.ndarray | list[float], color: str, r: float = 3.0) -> None:
        px, py = self._xy(x, y)
        self.parts.extend(f'<circle cx="{a:.1f}" cy="{b:.1f}" r="{r}" fill="{color}"/>' for a, b in zip(px.tolist(), py.tolist()))

    def rect(self, x0: float, x1: float, y0: float, y1: float, color: str, opacity: float = 1.0) -> None:
        """The box from data ``(x0, y0)`` to ``(x1, y1)``."""
        if not all(math.isfinite(v) for v in (x0, x1, y0, y1)):
            return  # a value that is not there draws nothing (the chart's caller says why elsewhere)
        (a, b), (c, d) = self._xy([x0, x1], [y0, y1])
        o = f' fill-opacity="{opacity}"' if opacity < 1 else ""
        self.parts.append(f'<rect x="{min(a, b):.1f}" y="{min(c, d):.1f}" width="{abs(b - a):.1f}" height="{abs(d - c):.1f}" fill="{color}"{o}/>')

    def band(self, x: np.ndarray, lo: np.ndarray, hi: np.ndarray, color: str, opacity: float = 0.15) -> None:
        px, plo = self._xy(x, lo)
        _, phi = self._xy(x, hi)
        if len(px) > 1:
            pts = _pts(np.concatenate([px, px[::-1]]), np.concatenate([phi, plo[::-1]]))
            self.parts.append(f'<polygon fill="{color}" fill-opacity="{opacity}" points="{pts}"/>')

    def whisker(self, x: float, y: float, x2: float, y2: float, color: str, cap: float = 2.5) -> None:
        """An error bar from data ``(x, y)`` to ``(x2, y2)`` with caps at both ends."""
        if not all(math.isfinite(v) for v in (x, y, x2, y2)):
            return
        (a, b), (c, d) = self._xy([x, x2], [y, y2])
        caps = (
            f"M{a - cap:.1f} {c:.1f}h{2 * cap}M{b - cap:.1f} {d:.1f}h{2 * cap}"
            if a == b
            else f"M{a:.1f} {c - cap:.1f}v{2 * cap}M{b:.1f} {d - cap:.1f}v{2 * cap}"
        )
        self.parts.append(f'<path d="M{a:.1f} {c:.1f}L{b:.1f} {d:.1f}{caps}" stroke="{color}" stroke-width="1"/>')

    def image(self, rgba: np.ndarray) -> None:
        """``rgba`` (rows top to bottom) stretched over the whole panel, each pixel a block."""
        data = base64.b64encode(png(rgba)).decode()
        self.parts.append(
            f'<image x="{self.x:.1f}" y="{self.y:.1f}" width="{self.w:.1f}" height="{self.h:.1f}" preserveAspectRatio="none" '
            f'style="image-rendering:pixelated" href="data:image/png;base64,{data}"/>'
        )

    def hline(self, v: float, color: str = "#888", dash: str = "2 3", label: str = "") -> None:
        y = float(self.ys(v))
        if self.y - 0.5 <= y <= self.y + self.h + 0.5:
            self.parts.append(f'<path d="M{self.x:.1f} {y:.1f}h{self.w:.1f}" stroke="{color}" stroke-width="0.8" stroke-dasharray="{dash}"/>')
            if label:
                self.parts.append(f'<text x="{self.x + self.w + 4:.1f}" y="{y + 4:.1f}" fill="{MUTED}">{esc(label)}</text>')

    def vline(self, v: float, color: str, dash: str = "4 3") -> None:
        x = float(self.xs(v))
        if self.x <= x <= self.x + self.w:
            self.parts.append(f'<path d="M{x:.1f} {self.y:.1f}v{self.h:.1f}" stroke="{color}" stroke-width="1" stroke-dasharray="{dash}"/>')

    def axes(
        self,
        xlabel: str = "",
        ylabel: str = "",
        xticks: list[tuple[float, str]] | None = None,
        yticks: list[tuple[float, str]] | None = None,
        rotate: bool = False,
    ) -> None:
        """Grid, left and bottom spines, tick labels and the axis labels;
        ``[]`` for no ticks on an axis, ``None`` for round numbers."""
        out: list[str] = []
        xt = [(v, _num(v)) for v in self.xs.ticks()] if xticks is None else xticks
        yt = [(v, _num(v)) for v in self.ys.ticks()] if yticks is None else yticks
        bottom = self.y + self.h
        for v, s in xt:
            x = float(self.xs(v))
            out.append(f'<path d="M{x:.1f} {self.y:.1f}V{bottom + 4:.1f}" stroke="{GRID}"/>')
            if rotate:
                out.append(f'<text transform="translate({x + 4:.1f},{bottom + 10:.1f}) rotate(-40)" text-anchor="end">{esc(s)}</text>')
            else:
                out.append(f'<text x="{x:.1f}" y="{bottom + 17:.1f}" text-anchor="middle">{esc(s)}</text>')
        for v, s in yt:
            y = float(self.ys(v))
            out.append(f'<path d="M{self.x - 4:.1f} {y:.1f}H{self.x + self.w:.1f}" stroke="{GRID}"/>')
            out.append(f'<text x="{self.x - 6:.1f}" y="{y + 4:.1f}" text-anchor="end">{esc(s)}</text>')
        out.append(f'<path d="M{self.x:.1f} {self.y:.1f}V{bottom:.1f}H{self.x + self.w:.1f}" fill="none" stroke="{INK}" stroke-width="0.8"/>')
        if xlabel:
            below = bottom + (max((width_of(s) for _, s in xt), default=0) * 0.65 + 24 if rotate else 34)
            out.append(f'<text x="{self.x + self.w / 2:.1f}" y="{below:.1f}" text-anchor="middle">{esc(xlabel)}</text>')
        if ylabel:
            left = self.x - max((width_of(s) for _, s in yt), default=0) - 14
            out.append(f'<text transform="translate({left:.1f},{self.y + self.h / 2:.1f}) rotate(-90)" text-anchor="middle">{esc(ylabel)}</text>')
        self.parts[:0] = out  # under the data

    def svg(self) -> str:
        return "".join(self.parts)


def tick_room(labels: list[str]) -> float:
    """The px a column of tick labels takes beside its axis."""
    return max((width_of(s) for s in labels), default=0.0) + 8


@dataclass
class Figure:
    """A chart: its width, the panels and texts placed on it, and a height
    taken from what was placed (``grow``)."""

    w: float
    h: float = 0.0
    parts: list[str] = field(default_factory=list)

    def grow(self, y: float) -> None:
        self.h = max(self.h, y)

    def title(self, text: str, x: float, y: float, size: int = TITLE, w: float | None = None) -> float:
        """``text`` from ``(x, y)`` (its first baseline), wrapped to ``w``; the y below it."""
        for line in wrap(text, (w or self.w - x - 8), size):
            self.parts.append(f'<text x="{x:.1f}" y="{y:.1f}" font-size="{size}" fill="{INK}">{esc(line)}</text>')
            y += size + 5
        self.grow(y)
        return y

    def legend(self, items: list[tuple[str, str]], x: float, y: float, w: float | None = None, line: bool = False) -> float:
        """Swatches with their labels, flowing in rows from ``(x, y)`` within
        ``w``; the y below the last row."""
        right, cx = x + (w or self.w - x - 8), x
        top = y
        for label, color in items:
            iw = 22 + width_of(label)
            if cx > x and cx + iw > right:
                cx, y = x, y + FONT + 6
            mark = (
                f'<path d="M{cx:.1f} {y - 4:.1f}h14" stroke="{color}" stroke-width="2"/>'
                if line
                else f'<rect x="{cx:.1f}" y="{y - 10:.1f}" width="12" height="10" fill="{color}"/>'
            )
            self.parts.append(f'{mark}<text x="{cx + 18:.1f}" y="{y:.1f}">{esc(label)}</text>')
            cx += iw + 12
        y = y + FONT + 6 if items else top
        self.grow(y)
        return y

    def add(self, panel: Panel) -> None:
        self.parts.append(panel.svg())
        self.grow(panel.y + panel.h)

    def svg(self) -> str:
        w, h = math.ceil(self.w), math.ceil(self.h + 6)
        return (
            f'<svg xmlns="http://www.w3.org/2000/svg" viewBox="0 0 {w} {h}" width="{w}" height="{h}" '
            f'font-family="sans-serif" font-size="{FONT}" fill="{INK}">' + "".join(self.parts) + "</svg>"
        )
