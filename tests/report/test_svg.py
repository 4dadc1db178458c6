"""The report's SVG charts (report/svg.py, report/charts.py): round ticks,
light paths for many samples, well-formed charts whose text is at least
12 px at their own size, and the heat map's PNG."""

from __future__ import annotations

import struct
import xml.etree.ElementTree as ET
import zlib

import numpy as np
import polars as pl

from loopscope.report import charts
from loopscope.report.svg import FONT, VIRIDIS, Panel, Scale, heat, png

NS = "{http://www.w3.org/2000/svg}"


def _frame(n: int, phases: list[str]) -> pl.DataFrame:
    rng = np.random.default_rng(3)
    return pl.DataFrame(
        {
            "phase": [p for p in phases for _ in range(n)],
            "rep": [1 + (i % 2) for _ in phases for i in range(n)],
            "t_ns": [i * 1_000_000 for _ in phases for i in range(n)],
            "value": np.concatenate([rng.lognormal(11 + k, 0.5, n) for k in range(len(phases))]).astype(np.int64),
        }
    )


def test_a_log_scale_ticks_powers_of_ten_and_adds_2_and_5_on_a_short_range() -> None:
    assert Scale(0.01, 1000, 0, 400, log=True).ticks() == [0.01, 0.1, 1, 10, 100, 1000]
    assert Scale(3, 40, 0, 400, log=True).ticks() == [5, 10, 20]


def test_a_linear_scale_ticks_round_numbers_inside_its_domain() -> None:
    assert Scale(0, 100, 0, 400).ticks() == [0, 20, 40, 60, 80, 100]
    assert Scale(0.13, 0.61, 0, 400).ticks() == [0.2, 0.3, 0.4, 0.5, 0.6]


def test_a_short_axis_gets_fewer_ticks() -> None:
    assert len(Scale(0.05, 20, 100, 40, log=True).ticks()) <= 3


def test_a_step_line_of_a_million_points_keeps_about_one_point_per_half_pixel() -> None:
    p = Panel.at(0, 0, 500, 200, (1, 1e6), (1e-6, 1), xlog=True, ylog=True)
    v = np.arange(1, 1_000_001, dtype=np.float64)
    p.step(v, 1 - (v - 0.5) / len(v), "#000")
    points = p.svg().split('points="')[1].split('"')[0].split()
    assert 10 < len(points) < 4 * (500 + 200)


def test_dots_are_one_per_pixel_covered() -> None:
    p = Panel.at(0, 0, 100, 50, (0, 1), (0, 1))
    rng = np.random.default_rng(1)
    p.dots(rng.random(200_000), rng.random(200_000), "#000")
    assert p.svg().count("h0") <= 101 * 51


def test_every_chart_of_a_run_is_well_formed_svg_with_text_of_at_least_12_px() -> None:
    f = _frame(3000, ["idle", "cpu-1", "a phase with a long name"])
    comp = pl.DataFrame(
        {
            "phase": ["idle", "cpu-1"] * 2,
            "measure": ["read", "read", "write", "write"],
            "value_ns": [1500.0, 2500.0, 900.0, None],
            "value_lo_ns": [1400.0, 2600.0, 800.0, None],
            "value_hi_ns": [1600.0, 2900.0, 1000.0, None],
        }
    )
    svgs = [
        charts.ecdf(f, ["idle", "cpu-1", "a phase with a long name"], "t: wake-up latency, distribution by phase", "wake-up latency"),
        charts.over_time(f, ["idle", "cpu-1"], "t: wake-up latency over time", "wake-up latency"),
        charts.syscall_bars(comp, ["idle", "cpu-1"], "s: cost per call by phase"),
        charts.share_bars([("a", {"x": 0.5, "y": 0.25}), ("b", {"y": 1.0})], ["x", "y"], "shares", "% of time"),
        charts.trend({"h1": [(0, 1e5, 9e4, 1.1e5), (1, 1.2e5, None, None)]}, ["run 1", "run 2"], "trend", "p99"),
    ]
    for s in svgs:
        root = ET.fromstring(s)
        assert root.tag == f"{NS}svg" and float(root.get("width", 0)) <= 1000
        sizes = [float(t.get("font-size") or root.get("font-size") or 0) for t in root.iter(f"{NS}text")]
        assert sizes and min(sizes) >= FONT
    assert "a phase with a long name" in svgs[0]


def test_a_heat_map_is_a_png_whose_pixels_are_the_colours_given_with_blanks_transparent() -> None:
    rgba = heat(np.array([[0.0, 1.0, np.nan]]))
    data = png(rgba)
    assert data[:8] == b"\x89PNG\r\n\x1a\n" and data[12:16] == b"IHDR"
    w, h = struct.unpack(">II", data[16:24])
    assert (w, h) == (3, 1)
    idat = data.index(b"IDAT")
    (n,) = struct.unpack(">I", data[idat - 4 : idat])
    raw = zlib.decompress(data[idat + 4 : idat + 4 + n])
    assert raw == b"\x00" + rgba.tobytes()
    assert bytes(rgba[0, 0, :3]) == bytes.fromhex(VIRIDIS[0][1:]) and bytes(rgba[0, 1, :3]) == bytes.fromhex(VIRIDIS[-1][1:])
    assert rgba[0, 2, 3] == 0 and rgba[0, 0, 3] == 255


def test_a_bar_or_whisker_of_a_missing_value_draws_nothing_and_does_not_fail() -> None:
    p = Panel.at(0, 0, 100, 50, (0, 1), (0, 1))
    p.rect(0, float("nan"), 0, 1, "#000")
    p.whisker(0.5, float("nan"), 0.5, 1, "#000")
    p.rect(0, 0.5, 0, 1, "#000")
    assert p.svg().count("<rect") == 1 and "<path" not in p.svg()
