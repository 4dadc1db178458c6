"""Ctrl-C during the long native calls: a probe's measuring loop, the trace
reader, the benches' native loops. Each command is started in a session of
its own and its process group is sent SIGINT (as Ctrl-C in a terminal does)
while it is inside native code; it must end with exit code 130 saying it was
interrupted, without a traceback, keep what it measured, and leave no
process of its session behind."""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest

import loopscope.trace as lt
from loopscope import _native
from tests.conftest import BIN


def _session_left(sid: int) -> list[str]:
    out = []
    for d in Path("/proc").iterdir():
        if d.name.isdigit():
            try:
                fields = (d / "stat").read_text().rsplit(")", 1)[1].split()
            except OSError:
                continue
            if int(fields[3]) == sid and fields[0] != "Z":
                out.append(f"{d.name} {(d / 'comm').read_text().strip()}")
    return out


def _started(pid: int, timeout: float = 30) -> None:
    """Wait until the command has loaded loopscope's native module: its
    imports are behind it (on a busy machine they take seconds)."""
    t_end = time.monotonic() + timeout
    while time.monotonic() < t_end:
        try:
            if "_native" in Path(f"/proc/{pid}/maps").read_text():
                return
        except OSError:
            return
        time.sleep(0.02)


def _interrupt(args: list[str], cwd: Path, after: float) -> subprocess.CompletedProcess[str]:
    p = subprocess.Popen([str(BIN), *args], cwd=cwd, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True, start_new_session=True)
    _started(p.pid)
    time.sleep(after)
    os.killpg(p.pid, signal.SIGINT)  # what Ctrl-C in a terminal does: the whole foreground group
    out, err = p.communicate(timeout=60)
    left = []
    t_end = time.monotonic() + 10
    while time.monotonic() < t_end and (left := _session_left(p.pid)):
        time.sleep(0.1)
    assert not left, f"left running after Ctrl-C: {left}"
    return subprocess.CompletedProcess(p.args, p.returncode, out, err)


def _interrupted(r: subprocess.CompletedProcess[str]) -> None:
    assert r.returncode == 130, (r.returncode, r.stderr[-2000:])
    assert "Traceback" not in r.stderr, r.stderr
    assert "interrupted" in r.stdout + r.stderr, (r.stdout[-500:], r.stderr)


def test_ctrl_c_while_the_trace_reader_decodes_a_large_file_exits_130(tmp_path: Path) -> None:
    big = tmp_path / "big.lstrace"
    ses = lt.open(big, groups=["bench"])
    try:
        _native.bench_sustained(8e6, 1.5)
    finally:
        ses.close()
    assert lt.info(big).records > 5_000_000
    _interrupted(_interrupt(["trace", "dump", str(big), "--limit", "3"], tmp_path, 0.4))


def test_ctrl_c_in_a_probe_keeps_its_trace_readable(tmp_path: Path, lab: None) -> None:
    r = _interrupt(["probe", "timer", "-i", "1000", "-d", "60s", "--trace", "t.lstrace"], tmp_path, 1.5)
    _interrupted(r)
    inf = lt.info(tmp_path / "t.lstrace")
    assert inf.stats["closed"] and inf.records > 500


def test_ctrl_c_while_the_command_is_still_starting_exits_130_without_a_traceback(tmp_path: Path) -> None:
    # at once: the command is still importing its modules
    _interrupted(_interrupt_at_once(["trace", "dump", "nosuch.lstrace"], tmp_path))


def _interrupt_at_once(args: list[str], cwd: Path) -> subprocess.CompletedProcess[str]:
    p = subprocess.Popen([str(BIN), *args], cwd=cwd, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True, start_new_session=True)
    # inside the CLI's imports: numpy is among the first of them, polars and the rest come after
    t_end = time.monotonic() + 10
    while time.monotonic() < t_end and "_multiarray_umath" not in Path(f"/proc/{p.pid}/maps").read_text():
        time.sleep(0.002)
    os.killpg(p.pid, signal.SIGINT)
    out, err = p.communicate(timeout=60)
    return subprocess.CompletedProcess(p.args, p.returncode, out, err)


def test_ctrl_c_in_bench_trace_s_native_loops_exits_130_and_leaves_nothing(tmp_path: Path, lab: None) -> None:
    _interrupted(_interrupt(["bench", "trace", "--quick"], tmp_path, 2.0))


@pytest.mark.needs_tool("cyclictest")
def test_ctrl_c_in_bench_timer_stops_cyclictest_too(tmp_path: Path, lab: None) -> None:
    _interrupted(_interrupt(["bench", "timer", "--duration", "20s", "--runs", "1"], tmp_path, 3.0))


def test_ctrl_c_while_native_code_first_reaches_numpy_exits_130(tmp_path: Path) -> None:
    # The native module finds numpy's array API the first time it makes an array, running numpy's own
    # Python (its version check); a Ctrl-C there panics in the native code instead of raising where the
    # command is. The interrupt is placed there deterministically: numpy's version check raises it.
    trace = tmp_path / "t.lstrace"
    with lt.open(trace):
        lt.event("g", "e")(1)
    code = (
        "import sys, numpy.lib\n"
        "def interrupted(*a):\n"
        "    raise KeyboardInterrupt\n"
        "numpy.lib.NumpyVersion = interrupted\n"
        "from loopscope.cli import main\n"
        f"main(['trace', 'dump', {str(trace)!r}])\n"
    )
    r = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=60)
    _interrupted(subprocess.CompletedProcess(r.args, r.returncode, r.stdout, r.stderr))
