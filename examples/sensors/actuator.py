"""The actuator of examples/channels.yaml: takes the newest estimate from
`estimates` (older ones are skipped and counted, as a controller would)
and logs the age of the data it acts on: from the scan's capture on the
sensor to now, in CLOCK_REALTIME (one clock between namespaces of a
machine; across machines as good as their sync, which the run reports).

Trace (LOOPSCOPE_TRACE): actuator/age (interval: capture → acted on, tag:
the scan's number; placed on this clock, ending now).
"""

import struct
import time

from loopscope import channels
from loopscope.trace import api

session = api.open()
age_iv = api.interval("actuator", "age", "scan capture to acted on (tag: its number)")
est = channels.consumer("estimates", capacity=8)
n = 0
try:
    while True:
        try:
            item = est.get(latest=True, consume=True, timeout=1.0)
        except channels.ChannelTimeout:
            continue
        num, stamp, _ = struct.unpack("<QQd", item.data)
        age = time.clock_gettime_ns(time.CLOCK_REALTIME) - stamp
        end = time.monotonic_ns()
        age_iv.interval_ns(end - age, age, num)
        n += 1
except KeyboardInterrupt:
    pass
finally:
    session.close()
    print(f"actuator: {n} estimates", flush=True)
