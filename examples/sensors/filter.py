"""The filter of examples/channels.yaml: takes every scan from `scans`,
reduces it (a moving mean over its bytes, as a stand-in for real
processing: time grows with the size) and puts a small estimate into
`estimates`, keeping the scan's number and capture stamp.

Trace (LOOPSCOPE_TRACE): filter/process (interval per scan, tag: its number).
"""

import struct

import numpy as np

from loopscope import channels
from loopscope.trace import api

session = api.open()
proc_iv = api.interval("filter", "process", "reducing one scan (tag: its number)")
scans = channels.consumer("scans", capacity=32)
est = channels.producer("estimates")
n = 0
try:
    while True:
        try:
            item = scans.get(consume=True, timeout=1.0)
        except channels.ChannelTimeout:
            continue
        t0 = api.now()
        num, stamp = struct.unpack_from("<QQ", item.data)
        x = np.frombuffer(item.data, dtype=np.uint8, offset=16).astype(np.float32)
        level = float(np.convolve(x, np.ones(8, np.float32) / 8, mode="valid").mean()) if len(x) >= 8 else 0.0
        proc_iv.interval(t0, num)
        est.put(num, struct.pack("<QQd", num, stamp, level), timeout=2)
        n += 1
except KeyboardInterrupt:
    pass
finally:
    session.close()
    print(f"filter: {n} scans", flush=True)
