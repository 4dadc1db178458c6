"""The kernel capture's reader: ``python -m loopscope.kernel.drain``.

One process per capture, named ``ls-kcapture`` and scheduled SCHED_IDLE.
It owns the tracefs instance: creates it (``trace_clock`` mono, the buffer
size it is given, ``buffer_percent`` 50, the events enabled), copies the
kernel's format descriptions next to the capture, and removes the instance
on every way out (a ``stop`` line, SIGTERM when its agent dies, an error).

It reads the buffers only when asked (a ``drain LABEL`` line on stdin, sent
by the lab between probe windows, read at the normal policy so a CPU-bound
load cannot hold it up) or when a CPU's buffer is half full (the kernel
wakes a ``poll`` only then; that read stays at SCHED_IDLE). Where its cgroup
has the cpu controller, the agent also marks the group ``cpu.idle`` except
while it waits for an asked drain, because task policies only order tasks
within one group. Each read becomes a segment: the pages
decoded in Rust (``loopscope._native.KtraceDecoder``) into
``events/NNNNN.parquet`` (zstd) and one line in ``segments.jsonl`` with
its time span, why it was read, when and for how long the reader ran, its
losses placed on their CPUs and the buffers' own overrun counters. A
segment file is written under a temporary name and renamed, so a kill
leaves whole files only; a write that fails (a full disk) keeps the line,
with the events counted as lost over the segment's span.

Replies are JSON lines on stdout: ``{"ready": …}`` once, then one per drain.

To watch a program (``--watch``, a monitor's ``threads`` probe) it records
only the threads in the instance's ``set_event_pid`` (with
``options/event-fork``, every thread and process they start joins them),
which the probe fills as it starts or finds its target: the kernel then
records a switch only when a watched thread is one of its two sides, a
wake-up only when a watched thread is woken, a timer only when one arms
it. It starts with one pid no task has (``pid_max`` − 1): an empty list
would record everyone. It reads every ``WATCH_READ_S`` at the normal
policy, a segment each time, so the monitor sees the program's activations
while the period runs.

As a flight recorder (``--flight``, for ``loopscope monitor``) it never
writes a segment of everything: a ``keep T0 T1 DIR`` line takes the window
[T0, T1] (kernel ns) out of what it holds into a store of its own in DIR.
With ``alternate`` and ``pause`` it never reads on its own: the buffers
overwrite their oldest pages, and a keep reads all of them.
With ``alternate`` a twin instance (``<name>-b``) takes over before the
recording one is stopped and read, so nothing goes unrecorded (the idle
twin's events stay enabled: turning them on at the switch waited seconds
for the kernel under a busy scheduler).
With ``pause`` the one instance is paused (``tracing_on`` 0) for as long
as the read takes. Either way the events after the window are held back
in memory for the next keep (a read consumes the pages), and the reply
says whether every CPU's buffer still reached back to T0 and when tracing
was paused: the monitor's keeper turns both into the window's losses.
With ``drain`` the one instance is read every ``DRAIN_EVERY_S`` at the
normal policy and its pages kept in memory as they came, undecoded, for
``--reach-ms`` (``Ring``): a keep reads once more, then takes the pages
whose span meets the window (a page's header carries its first time) and
decodes those alone, so its cost is the window's events, not a whole
buffer's; what the kernel overwrote before a read took it is a loss placed
on its CPU between the two reads, from the buffer's overrun counter, and
a window older than the ring reaches is ``short``.
"""

from __future__ import annotations

import argparse
import json
import os
import select
import signal
import sys
import time
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path


from loopscope.kernel.tracing import Drained, Kept, Ready, tracefs
from loopscope.errors import Stopped
from loopscope.selfname import set_comm
from loopscope.lineage import die_with_parent

from loopscope.kernel.instance import DRAIN_EVERY_S, WATCH_READ_S, Reader


class Stop(Stopped):
    """A signal asked the reader to stop: it drains what is left and removes its instance."""


def _on_signal(signum: int, frame: object) -> None:
    raise Stop(signal.Signals(signum).name)


@contextmanager
def _prompt(idle_after: bool = True) -> Iterator[None]:
    """Between windows the lab waits for the drain: run it at the normal
    policy (at SCHED_IDLE a CPU-bound load could starve it for seconds), then
    go back to SCHED_IDLE for whatever the buffers force it to do later."""
    try:
        os.sched_setscheduler(0, os.SCHED_OTHER, os.sched_param(0))
    except (OSError, AttributeError):
        pass
    try:
        yield
    finally:
        if idle_after:
            try:
                os.sched_setscheduler(0, os.SCHED_IDLE, os.sched_param(0))
            except (OSError, AttributeError):
                pass


def _say(obj: Ready | Drained | Kept) -> None:
    sys.stdout.write(json.dumps(obj) + "\n")
    sys.stdout.flush()


