"""A user's periodic control loop, instrumented with loopscope's trace API.

Every ``--period-ms`` it wakes on an absolute deadline, logs how late it
woke (``loop/wake``: deadline → running) and does a fixed amount of work
(``loop/work``: a small matrix update), as a controller would. Run it alone
(``loopscope probe program --duration 5s -- python3 periodic.py``) or as a
``program`` probe of an experiment (examples/program.yaml), which sets
LOOPSCOPE_TRACE and stops it with SIGINT when the phase ends.
"""

import argparse
import time

from loopscope.trace import api

ap = argparse.ArgumentParser()
ap.add_argument("--period-ms", type=float, default=2.0)
ap.add_argument("--work", type=int, default=20, help="matrix size: the work per cycle grows with its square")
args = ap.parse_args()

session = api.open()  # the path comes from LOOPSCOPE_TRACE
api.prepare_thread()
wake = api.interval("loop", "wake", "deadline to running")
work = api.interval("loop", "work", "one control update")
state = [[float(i == j) for j in range(args.work)] for i in range(args.work)]
period = int(args.period_ms * 1e6)
mono = time.CLOCK_MONOTONIC
deadline = time.clock_gettime_ns(mono)
cycle = 0
try:
    while True:
        deadline += period
        now = time.clock_gettime_ns(mono)
        if deadline > now:
            time.sleep((deadline - now) / 1e9)
        woke = time.clock_gettime_ns(mono)
        wake.interval_ns(deadline, max(0, woke - deadline), cycle)
        t0 = api.now()
        for row in state:
            s = sum(row) / len(row)
            for j in range(len(row)):
                row[j] = 0.5 * row[j] + 0.5 * s
        work.interval(t0, cycle)
        cycle += 1
except KeyboardInterrupt:
    pass
finally:
    session.close()
