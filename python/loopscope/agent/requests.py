"""The controller's requests as the agent reads them: JSON lines on its
standard input, read straight from the descriptor, so that a handler that
sleeps on the descriptor (``watch``) knows whether a request already waits."""

from __future__ import annotations

import os


class Requests:
    """The controller's requests, a line at a time, read straight from the
    descriptor (no hidden buffer), so ``watch`` can sleep on it and know
    whether a request is already waiting."""

    def __init__(self, fd: int) -> None:
        self.fd = fd
        self._buf = b""

    def waiting(self) -> bool:
        return b"\n" in self._buf

    def next(self) -> str | None:
        """The next line (None at the end of input)."""
        while b"\n" not in self._buf:
            chunk = os.read(self.fd, 65536)
            if not chunk:
                if not self._buf:
                    return None
                line, self._buf = self._buf, b""
                return line.decode(errors="replace")
            self._buf += chunk
        line, _, self._buf = self._buf.partition(b"\n")
        return line.decode(errors="replace")
