"""The reaper: cleans up a run whose controller was killed.

Agents, probes, loads and the emulator die with the controller (the kernel
signals them), but network namespaces are files under /run/netns that
outlive every process. So a run with namespaces starts this small process
in a session of its own (Ctrl-C and the run's cgroups do not reach it) and
keeps the write end of a pipe to its standard input. When the pipe closes
without the controller having released it first, the controller is gone
however it went, and the reaper does what ``loopscope cleanup`` would do
for that run: stop what is left, delete the namespaces, remove the cgroups,
mark the run abandoned.
"""

from __future__ import annotations

import os
import subprocess
import sys


class Reaper:
    def __init__(self, run_id: str) -> None:
        env = {k: v for k, v in os.environ.items() if k not in ("LOOPSCOPE_RUN", "LOOPSCOPE_PDEATHSIG")}
        self.p = subprocess.Popen(
            [sys.executable, "-m", "loopscope.lab.reaper", run_id],
            stdin=subprocess.PIPE,
            stdout=subprocess.DEVNULL,
            stderr=subprocess.DEVNULL,
            env=env,
            start_new_session=True,
            close_fds=True,
        )

    def release(self) -> None:
        """The run ended and cleaned up after itself: the reaper may go."""
        try:
            assert self.p.stdin is not None
            self.p.stdin.write(b"released\n")
            self.p.stdin.close()
        except (BrokenPipeError, OSError):
            pass
        try:
            self.p.wait(timeout=5)
        except subprocess.TimeoutExpired:
            self.p.kill()


def main(run_id: str) -> int:
    data = sys.stdin.buffer.read()  # until the controller releases us or dies
    if b"released" in data:
        return 0
    from loopscope.lab import cleanup, state

    for info in state.registered():
        if info.run_id == run_id:
            cleanup.clean_run(info, dry_run=False, reason="its controller died")
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1]))
