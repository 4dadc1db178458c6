"""Parsing the quantities users type: durations and sizes.

One place for the accepted spellings, so every option and (later) every
experiment-file field accepts the same ones and explains the same way when
a value is wrong.
"""

from __future__ import annotations

import re

_DURATION_UNITS = {"ns": 1, "us": 1_000, "µs": 1_000, "ms": 1_000_000, "s": 1_000_000_000, "m": 60_000_000_000, "min": 60_000_000_000, "h": 3_600_000_000_000}

_NUM_UNIT = re.compile(r"^\s*([0-9]+(?:\.[0-9]*)?|\.[0-9]+)\s*([a-zµ]*)\s*$")


def parse_duration_ns(text: str) -> int:
    """'10s', '500ms', '2m', '1.5h', '250us', '100ns' -> integer nanoseconds.

    Raises ValueError with a message that says what to write instead.
    """
    m = _NUM_UNIT.match(str(text))
    if not m:
        raise ValueError(f"{text!r} is not a duration; write a number and a unit, e.g. 10s, 500ms, 2m")
    num, unit = m.groups()
    if not unit:
        raise ValueError(f"{text!r} needs a unit, e.g. {num}s or {num}ms (units: ns, us, ms, s, m, h)")
    if unit not in _DURATION_UNITS:
        raise ValueError(f"{text!r}: unknown unit {unit!r} (units: ns, us, ms, s, m, h)")
    ns = float(num) * _DURATION_UNITS[unit]
    if ns <= 0:
        raise ValueError(f"{text!r} must be longer than zero")
    return int(round(ns))


def format_ns(ns: float) -> str:
    """A duration in the unit that keeps 3-4 significant digits."""
    a = abs(ns)
    if a < 10:
        return f"{ns:.2f} ns"
    if a < 100:
        return f"{ns:.1f} ns"
    if a < 1_000:
        return f"{ns:.0f} ns"
    if a < 1_000_000:
        return f"{ns / 1e3:.2f} µs"
    if a < 1_000_000_000:
        return f"{ns / 1e6:.2f} ms"
    return f"{ns / 1e9:.3f} s"


def duration_text(ns: int) -> str:
    """The shortest exact spelling of a duration: 30s, 1500ms, 250us, 7ns."""
    for unit, f in (("h", 3_600_000_000_000), ("m", 60_000_000_000), ("s", 1_000_000_000), ("ms", 1_000_000), ("us", 1_000)):
        if ns >= f and ns % f == 0:
            return f"{ns // f}{unit}"
    return f"{ns}ns"


_BIT_UNITS = {"bit": 1, "b/s": 1, "bps": 1, "kbit": 1e3, "kb/s": 1e3, "kbps": 1e3, "mbit": 1e6, "mb/s": 1e6, "mbps": 1e6, "gbit": 1e9, "gb/s": 1e9, "gbps": 1e9}
_PKT_UNITS = {"pps": 1, "kpps": 1e3, "mpps": 1e6}
_RATE = re.compile(r"^\s*([0-9]+(?:\.[0-9]*)?|\.[0-9]+)\s*([A-Za-z/]+)\s*$")


def parse_rate(text: str) -> tuple[float, str]:
    """'200Mbit', '1Gb/s', '10 Mbps', '1000pps', '1.5kpps' -> (value, 'bps' | 'pps').

    Multipliers are decimal (k = 1000), as network rates are. 'mbit' in
    lower case is refused: it would mean millibits.
    """
    m = _RATE.match(str(text))
    if not m:
        raise ValueError(f"{text!r} is not a rate; write a bit rate like 100Mbit or 1Gb/s, or a packet rate like 1000pps")
    num, unit = float(m.group(1)), m.group(2)
    if num <= 0:
        raise ValueError(f"{text!r} must be more than zero")
    low = unit.lower()
    if low in _PKT_UNITS or low in _BIT_UNITS:
        if unit.startswith("m"):
            raise ValueError(f"{text!r}: 'm' would mean milli; write M for mega (e.g. {m.group(1)}M{unit[1:]})")
        if low in _PKT_UNITS:
            return num * _PKT_UNITS[low], "pps"
        return num * _BIT_UNITS[low], "bps"
    raise ValueError(f"{text!r}: unknown unit {unit!r}; bit rates: bit, kbit, Mbit, Gbit (or b/s, Mb/s, Mbps…), packet rates: pps, kpps, Mpps")


def format_bps(bps: float) -> str:
    for unit, f in (("Gbit/s", 1e9), ("Mbit/s", 1e6), ("kbit/s", 1e3)):
        if abs(bps) >= f:
            return f"{bps / f:.3f} {unit}"
    return f"{bps:.0f} bit/s"


_SIZE = re.compile(r"^\s*([0-9]*\.?[0-9]+)\s*([kKMG]i?B|B)?\s*$")
_SIZE_UNITS = {"B": 1, "kB": 1000, "KB": 1000, "MB": 1000**2, "GB": 1000**3, "KiB": 1024, "kiB": 1024, "MiB": 1024**2, "GiB": 1024**3}


def parse_bytes(text: str | int) -> int:
    """'64KiB', '1MB', '1400B', 1400 -> bytes (kB/MB decimal, KiB/MiB binary)."""
    if isinstance(text, int) and not isinstance(text, bool):
        return text
    m = _SIZE.match(str(text))
    if not m or m.group(2) not in _SIZE_UNITS and m.group(2) is not None:
        raise ValueError(f"{text!r} is not a size; write bytes like 1400, 64KiB or 2MB")
    return int(float(m.group(1)) * _SIZE_UNITS[m.group(2) or "B"])
