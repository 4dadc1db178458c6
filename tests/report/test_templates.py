"""The pages' one template environment (report/templates.py): a template
compiled in one process is read from Jinja's bytecode cache in the next, and
a cache directory it may not use costs a compile, never the page."""

from __future__ import annotations

import os
import tempfile
from types import CodeType
from pathlib import Path
from typing import Iterator

import jinja2
import pytest

from loopscope.report import templates

PAGE = {"css": "", "t": None}


@pytest.fixture
def fresh(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Iterator[Path]:
    """A temporary directory of the test's own, and no environment made yet
    (what a new process sees)."""
    monkeypatch.setattr(tempfile, "tempdir", str(tmp_path))
    templates._env.cache_clear()
    yield tmp_path
    templates._env.cache_clear()


def _compiles(monkeypatch: pytest.MonkeyPatch) -> list[str]:
    seen: list[str] = []
    real = jinja2.Environment.compile

    def counting(self: jinja2.Environment, source: str, name: str | None = None, filename: str | None = None) -> CodeType:
        seen.append(str(name))
        return real(self, source, name, filename)

    monkeypatch.setattr(jinja2.Environment, "compile", counting)
    return seen


def test_a_template_compiled_once_is_read_from_the_cache_by_the_next_process(fresh: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    seen = _compiles(monkeypatch)
    first = templates.template("trend.html.j2")
    assert seen == ["trend.html.j2"]
    assert list((fresh / f"_jinja2-cache-{os.getuid()}").glob("__jinja2_*.cache")), "the compiled template was not kept"
    templates._env.cache_clear()  # a new process: a new environment, the same cache directory
    again = templates.template("trend.html.j2")
    assert seen == ["trend.html.j2"], "the second environment compiled the template again instead of reading the cache"
    assert again.render(**PAGE) == first.render(**PAGE)


def test_a_cache_directory_owned_by_another_user_is_not_used_and_the_page_still_renders(fresh: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    if os.getuid() != 0:
        pytest.skip("needs root: the test makes the cache directory another user's")
    theirs = fresh / f"_jinja2-cache-{os.getuid()}"
    theirs.mkdir(mode=0o700)
    os.chown(theirs, 65534, 65534)
    seen = _compiles(monkeypatch)
    page = templates.template("trend.html.j2")
    assert seen == ["trend.html.j2"]
    assert templates._env().bytecode_cache is None
    assert not list(theirs.iterdir()), "a cache directory of another user's was written"
    assert "<html" in page.render(**PAGE).lower()
