"""The camera of the video loop (Boie & Niehaus 2007 §3.4): renders a scene with a
moving red ball, sends frames to the tracker, applies its pan/tilt/zoom
commands.

The world is 4× the view; the ball bounces around it, so it leaves the view
unless the tracker's commands follow it. Every 1/fps on absolute deadlines
the camera renders its view (pan/tilt move the window, zoom scales it),
stamps the frame and puts it into the tracker's `frames` channel. It hosts
a `ptz` channel; before each frame it applies every command that arrived,
and logs the control-loop delay: from the capture of the frame a command
was decided on to when the command took effect, both on this clock.

Trace (LOOPSCOPE_TRACE): video/render (interval per frame), video/late
(event: a deadline passed before the frame was sent; value: how late, ns),
video/control_loop (interval: capture of frame N → its command applied,
tag N), video/ptz (event per command, tag N).
"""

import argparse
import struct

import numpy as np

from common import mono, pack, rt
from loopscope import channels
from loopscope.trace import api

ap = argparse.ArgumentParser()
ap.add_argument("--tracker", required=True, help="the tracker's hub HOST:PORT")
ap.add_argument("--listen", required=True, help="this camera's hub (for ptz commands) HOST:PORT")
ap.add_argument("--size", default="320x240")
ap.add_argument("--fps", type=float, default=30.0)
ap.add_argument("--transport", default="udp")
ap.add_argument("--speed", type=float, default=90.0, help="ball speed, world pixels per second")
args = ap.parse_args()
W, H = (int(x) for x in args.size.split("x"))
WW, WH = 4 * W, 4 * H

session = api.open()
render_iv = api.interval("video", "render", "rendering one frame")
loop_iv = api.interval("video", "control_loop", "capture of frame N to its command applied")
late_ev = api.event("video", "late", "a frame deadline passed; value: ns late")
ptz_ev = api.event("video", "ptz", "a command applied; tag: the frame it was decided on")

hub = channels.Hub(listen=args.listen)
ptz = hub.create("ptz", capacity=64, full="drop-oldest").consumer()
out = channels.producer(args.tracker, "frames", transport=args.transport, timeout=15)

captured: dict[int, int] = {}  # frame -> capture mono ns (for the control-loop delay)
pan_x, pan_y, zoom = WW / 2, WH / 2, 1.0
bx, by, vx, vy = WW / 2 + 60, WH / 2, args.speed * 0.8, args.speed * 0.6
rng = np.random.default_rng(1)
noise = rng.integers(0, 24, size=(H, W, 3), dtype=np.uint8)
yy, xx = np.mgrid[0:H, 0:W].astype(np.float32)
period = int(1e9 / args.fps)
deadline = mono()
frame = 0
try:
    while True:
        # apply every command that has arrived
        while True:
            try:
                cmd = ptz.get(consume=True, timeout=0)
            except channels.ChannelTimeout:
                break
            n, dx, dy, dz = struct.unpack("<Qddd", cmd.data)
            pan_x = min(max(pan_x + dx, 0), WW)
            pan_y = min(max(pan_y + dy, 0), WH)
            zoom = min(max(zoom * dz, 0.5), 2.0)
            t = mono()
            if n in captured:
                loop_iv.interval_ns(captured[n], t - captured[n], n)
            ptz_ev(n)
        deadline += period
        now = mono()
        if now > deadline:
            late_ev.event(frame, value=now - deadline)
        # wait for the deadline on the hub: commands are taken in as they come
        while now < deadline:
            hub.pump((deadline - now) / 1e9)
            now = mono()
        t0 = api.now()
        # the world moves
        dt = period / 1e9
        bx += vx * dt
        by += vy * dt
        if not 0 < bx < WW:
            vx = -vx
        if not 0 < by < WH:
            vy = -vy
        # the view: world coordinates of each pixel, ball where it falls
        wx = pan_x + (xx - W / 2) / zoom
        wy = pan_y + (yy - H / 2) / zoom
        img = np.empty((H, W, 3), dtype=np.uint8)
        img[..., 0] = 40 + (wx % 200 < 100) * 30
        img[..., 1] = 90 + (wy % 160 < 80) * 40
        img[..., 2] = 120
        img += noise
        ball = (wx - bx) ** 2 + (wy - by) ** 2 < 18.0 ** 2
        img[ball] = (220, 30, 30)
        stamp_mono, stamp_rt = mono(), rt()
        captured[frame] = stamp_mono
        captured.pop(frame - 600, None)
        out.put(frame, pack(frame, stamp_rt, stamp_mono, img.tobytes()), timeout=2)
        render_iv.interval(t0, frame)
        frame += 1
except KeyboardInterrupt:
    pass
finally:
    session.close()
    print(f"camera: {frame} frames", flush=True)
