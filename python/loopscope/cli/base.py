"""The root of the `loopscope` command and the parameter types its options share."""

from __future__ import annotations

import datetime as _dt
import gc
import importlib
import sys
from pathlib import Path
from typing import TYPE_CHECKING, Any, Callable, TypeVar

import click

from loopscope.units import parse_duration_ns

if TYPE_CHECKING:
    from loopscope.kinds.base import Kinds

F = TypeVar("F", bound=Callable[..., Any])

#: each ``--json`` command's declared output type (a TypedDict, a pydantic
#: model or a dataclass) as ``module:Name``, by its function (named, not
#: imported: the command line starts without the analysis modules);
#: tests/test_json_docs.py checks that every command with ``--json`` declares
#: one and that docs/ names every key
JSON_TYPES: dict[str, str] = {}


def prints(*declared: str) -> Callable[[F], F]:
    """Declare what a command prints with ``--json`` (``module:Name``; under
    ``@cli.command``, over the function). A command whose options choose
    between two documents names both (``a:X``, ``b:Y``): it prints one of them."""

    def mark(f: F) -> F:
        JSON_TYPES[f"{f.__module__}:{f.__qualname__}"] = " | ".join(declared)
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


class LazyGroup(click.Group):
    """A group whose commands live in modules imported only when one of them
    is asked for: each module registers its commands on the group when
    imported (``@cli.command``), and ``modules`` says which module holds
    which command (``modules``, set by a subclass). `loopscope probe timer` imports the probe commands' module
    and what it needs, not the report's or the benches'. ``--help`` lists
    every command, and so imports every module."""

    #: command name -> the module that registers it (a subclass says its own)
    modules: dict[str, str] = {}

    def list_commands(self, ctx: click.Context) -> list[str]:
        return sorted({*self.commands, *self.modules})

    def get_command(self, ctx: click.Context, cmd_name: str) -> click.Command | None:
        if cmd_name not in self.commands and cmd_name in self.modules:
            importlib.import_module(self.modules[cmd_name])
            # What the command's modules made as they were imported (classes, pydantic's
            # schemas, tables of constants) lives as long as the process: the cyclic
            # collector need not walk it again at each of its passes, nor at exit
            # (0.15 s of a report). Only what the command makes from here on is collected.
            gc.freeze()
        return self.commands.get(cmd_name)

    def load_all(self) -> None:
        """Every command of this group and of the lazy groups under it registered (for tools that walk the tree)."""
        for m in sorted(set(self.modules.values())):
            importlib.import_module(m)
        for c in list(self.commands.values()):
            if isinstance(c, LazyGroup):
                c.load_all()


#: which module of loopscope.cli holds each top-level command
COMMANDS = {
    **dict.fromkeys(("run", "check", "schema", "cleanup"), "loopscope.cli.lab"),
    "report": "loopscope.cli.report",
    **dict.fromkeys(("timeline", "explain", "export"), "loopscope.cli.runs"),
    **dict.fromkeys(("runs", "query"), "loopscope.cli.dataset"),
    **dict.fromkeys(("trend", "fleet"), "loopscope.cli.datapages"),
    **dict.fromkeys(("compare", "advise"), "loopscope.cli.compare"),
    "import": "loopscope.cli.imports",
    "threads": "loopscope.cli.runthreads",
    **dict.fromkeys(("calibrate", "model"), "loopscope.cli.model"),
    **dict.fromkeys(("netem", "channel"), "loopscope.cli.plumbing"),
    "probe": "loopscope.cli.probe",
    "monitor": "loopscope.cli.monitor",
    "hosts": "loopscope.cli.hosts",
    "trace": "loopscope.cli.tracecmd",
    "bench": "loopscope.cli.bench",
    "audit": "loopscope.cli.audit",
}

#: which module holds each `loopscope probe` command other than probe.py's own
PROBE_COMMANDS = {
    **dict.fromkeys(("send", "recv", "echo", "rr", "bulk", "pipe-source", "pipe-node", "pipe-sink", "sync-serve", "sync"), "loopscope.cli.netprobe"),
    "threads": "loopscope.cli.threads",
}


class _Root(LazyGroup):
    modules = COMMANDS


@click.group(cls=_Root, context_settings={"help_option_names": ["-h", "--help"], "max_content_width": 100})
@click.version_option(None, "--version", package_name="loopscope", prog_name="loopscope")
def cli() -> None:
    """Measure how late soft-real-time work gets on this machine, how often, and why."""


def kinds() -> Kinds:
    """The probe kinds' registry, imported now if it was not (``lazy.py`` says why here)."""
    from loopscope.kinds import KINDS

    return KINDS


# ---- probe ---------------------------------------------------------------------
