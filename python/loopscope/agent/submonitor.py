"""A monitor of the host's own, for a controller on another kernel.

A monitor reads its probes' traces as they are written and its kernel's
events, so a host on another kernel is watched by a monitor that runs there:
the host's agent starts ``loopscope monitor`` on the spec the controller
sends (this host as ``local``, its probes and loads), writing into a
directory of this host, and hands back what it appends, a period at a time:
new whole lines of ``periods.jsonl`` and ``outliers.jsonl``, new bytes of
each probe's interval log, and ``monitor.json`` as it stands. Its kept
windows stay here (``out/windows``), attributed here.

The monitor dies with the agent (``setpriv --pdeathsig TERM``: it closes its
open period and tears its lab down), and the agent's clean-up stops it the
same way. It is not marked as the agent's run: its own teardown, not the
agent's kill of the run's processes, takes its probes and loads down.
"""

from __future__ import annotations

import json
import os
import shutil
import signal
import subprocess
import sys
from pathlib import Path

from loopscope import protocol as P
from loopscope.agent.commands import Failure
from loopscope.host import procs

#: the files whose appended bytes come home (interval logs are found under ``histograms/``)
LINE_FILES = ("periods.jsonl", "outliers.jsonl")


class SubMonitor:
    """The agent's part: start, read and stop the host's own monitor (mixed into ``agent.server.Agent``)."""

    sub: subprocess.Popen[bytes] | None = None
    sub_out: Path | None = None

    def start_monitor(self, m: P.StartMonitor) -> P.MonitorLines:
        if self.sub is not None and self.sub.poll() is None:
            raise Failure("monitor", "this host's monitor is already running")
        out = Path(m.out)
        out.mkdir(parents=True, exist_ok=True)
        (out / "spec.yaml").write_text(m.spec)
        again = m.resume and (out / "mon").is_dir()
        argv = [sys.executable, "-m", "loopscope.cli", "monitor", str(out / "spec.yaml"), "--resume" if again else "--out", str(out / "mon")]
        if shutil.which("setpriv"):
            argv = ["setpriv", "--pdeathsig", "TERM", "--", *argv]
        env = {k: v for k, v in os.environ.items() if k not in ("LOOPSCOPE_RUN", "LOOPSCOPE_PDEATHSIG")}
        env["LOOPSCOPE_SUBMONITOR"] = "1"
        # (on the CPUs the agent started with: a monitor moves its agents off its probes' CPUs, and this one's probes need them)
        with open(out / "monitor.log", "ab") as log, procs.start_cpus():
            self.sub = subprocess.Popen(argv, stdin=subprocess.DEVNULL, stdout=log, stderr=subprocess.STDOUT, env=env, close_fds=True)
        self.sub_out = out
        # where the lines begin: what a resumed directory held came home before
        return self._lines({name: _size(out / "mon" / name) for name in _files(out / "mon")}, first=True)

    def read_monitor(self, m: P.ReadMonitor) -> P.MonitorLines:
        return self._lines(m.offsets)

    def stop_monitor(self, m: P.StopMonitor) -> P.MonitorLines:
        self._stop_sub(m.timeout_s)
        return self._lines(m.offsets)

    def _stop_sub(self, timeout_s: float) -> None:
        p = self.sub
        if p is None or p.poll() is not None:
            return
        try:
            p.send_signal(signal.SIGTERM)
            p.wait(timeout=timeout_s)
        except subprocess.TimeoutExpired:
            p.kill()
            p.wait()
        except ProcessLookupError:
            pass

    def _lines(self, offsets: dict[str, int], first: bool = False) -> P.MonitorLines:
        if self.sub is None or self.sub_out is None:
            raise Failure("monitor", "no monitor was started on this host")
        mon = self.sub_out / "mon"
        appended: dict[str, str] = {}
        new: dict[str, int] = {}
        for name in _files(mon):
            at = int(offsets.get(name, 0))
            if first:
                new[name] = at
                continue
            try:
                with open(mon / name, "rb") as f:
                    f.seek(at)
                    data = f.read(8 << 20)
            except OSError:
                continue
            # whole lines only (a line being written comes with the next ask)
            cut = data.rfind(b"\n") + 1
            if cut:
                appended[name] = data[:cut].decode(errors="replace")
            new[name] = at + cut
        record = None
        try:
            record = json.loads((mon / "monitor.json").read_text())
        except (OSError, ValueError):
            pass
        code = self.sub.poll()
        said = ""
        if code is not None:
            try:
                said = (self.sub_out / "monitor.log").read_text(errors="replace")[-2000:]
            except OSError:
                pass
        return P.MonitorLines(appended=appended, offsets=new, record=record, running=code is None, exit_code=code, said=said)

    def cleanup_monitor(self) -> None:
        self._stop_sub(10.0)
        self.sub = None


def _files(mon: Path) -> list[str]:
    """The line files and interval logs of a monitor's directory, relative to it."""
    out = [n for n in LINE_FILES if (mon / n).exists()]
    h = mon / "histograms"
    if h.is_dir():
        out += [f"histograms/{p.name}" for p in sorted(h.glob("*.hlog"))]
    return out


def _size(p: Path) -> int:
    try:
        return p.stat().st_size
    except OSError:
        return 0
