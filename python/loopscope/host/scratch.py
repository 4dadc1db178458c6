"""Scratch directories under the system's temporary directory, named for
the process that made them: ``ls-<what>-<pid>-<random>``.

A bench, an audit or a calibration works in a directory of its own and
removes it on every way out it controls (``directory`` is the standard
library's ``TemporaryDirectory``). A maker killed with SIGKILL cannot: the
killed-bench tests did that on purpose, and every CI run left a bench's and
an audit's directory behind. The maker's pid in the name lets
``loopscope cleanup`` remove the directory of a maker that is gone
(``leftovers``), as it does the shared-memory and swap files named the same
way. A directory whose pid is alive again (a reused pid) is left alone: the
safe mistake. What a bench keeps for the user to look at (the cause zoo's
runs) is named otherwise, and never taken for a leftover.
"""

from __future__ import annotations

import os
import re
import shutil
import tempfile
from pathlib import Path

PATTERN = re.compile(r"^ls-[a-z][a-z0-9-]*?-(\d+)-[a-z0-9_]{8}$")


def directory(what: str) -> tempfile.TemporaryDirectory[str]:
    """A new scratch directory for ``what`` (a short word: ``bench-isolate``,
    ``audit``), removed when the ``with`` block ends."""
    return tempfile.TemporaryDirectory(prefix=f"ls-{what}-{os.getpid()}-")


def leftovers() -> list[Path]:
    """Scratch directories whose maker is gone."""
    out = []
    for p in sorted(Path(tempfile.gettempdir()).glob("ls-*-*-*")):
        m = PATTERN.match(p.name)
        if m and p.is_dir() and not p.is_symlink() and not Path(f"/proc/{m.group(1)}").exists():
            out.append(p)
    return out


def remove(p: Path) -> None:
    shutil.rmtree(p, ignore_errors=True)
