"""The code stays readable a screen at a time: no function past 100 lines,
in the Python package or in the crates (their tests aside)."""

from __future__ import annotations

import ast
import functools
import re
from pathlib import Path

import pytest

from tests import shape

ROOT = Path(__file__).resolve().parent.parent
LIMIT = 100
FN = re.compile(r"^\s*(pub(\([a-z]+\))?\s+)?(const\s+)?(async\s+)?(unsafe\s+)?(extern\s+\"C\"\s+)?fn\s+(\w+)")


def _python_lengths() -> list[tuple[int, str]]:
    out = []
    for p in sorted((ROOT / "python" / "loopscope").rglob("*.py")):
        for n in ast.walk(ast.parse(p.read_text())):
            if isinstance(n, (ast.FunctionDef, ast.AsyncFunctionDef)) and n.end_lineno is not None:
                out.append((n.end_lineno - n.lineno + 1, f"{p.relative_to(ROOT)}:{n.lineno} {n.name}"))
    return out


def _rust_lengths(text: str, where: str) -> list[tuple[int, str]]:
    """Each fn item's lines, from its signature to its closing brace (braces
    counted outside string and char literals and comments); a file's
    ``#[cfg(test)]`` module and everything after it are its tests."""
    lines = text.split("\n")
    out = []
    i = 0
    while i < len(lines):
        if lines[i].strip().startswith("#[cfg(test)]"):
            break
        m = FN.match(lines[i])
        if not m:
            i += 1
            continue
        depth, opened, j = 0, False, i
        while j < len(lines):
            code = re.sub(r'"(\\.|[^"\\])*"|\'(\\.|[^\'\\])\'|//.*', "", lines[j])
            if not opened and ";" in code and "{" not in code:
                break  # a declaration (a trait's fn without a body)
            depth += code.count("{") - code.count("}")
            opened = opened or "{" in code
            if opened and depth <= 0:
                out.append((j - i + 1, f"{where}:{i + 1} {m.group(7)}"))
                break
            j += 1
        i += 1
    return out


def test_no_python_function_is_longer_than_a_screen() -> None:
    long = [f"{w} ({n} lines)" for n, w in _python_lengths() if n > LIMIT]
    assert not long, "split these by what each part does:\n" + "\n".join(long)


def test_no_rust_function_outside_tests_is_longer_than_a_screen() -> None:
    found = []
    for p in sorted((ROOT / "crates").rglob("*.rs")):
        if "tests" in p.parts or p.name == "tests.rs":
            continue
        found += _rust_lengths(p.read_text(), str(p.relative_to(ROOT)))
    assert len(found) > 200, "the scanner found too few functions to be reading the crates"
    long = [f"{w} ({n} lines)" for n, w in found if n > LIMIT]
    assert not long, "split these by what each part does:\n" + "\n".join(long)


def test_the_rust_scanner_measures_a_function_to_its_closing_brace() -> None:
    src = 'pub fn a(x: u8) -> u8 {\n    let s = "}{";\n    if x > 0 { x } else { 0 }\n}\n\nfn b();\n#[cfg(test)]\nfn t() {\n}\n'
    assert _rust_lengths(src, "x.rs") == [(4, "x.rs:1 a")]


# The ratchets: each figure (counted as tests/shape.py says) is held at or
# below its value here. When a change lowers one, lower its number here in
# the same commit; a change that raises one fails until it is taken back.
HELD = {
    "dict_any": 52,
    "any_params": 51,
    "probe_kind_branches": 0,
    "host_kind_branches": 2,
    "local_imports": 120,
    "local_imports_repeating_a_top_level_one": 0,
    "long_files": 3,
    "python_circles": 0,
    "rust_circles": 0,
}


@functools.cache
def _figures() -> dict[str, list[str]]:
    loc, rep = shape.local_imports()
    return {
        "dict_any": shape.dict_any(),
        "any_params": shape.any_params(),
        "probe_kind_branches": shape.probe_kind_branches(),
        "host_kind_branches": shape.host_kind_branches(),
        "local_imports": loc,
        "local_imports_repeating_a_top_level_one": rep,
        "long_files": shape.long_files(),
        "python_circles": [" ↔ ".join(c) for c in shape.python_circles()],
        "rust_circles": [" ↔ ".join(c) for c in shape.rust_circles()],
    }


@pytest.mark.parametrize("figure", sorted(HELD))
def test_a_held_figure_of_the_code_does_not_grow_back(figure: str) -> None:
    found = _figures()[figure]
    assert len(found) <= HELD[figure], f"{figure}: {len(found)} > {HELD[figure]}; the newest of these is yours to take back:\n" + "\n".join(found)


def test_the_circle_finder_finds_a_circle_and_only_that() -> None:
    g = {"a": {"b"}, "b": {"c"}, "c": {"a"}, "d": {"a"}, "e": set()}
    assert shape.circles(g) == [["a", "b", "c"]]


def test_a_comparison_with_a_host_kind_is_a_branch_and_a_lookup_is_not() -> None:
    src = 'if h.kind == "ssh":\n    pass\nx = HOSTS[h.kind]\nmatch k:\n    case "netns":\n        pass\ny = k in ("exec", "x")\n'
    assert sorted(shape.branches_in(ast.parse(src), src, shape.HOST_KINDS, kind_line=False)) == [1, 5, 7]


def test_docs_layout_names_every_package() -> None:
    layout = (ROOT / "docs" / "layout.md").read_text()
    pkgs = sorted(p.parent.name for p in (ROOT / "python" / "loopscope").glob("*/__init__.py"))
    assert len(pkgs) > 10
    missing = [p for p in pkgs if f"{p}/" not in layout]
    assert not missing, f"docs/layout.md does not name these packages: {missing}"
