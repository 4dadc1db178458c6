"""The install: locked, hashed dependencies, and optional parts that say how to get them.

The optional-part tests run the real CLI in a Python whose import of the
part is blocked (``sys.modules[name] = None``, the documented way to make
an import fail), so they hold whether or not this venv has the part.
"""

from __future__ import annotations

import re
import subprocess
import sys
import tomllib
from pathlib import Path

from tests.helpers import assert_clean_error

ROOT = Path(__file__).resolve().parents[1]


def _without(module: str, *args: str, cwd: Path) -> subprocess.CompletedProcess[str]:
    code = f"import sys; sys.modules[{module!r}] = None; from loopscope.cli import main; sys.exit(main())"
    return subprocess.run([sys.executable, "-c", code, *args], capture_output=True, text=True, timeout=120, cwd=cwd)


def _pins(lock: Path) -> dict[str, tuple[str, int]]:
    """name -> (version, hashes) for every requirement of a lock file (one marker set each)."""
    out: dict[str, tuple[str, int]] = {}
    text = lock.read_text().replace("\\\n", " ")
    for line in text.splitlines():
        m = re.match(r"^([A-Za-z0-9_.-]+)==(\S+)", line)
        if m:
            out.setdefault(m.group(1).lower().replace("_", "-"), (m.group(2), line.count("--hash=sha256:")))
    return out


def _names(reqs: list[str]) -> set[str]:
    return {re.split(r"[<>=!~\[; ]", r, maxsplit=1)[0].lower().replace("_", "-") for r in reqs if not r.startswith("loopscope")}


def test_every_dependency_is_pinned_with_hashes_in_the_lock_files() -> None:
    proj = tomllib.loads((ROOT / "pyproject.toml").read_text())["project"]
    demo = _pins(ROOT / "requirements.lock")
    assert _names(proj["dependencies"]) <= set(demo)
    for extra, reqs in proj["optional-dependencies"].items():
        lock = _pins(ROOT / f"requirements-{extra}.lock")
        assert _names(reqs) <= set(lock), extra
        # an extra never moves a pin the demo installs
        assert all(lock[n][0] == v for n, (v, _) in demo.items() if n in lock), extra
    for f in ROOT.glob("requirements*.lock"):
        assert all(h > 0 for _, h in _pins(f).values()), f


def test_the_demo_installs_no_build_lint_or_test_tool_and_no_pyarrow() -> None:
    demo = set(_pins(ROOT / "requirements.lock"))
    assert not demo & {"maturin", "ruff", "pytest", "selenium", "pyarrow", "asyncssh", "perfetto"}


def test_an_ssh_host_without_asyncssh_is_refused_by_check_naming_the_extra(tmp_path: Path) -> None:
    (tmp_path / "x.yaml").write_text("name: x\nhosts:\n  - {name: far, kind: ssh, address: 192.0.2.1}\nprobes:\n  - {kind: timer, host: far}\nduration: 1s\n")
    r = _without("asyncssh", "check", "x.yaml", cwd=tmp_path)
    assert_clean_error(r, 2, "hosts.0.kind", "asyncssh", "loopscope[ssh]", "make install-ssh")


def test_export_perfetto_without_the_perfetto_part_says_which_extra_to_install(tmp_path: Path) -> None:
    (tmp_path / "t.lstrace").write_bytes(b"")
    r = _without("perfetto", "export", "perfetto", "t.lstrace", cwd=tmp_path)
    assert_clean_error(r, 2, "loopscope[perfetto]", "make install-perfetto")