def _command(r: Reader, cmd: str, arg: str, label: str) -> tuple[str, bool]:
    """One line from the agent or the keeper, answered: (the label of the reads to come, whether to stop)."""
    if cmd == "keep":
        # polars and the store: loaded by a flight recorder only (a run's reader writes natively)
        from loopscope.kernel import kept as keeping

        # at the normal policy: at SCHED_IDLE a busy machine left it a few per cent of a CPU, and keeps took minutes
        seq, t0, t1, margin, dest = arg.split(" ", 4)
        try:
            with _prompt(idle_after=r.flight != "drain"):  # a draining recorder stays at the normal policy
                kept = keeping.keep(r, int(t0), int(t1), Path(dest), int(margin))
            kept["seq"] = int(seq)
            _say(kept)
        except OSError as e:
            _say({"error": f"keeping a window in {dest}: {e}", "seq": int(seq)})
    elif cmd == "drain":
        with _prompt():
            _say(r.drain("asked", arg))
        return arg, False
    elif cmd == "stop" and r.flight is not None:
        _say({"totals": r.totals})
        return label, True
    elif cmd == "stop":
        with _prompt():
            last = r.drain("asked", "end")
        _say({**last, "totals": r.totals, "half_full": r.half_full})
        return label, True
    return label, False


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(prog="loopscope-kcapture", description="the kernel capture's reader (started by the lab)")
    ap.add_argument("--instance", required=True)
    ap.add_argument("--out", required=True)
    ap.add_argument("--buffer-mb", type=int, required=True)
    ap.add_argument("--events", required=True)
    ap.add_argument("--continuously", action="store_true", help="read whenever there is data (at SCHED_IDLE), not only when asked or half full")
    ap.add_argument(
        "--watch", action="store_true", help="record only the threads in the instance's set_event_pid (and those they start); read every half second"
    )
    ap.add_argument("--reach-ms", type=int, default=8000, help="a draining flight recorder keeps this much of the past in memory")
    ap.add_argument("--cpus", default="", help="record only what concerns these CPUs (1,3): events there, wake-ups aimed there [every CPU]")
    ap.add_argument(
        "--flight",
        choices=["alternate", "pause", "drain"],
        default=None,
        help="a flight recorder: the buffers overwrite, read only by a keep line; alternate: two instances, one recording while the other is read; pause: one, paused while read",
    )
    a = ap.parse_args(argv)

    set_comm("ls-kcapture")

    if not die_with_parent(signal.SIGTERM):
        return 1  # the agent died while this started: nothing to read for
    signal.signal(signal.SIGTERM, _on_signal)
    signal.signal(signal.SIGINT, _on_signal)
    try:
        if not a.watch and a.flight != "drain":  # a watching or draining reader reads while probes run: at the normal policy
            os.sched_setscheduler(0, os.SCHED_IDLE, os.sched_param(0))
    except (OSError, AttributeError) as e:
        sys.stderr.write(f"ls-kcapture: SCHED_IDLE refused ({e}); the reader runs at the normal policy\n")

    tf = tracefs()
    if tf is None:
        _say({"error": "tracefs is not mounted"})
        return 1
    if a.flight:
        from loopscope.kernel import kept as keeping

        # the window tables' pool started before the capture lists the reader's own threads
        keeping.start_pool()
    r = Reader(tf, a.instance, Path(a.out), a.buffer_mb, [e for e in a.events.split(",") if e], a.continuously, a.flight, a.watch)
    r.reach_ns = a.reach_ms * 1_000_000
    r.cpus = [int(c) for c in a.cpus.split(",") if c.strip()]
    label = ""
    try:
        _say(r.create())
        poller = select.poll()
        poller.register(0, select.POLLIN)
        for fd in r.fds.values() if r.flight is None else []:
            poller.register(fd, select.POLLIN)
        pending = b""
        draining = r.flight == "drain"
        next_pull = time.monotonic() + DRAIN_EVERY_S
        while True:
            ready = poller.poll(max(0, int((next_pull - time.monotonic()) * 1000)) if draining else None)
            if draining and time.monotonic() >= next_pull:
                r.pull()
                next_pull = time.monotonic() + DRAIN_EVERY_S
            fds = {fd for fd, _ in ready}
            if 0 in fds:
                chunk = os.read(0, 4096)
                if not chunk:
                    if r.flight is None:
                        r.drain("the agent went away", label)
                    break
                pending += chunk
                stop = False
                while b"\n" in pending and not stop:
                    line, pending = pending.split(b"\n", 1)
                    cmd, _, arg = line.decode(errors="replace").strip().partition(" ")
                    label, stop = _command(r, cmd, arg, label)
                if stop:
                    break
            elif fds:
                r.drain("continuously" if r.continuously else "half full", label)
                if r.watch:
                    # a line on stdin (stop) is still answered at once
                    select.select([0], [], [], WATCH_READ_S)
                elif r.continuously:
                    time.sleep(0.01)  # batch: at most a hundred reads a second
    except Stop as e:
        try:
            if r.flight is None:
                r.drain(f"stopped by {e}", label)
        except Exception:  # noqa: BLE001 - the instance is removed below whatever happened
            pass
    except Exception as e:  # noqa: BLE001 - said to the agent, then the instance is removed
        _say({"error": f"{type(e).__name__}: {e}"})
        sys.stderr.write(f"ls-kcapture: {type(e).__name__}: {e}\n")
        return 1
    finally:
        r.close()
    return 0


if __name__ == "__main__":
    sys.exit(main())
