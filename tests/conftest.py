"""Shared fixtures: running the real CLI, building C programs, trace hygiene."""

from __future__ import annotations

import os
import shutil
import subprocess
import sys
from pathlib import Path
from typing import Callable

import pytest

pytest_plugins = ["tests.tiers"]

ROOT = Path(__file__).resolve().parent.parent
BIN = Path(sys.executable).parent / "loopscope"


def pytest_collection_modifyitems(config: pytest.Config, items: list[pytest.Item]) -> None:
    for item in items:
        if item.get_closest_marker("needs_root") and os.geteuid() != 0:
            item.add_marker(pytest.mark.skip(reason="needs root (run the tests as root to include it)"))
        m = item.get_closest_marker("needs_tool")
        if m:
            for tool in m.args:
                if not shutil.which(tool):
                    item.add_marker(pytest.mark.skip(reason=f"needs {tool} (scripts/install-deps.sh installs it as root)"))


@pytest.fixture(autouse=True)
def no_trace_left_open():
    """Every test leaves the process-wide trace session closed."""
    from loopscope import _native

    yield
    if _native.is_open():
        _native.close()
        pytest.fail("the test left a trace open")


Cli = Callable[..., subprocess.CompletedProcess[str]]


@pytest.fixture
def cli(tmp_path: Path) -> Cli:
    """Run the installed ``loopscope`` command in a fresh directory."""

    def run(*args: str, timeout: float = 120, env: dict[str, str] | None = None, cwd: Path | None = None) -> subprocess.CompletedProcess[str]:
        e = dict(os.environ)
        e.update(env or {})
        return subprocess.run([str(BIN), *args], capture_output=True, text=True, timeout=timeout, cwd=cwd or tmp_path, env=e)

    return run


@pytest.fixture
def build_c(tmp_path: Path) -> Callable[..., Path]:
    """Compile a C program from tests/c against the installed libloopscope."""
    from loopscope import cbuild

    def build(name: str, static: bool = True) -> Path:
        return cbuild.build([ROOT / "tests" / "c" / name], tmp_path / Path(name).stem, static=static)

    return build
