"""docs/json.md, generated from the declared type of every ``--json``.

Each command with ``--json`` declares what it prints (``cli.base.prints``);
this writes the reference of those declarations: per command its type, and
per type its keys, each key's type and the comment the declaration gives it
(a ``#:`` line above the field, or a ``#`` after it). The prose docs say
what the figures mean; this page says what keys there are, and
tests/test_json_docs.py fails when it is out of date. Regenerate with

    python -m tests.jsonref
"""

from __future__ import annotations

import importlib
import inspect
import re
import typing
from pathlib import Path
from typing import Any, Iterator

import click

from loopscope.cli import cli, load_all
from loopscope.cli.base import JSON_TYPES

load_all()  # every command registered, for the walks below
from tests.jsonkeys import _fields, _inner

ROOT = Path(__file__).resolve().parent.parent
OUT = ROOT / "docs" / "json.md"

HEAD = """# What every `--json` prints

Generated from the declarations in the code by `python -m tests.jsonref`;
tests/test_json_docs.py fails when it is out of date, and when a command
prints `--json` without declaring its type. What the figures mean is in the
page of each command (docs/experiments.md, docs/net.md, docs/explain.md,
docs/monitor.md, docs/benchmarks.md, …); this page lists the keys.

A key marked *optional* may be absent. `T | None` is `null` when there is
nothing to say. Every command prints exactly one JSON object, on one line
unless its help says otherwise; `loopscope bench …` commands print theirs
last, after their progress on stderr.
"""


def commands(cmd: click.Command = cli, path: tuple[str, ...] = ()) -> Iterator[tuple[str, str | None]]:
    """Every command with ``--json`` and its declared type (``module:Name``; None: undeclared)."""
    if isinstance(cmd, click.Group):
        for name, sub in sorted(cmd.commands.items()):
            yield from commands(sub, (*path, name))
    elif any("--json" in p.opts for p in cmd.params if isinstance(p, click.Option)):
        f = cmd.callback
        yield " ".join(path), JSON_TYPES.get(f"{f.__module__}:{f.__qualname__}") if f is not None else None


def members(ref: str) -> list[Any]:
    """The declared types of a command: one, or each a command's options choose between (``a:X | b:Y``)."""
    out = []
    for part in ref.split(" | "):
        module, name = part.split(":")
        out.append(getattr(importlib.import_module(module), name))
    return out


def resolve(ref: str) -> Any:
    """The declared type (a Union when the command prints one of several)."""
    got = members(ref)
    return got[0] if len(got) == 1 else typing.Union[tuple(got)]


def _type_text(t: Any) -> str:
    s = t.__name__ if isinstance(t, type) and typing.get_origin(t) is None else str(t)
    s = re.sub(r"typing(_extensions)?\.", "", s)
    s = re.sub(r"\b(?:[a-z_][\w]*\.)+([A-Za-z_]\w*)", r"\1", s)
    s = re.sub(r"NotRequired\[(.*)\]$", r"\1 (optional)", s)
    return s.replace("NoneType", "None")


def _comments(t: Any) -> dict[str, str]:
    """Each field's comment in the declaration: ``#:`` lines above it, or a ``#`` after it."""
    try:
        src = inspect.getsource(t)
    except (OSError, TypeError):
        return {}
    out: dict[str, str] = {}
    above: list[str] = []
    for line in src.splitlines()[1:]:
        s = line.strip()
        if s.startswith("#:"):
            above.append(s[2:].strip())
            continue
        m = re.match(r"(\w+)\s*:\s*[^#]+?(?:#\s*(.*))?$", s)
        if m and not s.startswith(("def ", "return ", "@")):
            text = " ".join(above) or (m.group(2) or "")
            if text:
                out[m.group(1)] = text
        above = []
    return out


def _types(root: Any, seen: dict[tuple[str, str], Any]) -> None:
    """``root`` and every declared type its fields hold, by module and name."""
    if not _fields(root) or (root.__module__, root.__name__) in seen:
        return
    key = (root.__module__, root.__name__)
    seen[key] = root
    for ft in _fields(root).values():
        for inner in _inner(ft):
            _types(inner, seen)


def _headings(every: dict[tuple[str, str], Any]) -> dict[tuple[str, str], str]:
    """Each type's heading: its name, and its module when another type has the same name."""
    names = [n for _, n in every]
    return {(m, n): n if names.count(n) == 1 else f"{n} ({m})" for m, n in every}


def _anchor(heading: str) -> str:
    return re.sub(r"[^a-z0-9 _-]", "", heading.lower()).replace(" ", "-")


def _doc(t: Any) -> str:
    d = inspect.getdoc(t) or ""
    base = inspect.getdoc(dict) or ""
    return "" if d == base or d.startswith(("dict() -> new empty", "Create a new model")) else " ".join(d.split())


def render() -> str:
    out = [HEAD, "## Commands", "", "| command | prints |", "| --- | --- |"]
    every: dict[tuple[str, str], Any] = {}
    roots = [(name, members(ref)) for name, ref in commands() if ref is not None]
    for _, ts in roots:
        for t in ts:
            _types(t, every)
    heads = _headings(every)
    for name, ts in roots:
        links = " or ".join(f"[{heads[(t.__module__, t.__name__)]}](#{_anchor(heads[(t.__module__, t.__name__)])})" for t in ts)
        out.append(f"| `loopscope {name} --json` | {links} |")
    out += ["", "## Types", ""]
    for key in sorted(every, key=lambda k: (heads[k].lower(), k)):
        t = every[key]
        out += [f"### {heads[key]}", ""]
        if doc := _doc(t):
            out += [doc, ""]
        notes = _comments(t)
        out += ["| key | type | |", "| --- | --- | --- |"]
        for key, ft in _fields(t).items():
            out.append(f"| `{key}` | {_type_text(ft).replace('|', '&#124;')} | {notes.get(key, '').replace('|', '&#124;')} |")
        out.append("")
    return "\n".join(out).rstrip() + "\n"


if __name__ == "__main__":
    OUT.write_text(render())
    print(f"wrote {OUT.relative_to(ROOT)}")
