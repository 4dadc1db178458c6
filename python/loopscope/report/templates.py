"""The pages' templates: one Jinja environment for every page loopscope
writes (a run's report, a comparison, a trend, a fleet, a monitor), over the
templates beside this module, with the stylesheet they share.

Compiling the report's template takes about 0.1 s, a fourteenth of a
report, so compiled templates are kept in Jinja's own bytecode cache
(``FileSystemBytecodeCache``: a directory of the user's own under the
system's temporary directory, written atomically, and checked against the
template's source, Jinja's and Python's versions before use). Where that
directory cannot be made or used, the template is compiled each time, as
before: the page is the same.
"""

from __future__ import annotations

import functools
from pathlib import Path

import jinja2

HERE = Path(__file__).resolve().parent


class _Cache(jinja2.FileSystemBytecodeCache):
    """Jinja's cache, which never fails a page: a cache it cannot write is a
    compile each time (a full or read-only temporary directory)."""

    def dump_bytecode(self, bucket: jinja2.bccache.Bucket) -> None:
        try:
            super().dump_bytecode(bucket)
        except OSError:
            pass


@functools.cache
def _env() -> jinja2.Environment:
    try:
        cache: jinja2.BytecodeCache | None = _Cache()
    except (OSError, RuntimeError):  # no private temporary directory: compile each time
        cache = None
    return jinja2.Environment(loader=jinja2.FileSystemLoader(str(HERE)), autoescape=True, bytecode_cache=cache)


def template(name: str) -> jinja2.Template:
    """The template ``name`` (``report.html.j2``, …), compiled or from the cache."""
    return _env().get_template(name)


def css() -> str:
    """The stylesheet every page inlines."""
    return (HERE / "page.css").read_text()
