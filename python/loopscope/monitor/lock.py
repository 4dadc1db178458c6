"""One monitor per directory: an advisory lock the kernel drops when its holder dies.

``monitor.lock`` is held with ``flock`` for the monitor's whole life and
says its pid. A second monitor on the directory is refused, naming that
pid; a holder that died (even by ``kill -9``) holds nothing, so
``--resume`` takes the directory over without anyone removing a stale file.
"""

from __future__ import annotations

import fcntl
import os
from pathlib import Path

from loopscope.errors import InputError


class Lock:
    def __init__(self, d: Path) -> None:
        self.path = d / "monitor.lock"
        self.fd: int | None = None
        self.taken_from: int | None = None

    def take(self) -> None:
        fd = os.open(self.path, os.O_RDWR | os.O_CREAT, 0o644)
        try:
            fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
        except BlockingIOError:
            held = os.pread(fd, 64, 0).decode(errors="replace").strip() or "?"
            os.close(fd)
            raise InputError(f"{self.path.parent}: another monitor (pid {held}) is running on this directory; stop it first, or give another -o") from None
        old = os.pread(fd, 64, 0).decode(errors="replace").strip()
        self.taken_from = int(old) if old.isdigit() else None
        os.ftruncate(fd, 0)
        os.pwrite(fd, f"{os.getpid()}\n".encode(), 0)
        os.set_inheritable(fd, False)
        self.fd = fd

    def release(self) -> None:
        if self.fd is not None:
            try:
                os.ftruncate(self.fd, 0)
            except OSError:
                pass
            os.close(self.fd)
            self.fd = None
