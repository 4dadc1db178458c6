"""The sensor of examples/channels.yaml: puts scans into the declared
channel `scans` at a fixed rate, on absolute deadlines.

Scan sizes cycle through --sizes (e.g. 1KiB,16KiB,128KiB: a small status
record, a depth row, a full scan), so one run gives the channel runtime's
costs per item size. Each scan starts with its number and the
CLOCK_REALTIME of its capture (the actuator measures the end-to-end age).

Trace (LOOPSCOPE_TRACE): sensor/scan (interval: filling one scan, tag: its
number), sensor/late (event: the deadline had passed; value: ns late).
"""

import argparse
import struct
import time

import numpy as np

from loopscope import channels
from loopscope.trace import api
from loopscope.units import parse_bytes

ap = argparse.ArgumentParser()
ap.add_argument("--rate", type=float, default=100.0, help="scans per second")
ap.add_argument("--sizes", default="1KiB,16KiB,128KiB", help="scan sizes, cycled")
args = ap.parse_args()
sizes = [parse_bytes(x) for x in args.sizes.split(",")]

session = api.open()
scan_iv = api.interval("sensor", "scan", "filling one scan (tag: its number)")
late_ev = api.event("sensor", "late", "a deadline had passed; value: ns late")
out = channels.producer("scans")  # declared in the experiment file
rng = np.random.default_rng(7)
noise = rng.integers(0, 255, size=max(sizes), dtype=np.uint8).tobytes()
period = int(1e9 / args.rate)
deadline = time.monotonic_ns()
n = 0
try:
    while True:
        deadline += period
        now = time.monotonic_ns()
        if now > deadline:
            late_ev.event(n, value=now - deadline)
        else:
            time.sleep((deadline - now) / 1e9)
        t0 = api.now()
        size = sizes[n % len(sizes)]
        scan = struct.pack("<QQ", n, time.clock_gettime_ns(time.CLOCK_REALTIME)) + noise[: size - 16]
        scan_iv.interval(t0, n)
        out.put(n, scan, timeout=2)
        n += 1
except KeyboardInterrupt:
    pass
finally:
    session.close()
    print(f"sensor: {n} scans", flush=True)
