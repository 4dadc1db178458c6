"""Durations as users type them."""

from __future__ import annotations

import pytest

from loopscope.units import format_ns, parse_duration_ns


@pytest.mark.parametrize(
    "text, ns",
    [
        ("10s", 10_000_000_000),
        ("500ms", 500_000_000),
        ("2m", 120_000_000_000),
        ("1.5h", 5_400_000_000_000),
        ("250us", 250_000),
        ("250µs", 250_000),
        ("100ns", 100),
        (".5s", 500_000_000),
    ],
)
def test_durations_parse_to_nanoseconds(text: str, ns: int) -> None:
    assert parse_duration_ns(text) == ns


@pytest.mark.parametrize(
    "text, message", [("10", "needs a unit"), ("10 parsecs", "unknown unit"), ("fast", "not a duration"), ("0s", "longer than zero"), ("-1s", "not a duration")]
)
def test_bad_durations_say_what_to_write(text: str, message: str) -> None:
    with pytest.raises(ValueError, match=message):
        parse_duration_ns(text)


@pytest.mark.parametrize(
    "ns, text", [(0.4, "0.40 ns"), (22.25, "22.2 ns"), (999, "999 ns"), (1500, "1.50 µs"), (2_500_000, "2.50 ms"), (3_000_000_000, "3.000 s")]
)
def test_durations_print_in_a_readable_unit(ns: float, text: str) -> None:
    assert format_ns(ns) == text


@pytest.mark.parametrize("ns, text", [(30_000_000_000, "30s"), (1_500_000_000, "1500ms"), (120_000_000_000, "2m"), (250_000, "250us"), (7, "7ns")])
def test_durations_print_back_exactly(ns: int, text: str) -> None:
    from loopscope.units import duration_text

    assert duration_text(ns) == text
    assert parse_duration_ns(text) == ns
