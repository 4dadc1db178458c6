"""A file in shared memory that a bench case's program and its injector
both map, for as long as the case runs.

The cause zoo's ``slowdown`` case slows a program's work with no kernel
event in its way: a neighbour on another CPU writes to the cache lines of
the program's table, so each read takes the line back (false sharing).
Both need the same pages: the program maps its table from this file
(``/dev/shm``, so nothing is written back to a disk), the injector maps it
too. ``path`` names it for the process that owns it
(``loopscope-<pid>.shared``); the owner removes it on every way out it
controls, and ``loopscope cleanup`` removes the file of an owner that is
gone (``leftovers``).
"""

from __future__ import annotations

import os
import re
from pathlib import Path

DIR = Path("/dev/shm")
PATTERN = re.compile(r"^loopscope-(\d+)\.shared$")


def path() -> Path:
    """This process's shared file (made by the first program that maps it)."""
    return DIR / f"loopscope-{os.getpid()}.shared"


def remove(p: Path) -> None:
    p.unlink(missing_ok=True)


def leftovers() -> list[Path]:
    """Our shared files whose owner is gone."""
    out = []
    for p in sorted(DIR.glob("loopscope-*.shared")):
        m = PATTERN.match(p.name)
        if m and not Path(f"/proc/{m.group(1)}").exists():
            out.append(p)
    return out
