"""Building C programs against loopscope's C library.

The build installs ``libloopscope.a``, ``libloopscope.so`` and
``loopscope.h`` inside the package (``loopscope/_c``); benchmarks and tests
compile their C programs against those, exactly as a user's program would.
"""

from __future__ import annotations

import shutil
import subprocess
from pathlib import Path

from loopscope.errors import RunError

PKG = Path(__file__).resolve().parent


def c_dirs() -> tuple[Path, Path]:
    """(include dir, lib dir) of the installed C library."""
    inc, lib = PKG / "_c" / "include", PKG / "_c" / "lib"
    if not (inc / "loopscope.h").exists() or not (lib / "libloopscope.a").exists():
        raise RunError(f"the C library is not built ({PKG / '_c'} is missing); run 'make' in the loopscope checkout")
    return inc, lib


def compiler() -> str:
    for cc in ("cc", "gcc", "clang"):
        p = shutil.which(cc)
        if p:
            return p
    raise RunError("no C compiler found (cc, gcc, clang); install gcc (scripts/install-deps.sh does)")


def build(sources: list[Path], out: Path, *, static: bool = True, extra: list[str] | None = None, include: list[Path] | None = None) -> Path:
    """Compile and link C sources against loopscope; RunError with the compiler's output on failure."""
    inc, lib = c_dirs()
    cmd = [compiler(), "-O2", "-g", "-pthread", f"-I{inc}"]
    cmd += [f"-I{p}" for p in include or []]
    cmd += [str(s) for s in sources] + ["-o", str(out)]
    if static:
        cmd += [str(lib / "libloopscope.a"), "-ldl", "-lm"]
    else:
        cmd += [f"-L{lib}", "-lloopscope", f"-Wl,-rpath,{lib}"]
    cmd += extra or []
    r = subprocess.run(cmd, capture_output=True, text=True)
    if r.returncode != 0:
        tail = "\n".join((r.stderr or r.stdout).strip().splitlines()[-15:])
        raise RunError(f"compiling {sources[0].name} failed (exit {r.returncode}): {' '.join(cmd)}\n{tail}")
    return out
