"""The root of the `loopscope` command and the parameter types its options share."""

from __future__ import annotations

import datetime as _dt
import sys
from pathlib import Path
from typing import Any, Callable, TypeVar

import click

from loopscope.units import parse_duration_ns

F = TypeVar("F", bound=Callable[..., Any])

#: each ``--json`` command's declared output type (a TypedDict, a pydantic
#: model or a dataclass) as ``module:Name``, by its function (named, not
#: imported: the command line starts without the analysis modules);
#: tests/test_json_docs.py checks that every command with ``--json`` declares
#: one and that docs/ names every key
JSON_TYPES: dict[str, str] = {}


def prints(declared: str) -> Callable[[F], F]:
    """Declare what a command prints with ``--json`` (``module:Name``; under ``@cli.command``, over the function)."""

    def mark(f: F) -> F:
        JSON_TYPES[f"{f.__module__}:{f.__qualname__}"] = declared
        return f

    return mark


class Duration(click.ParamType[int, Any]):
    """A duration with a unit: 10s, 500ms, 2m."""

    name = "duration"

    def convert(self, value: Any, param: click.Parameter | None, ctx: click.Context | None) -> int:
        if isinstance(value, int):
            return value
        try:
            return parse_duration_ns(value)
        except ValueError as e:
            self.fail(str(e), param, ctx)


class Percent(click.ParamType[float, Any]):
    """A share in per cent, given as 2%, 2 % or 2: returned as a fraction (0.02)."""

    name = "percent"

    def convert(self, value: Any, param: click.Parameter | None, ctx: click.Context | None) -> float:
        if isinstance(value, float):
            return value
        text = str(value).strip().removesuffix("%").strip()
        try:
            v = float(text)
        except ValueError:
            self.fail(f"{value!r} is not a percentage; write it as 2% or 0.5%", param, ctx)
        if not 0 <= v < 100:
            self.fail(f"{value!r}: give a percentage from 0 up to (not including) 100", param, ctx)
        return v / 100


class CpuList(click.ParamType[list[int], Any]):
    """CPU numbers: 1, or 0,2, or 0-3."""

    name = "cpus"

    def convert(self, value: Any, param: click.Parameter | None, ctx: click.Context | None) -> list[int]:
        if isinstance(value, list):
            return value
        out: list[int] = []
        try:
            for part in str(value).split(","):
                if "-" in part:
                    a, b = part.split("-", 1)
                    out.extend(range(int(a), int(b) + 1))
                elif part.strip():
                    out.append(int(part))
        except ValueError:
            self.fail(f"{value!r} is not a CPU list; write e.g. 1, 0,2 or 0-3", param, ctx)
        return out


#: the width a console has when it is not a terminal: wide enough that no table is cut
NO_WRAP = 100_000


def _console() -> Any:
    """A rich console: the terminal's width; into a pipe or a file nothing is
    wrapped or cut (a line stays one line for grep and awk)."""
    from rich.console import Console

    if sys.stdout.isatty():
        return Console(highlight=False)
    return Console(highlight=False, soft_wrap=True, width=NO_WRAP)


def _default_run_dir(name: str) -> Path:
    stamp = _dt.datetime.now().strftime("%Y%m%d-%H%M%S")
    d = Path("runs") / f"{stamp}-{name}"
    n = 1
    while d.exists():
        n += 1
        d = Path("runs") / f"{stamp}-{name}-{n}"
    return d


@click.group(context_settings={"help_option_names": ["-h", "--help"], "max_content_width": 100})
@click.version_option(None, "--version", package_name="loopscope", prog_name="loopscope")
def cli() -> None:
    """Measure how late soft-real-time work gets on this machine, how often, and why."""


# ---- probe ---------------------------------------------------------------------
