"""The C and C++ examples, built as a user builds them: with the flags
``loopscope-config`` or pkg-config give, against the installed package, and
run without LD_LIBRARY_PATH."""

from __future__ import annotations

import os
import shutil
import subprocess
from pathlib import Path

import polars as pl
import pytest

import loopscope.trace as lt
from tests.conftest import BIN, ROOT

EXAMPLES = ROOT / "examples" / "c"
CONFIG = BIN.parent / "loopscope-config"


def _sh(cmd: str, cwd: Path) -> subprocess.CompletedProcess[str]:
    env = {k: v for k, v in os.environ.items() if k not in ("LD_LIBRARY_PATH", "PKG_CONFIG_PATH", "LOOPSCOPE_TRACE")}
    env["PATH"] = f"{BIN.parent}:{env.get('PATH', '')}"
    return subprocess.run(["bash", "-c", cmd], cwd=cwd, capture_output=True, text=True, timeout=120, env=env)


@pytest.mark.needs_tool("cc")
def test_the_c_example_builds_with_loopscope_config_and_runs_without_ld_library_path(tmp_path: Path) -> None:
    r = _sh(f"cc {EXAMPLES / 'periodic.c'} $(loopscope-config --cflags --libs) -o periodic && ./periodic p.lstrace 1000 0.5", tmp_path)
    assert r.returncode == 0, r.stderr
    n = int(r.stdout.split()[0])
    df = lt.read(tmp_path / "p.lstrace")
    wake = df.filter(pl.col("name") == "wakeup")
    assert len(wake) == n and len(df.filter(pl.col("name") == "work")) == n and n > 300
    assert wake["dur_ns"].min() >= 0


FLAGS = {
    "pkg-config": "$(PKG_CONFIG_PATH=$(loopscope-config --pkg-config-path) pkg-config --cflags --libs loopscope)",
    "static": "$(loopscope-config --cflags --libs --static)",
}


@pytest.mark.needs_tool("c++", "pkg-config")
@pytest.mark.parametrize("how", list(FLAGS))
def test_the_cplusplus_example_builds_and_logs_every_frame(tmp_path: Path, how: str) -> None:
    r = _sh(f"c++ -std=c++17 {EXAMPLES / 'frames.cpp'} {FLAGS[how]} -o frames && ./frames f.lstrace 300", tmp_path)
    assert r.returncode == 0, r.stderr
    df = lt.read(tmp_path / "f.lstrace")
    for name in ("queued", "process"):
        assert sorted(df.filter(pl.col("name") == name)["tag"].to_list()) == list(range(300)), name
    ldd = subprocess.run(["ldd", str(tmp_path / "frames")], capture_output=True, text=True).stdout
    assert ("libloopscope" in ldd) == (how != "static"), ldd


def test_loopscope_config_without_a_question_is_a_usage_error(tmp_path: Path) -> None:
    r = _sh("loopscope-config", tmp_path)
    assert r.returncode == 2 and "give --cflags" in r.stderr


def test_the_pkg_config_file_is_installed_beside_the_library() -> None:
    if not shutil.which("pkg-config"):
        pytest.skip("needs pkg-config")
    lib = subprocess.run([str(CONFIG), "--pkg-config-path"], capture_output=True, text=True, check=True).stdout.strip()
    r = subprocess.run(["pkg-config", "--libs", "loopscope"], capture_output=True, text=True, env={**os.environ, "PKG_CONFIG_PATH": lib})
    assert r.returncode == 0 and "-lloopscope" in r.stdout and "-Wl,-rpath," in r.stdout
