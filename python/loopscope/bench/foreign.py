"""Recordings made the way users make them, for the import tests and ``bench import``.

- ``trace_dat``: events enabled in a tracefs instance of its own while a
  command runs, written out with ``trace-cmd extract`` (``trace-cmd record``
  needs /proc/sys/kernel/ftrace_enabled writable, which some kernels refuse;
  extract reads the same buffers into the same file), then, when asked,
  rewritten by ``trace-cmd convert`` as version 6 or uncompressed;
- ``perf_data``: ``perf sched record`` (or ``perf record -e …``) of a command;
- ``reported``: how many events the recorder's own reader prints for a file
  (``trace-cmd report``, ``perf script``): what an import must count too.

The instance is removed on every way out.
"""

from __future__ import annotations

import os
import re
import shutil
import subprocess
import tempfile
from pathlib import Path

from loopscope.errors import RunError
from loopscope.kernel.capture import tracefs
import signal
import threading

#: what the issue's trace-cmd recording enables (trace-cmd record -e … of each)
TRACE_CMD_EVENTS = ["sched/sched_switch", "sched/sched_wakeup", "sched/sched_migrate_task", "irq", "timer/hrtimer_start", "timer/hrtimer_expire_entry"]
#: the recording's tracefs instance, named for this process (two tests recording at once, each in a
#: process of its own, took each other's instance when they shared one name); `loopscope cleanup` removes
#: one whose process is gone
INSTANCE = f"loopscope-foreign-{os.getpid()}"


def _w(p: Path, v: str) -> None:
    p.write_text(v)


def _run_all(command: list[str], stdout: Path, timeout: float = 600) -> None:
    """Run a command in a session of its own, what it prints kept in
    ``stdout``; on a timeout its whole group is killed (a load's workers
    included), and the timeout said.

    It waits blocked in waitpid: ``Popen.wait(timeout=…)`` polls every
    50 ms, and each poll is a wake-up of this process on whatever CPU,
    the probe's among them, in the recording it makes (the zoo's cases
    named it as a cause)."""

    with open(stdout, "wb") as f:
        p = subprocess.Popen(command, stdout=f, stderr=subprocess.DEVNULL, start_new_session=True)
    expired = threading.Event()

    def expire() -> None:
        expired.set()
        os.killpg(p.pid, signal.SIGKILL)

    timer = threading.Timer(timeout, expire)
    timer.start()
    try:
        p.wait()
    finally:
        timer.cancel()
        try:
            os.killpg(p.pid, signal.SIGKILL)  # whatever it left behind
        except ProcessLookupError:
            pass
    if expired.is_set():
        raise RunError(f"{command[0]} did not end within {timeout:g} s", component="bench")


def trace_dat(
    out: Path,
    command: list[str],
    events: list[str] | None = None,
    buffer_kb: int = 4096,
    clock: str = "local",
    version: int = 7,
    compression: str = "zstd",
    overwrite: bool = True,
    filters: dict[str, str] | None = None,
) -> Path:
    """Record ``command`` into ``out`` (a trace.dat of ``version`` and ``compression``);
    what the command printed is kept beside it, in ``<out>.stdout``."""
    tf = tracefs()
    if tf is None or shutil.which("trace-cmd") is None:
        raise RunError("recording a trace.dat needs tracefs and trace-cmd", component="bench")
    inst = tf / "instances" / INSTANCE
    if inst.exists():
        inst.rmdir()
    inst.mkdir()
    try:
        _w(inst / "trace_clock", clock)
        _w(inst / "buffer_size_kb", str(buffer_kb))
        _w(inst / "options" / "overwrite", "1" if overwrite else "0")
        for e in events or TRACE_CMD_EVENTS:
            if filters and e in filters:  # trace-cmd record -e E -f FILTER
                _w(inst / "events" / e / "filter", filters[e])
            _w(inst / "events" / e / "enable", "1")
        _w(inst / "tracing_on", "1")
        try:
            _run_all(command, out.with_name(out.name + ".stdout"))
        finally:
            _w(inst / "tracing_on", "0")
        raw = out.with_suffix(".v7.dat") if (version, compression) != (7, "zstd") else out
        r = subprocess.run(["trace-cmd", "extract", "-B", INSTANCE, "-o", str(raw)], capture_output=True, text=True, timeout=600)
        if r.returncode != 0 or not raw.exists():
            raise RunError(f"trace-cmd extract failed: {r.stderr.strip()[-300:]}", component="bench")
    finally:
        if inst.exists():
            try:
                inst.rmdir()
            except OSError:
                pass
    if raw != out:
        r = subprocess.run(
            ["trace-cmd", "convert", "--file-version", str(version), "--compression", compression, "-i", str(raw), "-o", str(out)],
            capture_output=True,
            text=True,
            timeout=600,
        )
        raw.unlink(missing_ok=True)
        if r.returncode != 0:
            raise RunError(f"trace-cmd convert failed: {r.stderr.strip()[-300:]}", component="bench")
    return out


def perf_data(out: Path, command: list[str], events: list[str] | None = None) -> Path:
    """``perf sched record`` of ``command`` (``perf record -e`` of ``events`` when given);
    what the command printed is kept beside it, in ``<out>.stdout``."""
    if shutil.which("perf") is None:
        raise RunError("recording a perf.data needs perf (linux-perf)", component="bench")
    rec = ["perf", "record", *[x for e in events for x in ("-e", e)]] if events else ["perf", "sched", "record"]
    r = subprocess.run([*rec, "-o", str(out), "--", *command], capture_output=True, text=True, timeout=600)
    if r.returncode != 0 or not out.exists():
        raise RunError(f"{' '.join(rec)} failed: {r.stderr.strip()[-300:]}", component="bench")
    out.with_name(out.name + ".stdout").write_text(r.stdout)
    return out


EVENT_LINE = re.compile(r"\[\d+\]\s+\S*\s*\d+\.\d+:\s+\w+:")


def reported(path: Path) -> int:
    """The events ``trace-cmd report`` or ``perf script`` prints for ``path``.
    A peer that fails, or prints no event of a file that has some, is an
    error naming it (a count of 0 would read as the import's mistake)."""
    with open(path, "rb") as f:
        magic = f.read(3)
    tool = ["trace-cmd", "report", "-i", str(path)] if magic == b"\x17\x08\x44" else ["perf", "script", "-i", str(path)]
    n = 0
    with tempfile.TemporaryFile() as err:
        with subprocess.Popen(tool, stdout=subprocess.PIPE, stderr=err, text=True) as p:
            assert p.stdout is not None
            for line in p.stdout:
                if tool[0] == "perf" or EVENT_LINE.search(line):
                    n += 1
        if n == 0:
            err.seek(0)
            said = err.read().decode(errors="replace").strip()[-300:]
            raise RunError(f"{' '.join(tool[:2])} printed no event of {path} (exit {p.returncode}): {said or 'it said nothing'}", component="bench")
    return n
