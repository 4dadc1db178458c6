"""The reader never crashes: fuzzed traces read or fail with a clean InputError.

Two kinds of mutation of a small valid trace that holds every record kind:
raw byte damage (flips, cuts, insertions: the checksums catch most of it),
and damage inside chunks whose checksums are then recomputed, which reaches
the record decoder itself (bad types, lengths running past the chunk,
unknown entities).
"""

from __future__ import annotations

import struct
from pathlib import Path

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

import loopscope.trace as lt
from loopscope.errors import InputError

_T = []
for n in range(256):
    c = n
    for _ in range(8):
        c = (c >> 1) ^ (0x82F63B78 if c & 1 else 0)
    _T.append(c)


def crc32c(b: bytes) -> int:
    c = 0xFFFFFFFF
    for x in b:
        c = (c >> 8) ^ _T[(c ^ x) & 0xFF]
    return c ^ 0xFFFFFFFF


@pytest.fixture(scope="module")
def sample(tmp_path_factory: pytest.TempPathFactory) -> bytes:
    p = tmp_path_factory.mktemp("fuzz") / "s.lstrace"
    with lt.open(p, ring_groups=["fz-ring"]):
        ev = lt.event("fz", "ev")
        iv = lt.interval("fz", "iv")
        ct = lt.counter("fz", "ct")
        hs = lt.histogram("fz", "hs", max=10_000, sub_bits=5)
        rg = lt.event("fz-ring", "r")
        for i in range(50):
            ev(i)
            ev.event(i, value=-i)
            ev.event(i, payload=bytes(range(i % 20)))
            iv.interval_ns(i * 1000, i)
            ct.add(i)
            hs.add(i * 37)
            rg(i)
        ct.log()
        hs.log()
        lt.trigger("ring", 1)
    return p.read_bytes()


def chunks(data: bytes) -> list[tuple[int, int]]:
    """(header offset, payload length) of each chunk of an intact file."""
    out, pos = [], 16
    while pos + 32 <= len(data):
        ln = struct.unpack_from("<I", data, pos + 12)[0]
        out.append((pos, ln))
        pos += 32 + ln
    return out


def reseal(data: bytearray, pos: int, ln: int) -> None:
    struct.pack_into("<I", data, pos + 16, crc32c(bytes(data[pos + 32 : pos + 32 + ln])))
    struct.pack_into("<I", data, pos + 28, crc32c(bytes(data[pos : pos + 28])))


def read_or_clean_error(tmp_path: Path, data: bytes) -> None:
    p = tmp_path / "f.lstrace"
    p.write_bytes(data)
    try:
        df = lt.read(p)
        inf = lt.info(p)
        assert inf.records == len(df)
    except InputError as e:
        assert str(e).startswith(str(p)), str(e)


FUZZ = settings(max_examples=150, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture])


@FUZZ
@given(data=st.data())
def test_random_byte_damage_never_crashes_the_reader(tmp_path: Path, sample: bytes, data: st.DataObject) -> None:
    b = bytearray(sample)
    for _ in range(data.draw(st.integers(1, 8))):
        op = data.draw(st.sampled_from(["flip", "cut", "insert", "zero"]))
        i = data.draw(st.integers(0, max(0, len(b) - 1)))
        if op == "flip":
            b[i] ^= 1 << data.draw(st.integers(0, 7))
        elif op == "cut":
            del b[i:]
        elif op == "insert":
            b[i:i] = data.draw(st.binary(min_size=1, max_size=64))
        else:
            b[i : i + 64] = bytes(len(b[i : i + 64]))
        if not b:
            break
    read_or_clean_error(tmp_path, bytes(b))


@FUZZ
@given(data=st.data())
def test_damage_behind_valid_checksums_never_crashes_the_reader(tmp_path: Path, sample: bytes, data: st.DataObject) -> None:
    b = bytearray(sample)
    cs = [c for c in chunks(sample) if c[1] > 0]
    for _ in range(data.draw(st.integers(1, 4))):
        pos, ln = data.draw(st.sampled_from(cs))
        k = data.draw(st.integers(0, ln - 1))
        b[pos + 32 + k] = data.draw(st.integers(0, 255))
        reseal(b, pos, ln)
    read_or_clean_error(tmp_path, bytes(b))
