"""Values made once per key, however many threads ask for them.

A report builds its derived documents (the global timeline, explain) on a
thread of their own while its main thread loads and compares the run's
tables (``report/derived.py``), and both read the same run documents and
traces. The run's document cache (``rundir.read_once``) and the traces'
(``trace.reader.shared``) are ``Once``: the first thread to ask for a key
makes its value, a second asking meanwhile waits for that value instead of
making it again, and different keys are made side by side. A value whose
making raised is not kept: the next to ask makes it again.
"""

from __future__ import annotations

import threading
from collections.abc import Callable, Hashable
from typing import Any, TypeVar

T = TypeVar("T")


class Once:
    """A cache of values by key, each made by one thread."""

    def __init__(self) -> None:
        self._values: dict[Hashable, Any] = {}
        self._lock = threading.Lock()
        self._making: dict[Hashable, threading.Lock] = {}

    def get(self, key: Hashable, make: Callable[[], T]) -> T:
        """The value of ``key``, made by ``make`` if no thread made it yet."""
        with self._lock:
            if key in self._values:
                got: T = self._values[key]
                return got
            mine = self._making.setdefault(key, threading.Lock())
        with mine:
            with self._lock:
                if key in self._values:
                    got = self._values[key]
                    return got
            value = make()
            with self._lock:
                self._values[key] = value
                self._making.pop(key, None)
        return value
