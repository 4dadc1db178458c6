"""A pipeline's source on its own: it lingers after its last message, so
that its exit (trace close, results, the interpreter's teardown) does not
compete with the stages still carrying the messages in flight."""

from __future__ import annotations

import json
import signal
import socket
import subprocess
import sys
import time
from pathlib import Path

from loopscope.kinds import KINDS
from loopscope.probes.params import Launch

CLI = [sys.executable, "-m", "loopscope.cli", "probe"]


def _free_port() -> int:
    with socket.socket(socket.AF_INET, socket.SOCK_DGRAM) as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


def _source_seconds(tmp: Path, linger: str | None) -> tuple[float, int]:
    """How long a 20-message source takes, and how many the sink received."""
    port = _free_port()
    sink = subprocess.Popen(
        [*CLI, "pipe-sink", "--bind", f"127.0.0.1:{port}", "--json", "--trace", str(tmp / f"sink-{linger}.lstrace")],
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
    )
    try:
        assert sink.stdout and sink.stdout.readline().strip() == "ready"
        argv = [
            *CLI,
            "pipe-source",
            "--dest",
            f"127.0.0.1:{port}",
            "--count",
            "20",
            "--rate",
            "1000pps",
            "--json",
            "--trace",
            str(tmp / f"src-{linger}.lstrace"),
        ]
        t0 = time.monotonic()
        # the clock starts at once; the interpreter's start-up is the same with and without
        src = subprocess.run(argv + (["--linger", linger] if linger else []), capture_output=True, text=True, timeout=60)
        took = time.monotonic() - t0
        assert src.returncode == 0, src.stderr
        assert json.loads(src.stdout)["sent"] == 20
    finally:
        sink.send_signal(signal.SIGINT)
        out, err = sink.communicate(timeout=30)
    return took, json.loads(out.strip().splitlines()[-1])["received"]


def test_a_source_told_to_linger_sleeps_that_long_after_its_last_message(tmp_path: Path, lab: None) -> None:
    # alternating, twice each: a slow start of either interpreter only adds time, so the smallest of each is compared
    runs = [_source_seconds(tmp_path, linger) for linger in (None, "700ms", None, "700ms")]
    assert all(got == 20 for _, got in runs)
    plain, lingering = min(runs[0][0], runs[2][0]), min(runs[1][0], runs[3][0])
    assert lingering - plain > 0.5, runs


def test_the_lab_asks_the_source_to_linger_for_the_messages_in_flight(tmp_path: Path) -> None:
    p = {"kind": "pipe-source", "name": "x.source", "dest": "10.0.0.2:4000", "rate": "1000pps", "size": 256, "flow": 7, "count": None, "linger_ns": 260_000_000}
    argv = KINDS.argv(p, 2_000_000_000, tmp_path / "t.lstrace", tmp_path)
    assert argv is not None
    lc = Launch.model_validate_json(argv[-1])
    assert lc.kind == "pipe-source" and lc.params["linger_ns"] == 260_000_000 and lc.duration_ns == 2_000_000_000
