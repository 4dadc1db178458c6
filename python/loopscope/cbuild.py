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
import argparse
import sys

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
    cmd = [compiler(), "-O2", "-g", "-pthread", *flags(cflags=True, libs=False, static=static)]
    cmd += [f"-I{p}" for p in include or []]
    cmd += [str(s) for s in sources] + ["-o", str(out)]
    cmd += flags(cflags=False, libs=True, static=static)
    cmd += extra or []
    r = subprocess.run(cmd, capture_output=True, text=True)
    if r.returncode != 0:
        tail = "\n".join((r.stderr or r.stdout).strip().splitlines()[-15:])
        raise RunError(f"compiling {sources[0].name} failed (exit {r.returncode}): {' '.join(cmd)}\n{tail}")
    return out


def flags(*, cflags: bool, libs: bool, static: bool) -> list[str]:
    """The compiler and linker flags of a program using loopscope.h: the
    shared library with its directory as the run path (the program runs
    without LD_LIBRARY_PATH), or with ``static`` the archive and what it needs."""
    inc, lib = c_dirs()
    out = [f"-I{inc}"] if cflags else []
    if libs:
        out += [str(lib / "libloopscope.a"), "-pthread", "-ldl", "-lm"] if static else [f"-L{lib}", f"-Wl,-rpath,{lib}", "-lloopscope"]
    return out


def config_main(argv: list[str] | None = None) -> int:
    """``loopscope-config``: print the flags, like pkg-config's --cflags --libs."""

    ap = argparse.ArgumentParser(
        prog="loopscope-config",
        description="Compiler and linker flags for C and C++ programs that use loopscope.h.",
        epilog="examples:\n  gcc app.c $(loopscope-config --cflags --libs) -o app\n"
        "  g++ app.cpp $(loopscope-config --cflags --libs --static) -o app\n"
        "  PKG_CONFIG_PATH=$(loopscope-config --pkg-config-path) pkg-config --cflags --libs loopscope",
        formatter_class=argparse.RawDescriptionHelpFormatter,
    )
    ap.add_argument("--cflags", action="store_true", help="the include directory (-I…)")
    ap.add_argument("--libs", action="store_true", help="link the shared library, found at run time through the program's run path")
    ap.add_argument("--static", action="store_true", help="with --libs: link the static library instead (and -pthread -ldl -lm)")
    ap.add_argument("--pkg-config-path", action="store_true", help="the directory holding loopscope.pc, for PKG_CONFIG_PATH")
    ap.add_argument("--prefix", action="store_true", help="the directory holding include/ and lib/")
    a = ap.parse_args(argv)
    try:
        inc, lib = c_dirs()
    except RunError as e:
        print(f"loopscope-config: error: {e}", file=sys.stderr)
        return 1
    if not (a.cflags or a.libs or a.pkg_config_path or a.prefix):
        ap.print_usage(sys.stderr)
        print("loopscope-config: error: give --cflags, --libs, --pkg-config-path or --prefix", file=sys.stderr)
        return 2
    out = flags(cflags=a.cflags, libs=a.libs, static=a.static)
    if a.pkg_config_path:
        out.append(str(lib / "pkgconfig"))
    if a.prefix:
        out.append(str(lib.parent))
    print(" ".join(out))
    return 0
