"""What the video loop's three programs share: the frame header and clocks.

A frame item is a 24-byte header (frame number, the camera's
CLOCK_REALTIME and CLOCK_MONOTONIC at capture) followed by H×W×3 bytes of
RGB. Netns hosts share CLOCK_REALTIME (a time namespace shifts only the
monotonic clocks), so a REALTIME difference between hosts is a hop's time;
across real machines it is as good as their clock sync (the run's
timeline says how good).
"""

import struct
import time

HEADER = struct.Struct("<QQQ")


def rt() -> int:
    return time.clock_gettime_ns(time.CLOCK_REALTIME)


def mono() -> int:
    return time.clock_gettime_ns(time.CLOCK_MONOTONIC)


def pack(frame: int, rt_ns: int, mono_ns: int, pixels: bytes) -> bytes:
    return HEADER.pack(frame, rt_ns, mono_ns) + pixels


def unpack(item: bytes) -> tuple[int, int, int, memoryview]:
    f, r, m = HEADER.unpack_from(item)
    return f, r, m, memoryview(item)[HEADER.size:]
