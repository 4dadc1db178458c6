"""A swap file of loopscope's own, for as long as a bench case needs one.

The cause zoo's ``faults`` case pages a probe's memory out, which needs
swap; most test machines have none. ``create`` makes a file in /var/tmp
named for the process that owns it (``loopscope-<pid>.swap``), turns it
on, and ``remove`` turns it off and deletes it; the owner removes it on
every way out it controls, and ``loopscope cleanup`` removes the file of
an owner that is gone (``leftovers``).
"""

from __future__ import annotations

import os
import re
import shutil
import subprocess
from pathlib import Path

from loopscope.errors import RunError

DIR = Path("/var/tmp")
PATTERN = re.compile(r"^loopscope-(\d+)\.swap$")


def missing() -> str | None:
    """Why this machine cannot have a swap file of ours, or None."""
    if os.geteuid() != 0:
        return "a swap file needs root"
    for tool in ("mkswap", "swapon", "swapoff"):
        if shutil.which(tool) is None:
            return f"{tool} is not installed (util-linux)"
    if not Path("/proc/swaps").exists():
        return "this kernel has no swap (CONFIG_SWAP off)"
    return None


def create(mb: int) -> Path:
    """A swap file of ``mb`` MiB, on."""
    p = DIR / f"loopscope-{os.getpid()}.swap"
    remove(p)
    try:
        with open(p, "wb") as f:
            os.posix_fallocate(f.fileno(), 0, mb << 20)
        p.chmod(0o600)
        for cmd in (["mkswap", str(p)], ["swapon", str(p)]):
            r = subprocess.run(cmd, capture_output=True, text=True)
            if r.returncode != 0:
                raise RunError(f"{' '.join(cmd)} failed: {(r.stderr or r.stdout).strip()[-300:]}")
    except (OSError, RunError):
        remove(p)
        raise
    return p


def active() -> list[str]:
    """Swap areas the kernel uses now (paths)."""
    try:
        return [ln.split()[0] for ln in Path("/proc/swaps").read_text().splitlines()[1:] if ln.strip()]
    except OSError:
        return []


def remove(p: Path) -> None:
    """Off, then deleted (each step only if needed)."""
    if str(p) in active():
        r = subprocess.run(["swapoff", str(p)], capture_output=True, text=True)
        if r.returncode != 0:  # said, never left silently: the file stays on until `loopscope cleanup`
            raise RunError(f"swapoff {p} failed: {(r.stderr or r.stdout).strip()[-300:]}; `loopscope cleanup` turns it off and deletes it")
    try:
        p.unlink()
    except FileNotFoundError:
        pass


def leftovers() -> list[Path]:
    """Our swap files whose owner is gone."""
    out = []
    for p in sorted(DIR.glob("loopscope-*.swap")):
        m = PATTERN.match(p.name)
        if m and not Path(f"/proc/{m.group(1)}").exists():
            out.append(p)
    return out
