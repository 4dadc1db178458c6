"""Every ``--json`` declares what it prints, and docs/ names every key of it.

A command's JSON is an interface: scripts and dashboards read its keys. Each
command with ``--json`` declares its output type (``cli.base.prints``); every
key of that type, nested ones included (tests/jsonkeys.py), must appear in
docs/ as ``key`` in backticks. docs/json.md is the reference generated from
the declarations (tests/jsonref.py): a key added to a type and not to the
page fails here until the page is regenerated.
"""

from __future__ import annotations

import re
from typing import Any, Iterator

import click
from typing_extensions import NotRequired, TypedDict

from loopscope.cli import cli, load_all
from loopscope.cli.base import JSON_TYPES

load_all()  # every command registered, for the walks below
from tests.conftest import ROOT
from tests import jsonref
from tests.jsonkeys import keys


def _json_commands(cmd: click.Command, path: list[str]) -> Iterator[tuple[str, Any]]:
    if isinstance(cmd, click.Group):
        for name, sub in sorted(cmd.commands.items()):
            yield from _json_commands(sub, [*path, name])
    elif any("--json" in p.opts for p in cmd.params if isinstance(p, click.Option)):
        f = cmd.callback
        ref = JSON_TYPES.get(f"{f.__module__}:{f.__qualname__}") if f is not None else None
        if not ref:
            yield " ".join(path), None
        for t in jsonref.members(ref) if ref else []:
            yield " ".join(path), t


def _documented() -> set[str]:
    words: set[str] = set()
    for p in (ROOT / "docs").rglob("*.md"):
        words |= set(re.findall(r"`([A-Za-z_][A-Za-z0-9_]*)`", p.read_text()))
    return words


def test_every_command_with_json_declares_what_it_prints() -> None:
    found = list(_json_commands(cli, []))
    assert len(found) > 40
    undeclared = [name for name, t in found if t is None]
    assert not undeclared, f"these commands print --json without a declared type (cli.base.prints): {undeclared}"


def test_the_json_reference_in_docs_is_generated_from_the_declarations_as_they_are() -> None:
    assert jsonref.OUT.read_text() == jsonref.render(), "docs/json.md is out of date: run `python -m tests.jsonref` and commit it"


def test_docs_name_every_key_of_every_json_a_command_prints() -> None:
    docs = _documented()
    missing = sorted({f"{name}: {k} (in {where})" for name, t in _json_commands(cli, []) if t is not None for k, where in keys(t).items() if k not in docs})
    assert not missing, "docs/ does not name these keys (write each as `key` where the command's output is described):\n" + "\n".join(missing)


class Inner(TypedDict):
    deep: int


class Outer(TypedDict):
    top: str
    items: list[Inner]
    maybe: NotRequired[Inner | None]


def test_the_key_walk_looks_inside_lists_and_optional_fields() -> None:
    assert set(keys(Outer)) == {"top", "items", "deep", "maybe"}
