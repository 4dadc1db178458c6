"""Progress on long work, for a person at a terminal.

``explain``, ``report``, ``timeline`` and ``export`` can take seconds on a
long run. Library code says where it is with ``step(phase, done, total)``;
nothing is shown unless a command opened a bar with ``shown(...)``, which
it does only when standard error is a terminal and the output is not
``--json``. So scripts and pipes see only the result, and a person sees the
phase and how far along it is.
"""

from __future__ import annotations

import sys
from collections.abc import Callable, Iterator
from contextlib import contextmanager

_current: Callable[[str, int, int], None] | None = None


def step(phase: str, done: int = 0, total: int | None = None) -> None:
    """Say where the work is (a no-op unless a bar is shown)."""
    if _current is not None:
        _current(phase, done, total or 0)


@contextmanager
def shown(enabled: bool = True) -> Iterator[None]:
    """Show a bar on standard error while the block runs, if it is a terminal."""
    global _current
    if not enabled or not sys.stderr.isatty():
        yield
        return
    from rich.console import Console
    from rich.progress import BarColumn, MofNCompleteColumn, Progress, TextColumn, TimeElapsedColumn

    bar = Progress(TextColumn("{task.description}"), BarColumn(), MofNCompleteColumn(), TimeElapsedColumn(), console=Console(stderr=True), transient=True)
    task = bar.add_task("starting", total=None)

    def update(phase: str, done: int, total: int) -> None:
        bar.update(task, description=phase, completed=done, total=total or None)

    prev, _current = _current, update
    try:
        with bar:
            yield
    finally:
        _current = prev
