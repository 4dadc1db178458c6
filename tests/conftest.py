"""Shared fixtures: running the real CLI, building C programs, trace hygiene."""

from __future__ import annotations

import json
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
        r = subprocess.run([str(BIN), *args], capture_output=True, text=True, timeout=timeout, cwd=cwd or tmp_path, env=e)
        if "--json" in args and r.returncode == 0:
            _printed_as_declared(list(args), r.stdout)
        return r

    return run


def _printed_as_declared(args: list[str], stdout: str) -> None:
    """What a command printed with --json has no key its declared type
    (``cli.base.prints``) lacks: every test that runs one checks the declaration."""
    import click

    from loopscope.cli import cli as root
    from loopscope.cli import load_all
    from loopscope.cli.base import JSON_TYPES
    from tests.jsonkeys import undeclared
    from tests.jsonref import resolve

    load_all()
    cmd: click.Command = root
    for a in args:
        if not isinstance(cmd, click.Group) or a not in cmd.commands:
            break
        cmd = cmd.commands[a]
    f = cmd.callback
    ref = JSON_TYPES.get(f"{f.__module__}:{f.__qualname__}") if f is not None else None
    if ref is None:
        return
    try:
        printed = json.loads(stdout)
    except ValueError:
        lines = [ln for ln in stdout.splitlines() if ln.startswith("{") and ln.endswith("}")]
        if not lines:
            return
        printed = json.loads(lines[-1])
    extra = undeclared(printed, resolve(ref))
    assert not extra, f"loopscope {' '.join(args)} printed keys its declared type {ref} lacks (declare them, then python -m tests.jsonref): {extra}"


@pytest.fixture
def build_c(tmp_path: Path) -> Callable[..., Path]:
    """Compile a C program from tests/c against the installed libloopscope."""
    from loopscope import cbuild

    def build(name: str, static: bool = True) -> Path:
        return cbuild.build([ROOT / "tests" / "c" / name], tmp_path / Path(name).stem, static=static)

    return build
