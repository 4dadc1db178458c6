"""The tracker of the video loop: finds the red ball in every frame (colour
segmentation), draws its box, forwards the frame to the display, and when
the ball nears the edge of the view (or looks too small or large) sends a
pan/tilt/zoom command back to the camera.

Trace: video/hop (interval: capture → here, REALTIME; tag frame),
video/track (interval: segmentation and drawing), video/lost (event: no
ball in the frame), video/command (event per command, tag frame).

--edge sets how near: a command goes out when the ball's centre is outside
the middle (1 − 2·edge) of the view; the pan/tilt asked for is --gain
times the ball's offset from the centre (1: re-centre at once). The
example uses a narrow middle and half steps, a proportional controller
that commands several times a second, so the control-loop delay has
enough samples per phase.
"""

import argparse
import struct

import numpy as np

from common import mono, pack, rt, unpack
from loopscope import channels
from loopscope.errors import RunError
from loopscope.trace import api

ap = argparse.ArgumentParser()
ap.add_argument("--listen", required=True)
ap.add_argument("--display", required=True)
ap.add_argument("--camera", required=True, help="the camera's hub, for commands")
ap.add_argument("--size", default="320x240")
ap.add_argument("--transport", default="udp")
ap.add_argument("--edge", type=float, default=0.2, help="command when the ball is this share of the view from an edge, or nearer")
ap.add_argument("--gain", type=float, default=1.0, help="pan/tilt asked for, as a share of the ball's offset from the centre")
ap.add_argument("--gap", type=int, default=5, help="frames at least between two commands")
args = ap.parse_args()
W, H = (int(x) for x in args.size.split("x"))

session = api.open()
hop_iv = api.interval("video", "hop", "capture to the tracker (REALTIME)")
track_iv = api.interval("video", "track", "segmentation and drawing")
lost_ev = api.event("video", "lost", "no ball in the frame")
cmd_ev = api.event("video", "command", "a pan/tilt/zoom command sent")
fail_ev = api.event("video", "command_failed", "a command that could not be sent")

hub = channels.Hub(listen=args.listen)
frames = hub.create("frames", capacity=4, full="drop-oldest", max_item=64 << 20).consumer()
display = None
camera = None
sent_cmd_at = -100
n = 0
try:
    while True:
        try:
            item = frames.get(consume=True, timeout=0.5)
        except channels.ChannelTimeout:
            continue
        f, crt, _, px = unpack(item.data)
        d = rt() - crt
        hop_iv.interval_ns(mono() - max(d, 0), max(d, 0), f)
        t0 = api.now()
        img = np.frombuffer(px, dtype=np.uint8).reshape(H, W, 3).copy()
        mask = (img[..., 0] > 160) & (img[..., 1] < 90) & (img[..., 2] < 90)
        ys, xs = np.nonzero(mask)
        if len(xs) < 5:
            lost_ev(f)
        else:
            x0, x1, y0, y1 = xs.min(), xs.max(), ys.min(), ys.max()
            img[y0:y1 + 1, [x0, x1]] = (255, 255, 0)
            img[[y0, y1], x0:x1 + 1] = (255, 255, 0)
            cx, cy, size = (x0 + x1) / 2, (y0 + y1) / 2, max(x1 - x0, y1 - y0)
            e = args.edge
            near = cx < e * W or cx > (1 - e) * W or cy < e * H or cy > (1 - e) * H
            dz = 1.25 if size < 20 else 0.8 if size > 80 else 1.0
            if (near or dz != 1.0) and f - sent_cmd_at >= args.gap:
                try:
                    if camera is None:
                        camera = channels.producer(args.camera, "ptz", transport="tcp", timeout=2)
                    camera.put(f, struct.pack("<Qddd", f, args.gain * (cx - W / 2), args.gain * (cy - H / 2), dz), timeout=1)
                    cmd_ev(f)
                except RunError as e:  # the camera is gone (stopped first at the end) or unreachable
                    fail_ev(f)
                    print(f"tracker: command for frame {f} not sent: {e}", flush=True)
                    camera = None
                sent_cmd_at = f
        track_iv.interval(t0, f)
        if display is None:
            display = channels.producer(args.display, "display", transport=args.transport, timeout=10)
        display.put(f, pack(f, crt, 0, img.tobytes()), timeout=2)
        n += 1
except KeyboardInterrupt:
    pass
finally:
    session.close()
    print(f"tracker: {n} frames; network {hub.net_stats()}", flush=True)
