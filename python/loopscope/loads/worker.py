"""A load worker process: ``python -m loopscope.loads.worker KIND [options]``.

Runs one native load worker until SIGTERM/SIGINT (or ``--seconds``) and
prints its report as one JSON line: units of work done, busy and elapsed
time. Kept free of heavy imports so that starting many workers is cheap.
"""

from __future__ import annotations

import argparse
import json
import sys


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(prog="loopscope-load-worker")
    p.add_argument("kind", choices=["cpu", "memory", "io", "net", "mix"])
    p.add_argument("--duty", type=float, default=None, help="busy fraction, 0 < duty <= 1")
    p.add_argument("--seconds", type=float, default=None)
    p.add_argument("--dir", default=None)
    p.add_argument("--fsync", action="store_true")
    p.add_argument("--count", type=int, default=10_000_000)
    p.add_argument("--rate-bps", type=float, default=None, help="net: payload bits per second (default: unlimited)")
    p.add_argument("--size", type=int, default=1400)
    p.add_argument("--protocol", choices=["udp", "tcp"], default="udp")
    p.add_argument("--dest", default=None, help="net: HOST:PORT (default: a sink of its own on loopback)")
    a = p.parse_args(argv)
    # (named by LOOPSCOPE_COMM at the package's import, before the native worker starts its threads: they take this name)
    from loopscope import _native
    from loopscope.errors import LoopscopeError

    try:
        r = _native.load_worker(a.kind, a.duty, a.seconds, a.dir, a.fsync, a.count, a.rate_bps, a.size, a.protocol, a.dest)
    except LoopscopeError as e:
        sys.stderr.write(f"loopscope load {a.kind}: error: {e}\n")
        return e.exit_code
    print(json.dumps(r), flush=True)
    if r["error"]:
        sys.stderr.write(f"loopscope load {a.kind}: error: {r['error']}\n")
        return 1
    return 0


if __name__ == "__main__":
    sys.exit(main())
