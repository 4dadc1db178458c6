"""The display of the video loop: receives the tracked frames, measures
end-to-end time (capture → shown, REALTIME) against a soft deadline and
the frame rate, and keeps sample frames (PNG, next to its trace) for the
report.

Trace: video/e2e (interval: capture → shown; tag frame), video/miss
(event: e2e over the deadline; value ns), video/gap (event: frames that
never arrived before this one; value: how many).
"""

import argparse
import os
from pathlib import Path

import numpy as np

from common import mono, rt, unpack
from loopscope import channels
from loopscope.trace import api

ap = argparse.ArgumentParser()
ap.add_argument("--listen", required=True)
ap.add_argument("--size", default="320x240")
ap.add_argument("--deadline-ms", type=float, default=100.0, help="soft deadline, capture → shown")
ap.add_argument("--keep-every", type=int, default=90, help="keep one frame in this many")
args = ap.parse_args()
W, H = (int(x) for x in args.size.split("x"))

session = api.open()
e2e_iv = api.interval("video", "e2e", "capture to shown (REALTIME)")
miss_ev = api.event("video", "miss", "e2e over the soft deadline; value: ns")
gap_ev = api.event("video", "gap", "frames that never arrived before this one; value: how many")
keep = Path(os.environ["LOOPSCOPE_TRACE"]).with_suffix("").parent / (Path(os.environ["LOOPSCOPE_TRACE"]).stem + "-frames")
keep.mkdir(parents=True, exist_ok=True)

hub = channels.Hub(listen=args.listen)
shown = hub.create("display", capacity=4, full="drop-oldest", max_item=64 << 20).consumer()
deadline = int(args.deadline_ms * 1e6)
last = None
n = kept = 0
try:
    while True:
        try:
            item = shown.get(consume=True, timeout=0.5)
        except channels.ChannelTimeout:
            continue
        f, crt, _, px = unpack(item.data)
        d = max(rt() - crt, 0)
        e2e_iv.interval_ns(mono() - d, d, f)
        if d > deadline:
            miss_ev.event(f, value=d)
        if last is not None and f > last + 1:
            gap_ev.event(f, value=f - last - 1)
        last = f if last is None else max(last, f)
        if n % args.keep_every == 0 and kept < 12:
            import matplotlib.image

            matplotlib.image.imsave(keep / f"frame-{f:06d}.png", np.frombuffer(px, dtype=np.uint8).reshape(H, W, 3))
            kept += 1
        n += 1
except KeyboardInterrupt:
    pass
finally:
    session.close()
    print(f"display: {n} frames, {kept} kept in {keep}", flush=True)
