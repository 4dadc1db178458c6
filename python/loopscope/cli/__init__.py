"""The ``loopscope`` command.

Subcommands map onto the package, one module per concern, each imported
only when one of its commands runs (``base.COMMANDS``): ``probe`` and
``netprobe`` (measure), ``lab`` (run, check), ``runs`` (report, timeline,
explain, export), ``dataset`` (runs, query, trend), ``compare``,
``monitor``, ``imports`` and ``runthreads`` (import a recording, measure its threads), ``tracecmd`` (inspect trace files), ``bench``
(loopscope against its floor and its peers), ``model`` (calibrate and
model), ``hosts``, ``plumbing`` (what the lab starts); how results print is
``show``. Every error ends the same way: ``loopscope: error: <what>; <what
to do>`` on stderr and exit code 2 for bad input, 1 for a failed run, 130
for Ctrl-C; never a traceback for a user's mistake.
"""

from __future__ import annotations

import os
import signal
import sys

import click

from loopscope.cli.base import cli
from loopscope.errors import EXIT_FAILED, EXIT_INPUT, EXIT_INTERRUPTED, LoopscopeError


def load_all() -> None:
    """Every command registered on ``cli`` (each module registers its own
    when imported; a command line imports only the one it runs)."""
    cli.load_all()


# ---- entry point -----------------------------------------------------------------


def _fail(msg: str, code: int) -> int:
    sys.stderr.write(f"loopscope: error: {msg}\n")
    return code


def _terminate(signum: int, frame: object) -> None:
    # SIGTERM ends a run the way Ctrl-C does: stop, keep what was measured, clean up.
    raise KeyboardInterrupt


def main(argv: list[str] | None = None) -> None:
    if os.environ.get("LOOPSCOPE_PDEATHSIG"):
        # Started by an agent: die with it, whatever kills it.
        from loopscope.lineage import die_with_parent

        if not die_with_parent():
            sys.exit(EXIT_FAILED)
    signal.signal(signal.SIGTERM, _terminate)
    # A shell starts background commands with SIGINT ignored; loopscope's
    # servers are stopped with it, so take it back.
    signal.signal(signal.SIGINT, signal.default_int_handler)
    try:
        rv = cli.main(args=argv, prog_name="loopscope", standalone_mode=False)
        code = rv if isinstance(rv, int) else 0
    except click.UsageError as e:
        if type(e).__name__ == "NoArgsIsHelpError":
            click.echo(e.ctx.get_help() if e.ctx else "", err=True)
            sys.exit(EXIT_INPUT)
        cmd = e.ctx.command_path if e.ctx else "loopscope"
        code = _fail(f"{e.format_message()}; see '{cmd} --help'", EXIT_INPUT)
    except click.ClickException as e:
        code = _fail(e.format_message(), e.exit_code)
    except click.Abort:
        sys.stderr.write("loopscope: interrupted\n")
        code = EXIT_INTERRUPTED
    except KeyboardInterrupt:
        sys.stderr.write("loopscope: interrupted\n")
        code = EXIT_INTERRUPTED
    except LoopscopeError as e:
        code = _fail(str(e), e.exit_code)
    except BrokenPipeError:
        # `loopscope trace dump F | head`: the reader went away; not an error.
        try:
            sys.stdout = open(os.devnull, "w")
        except OSError:
            pass
        code = 0
    except OSError as e:
        code = _fail(f"{e.filename or ''}: {e.strerror}" if e.filename else str(e), EXIT_FAILED)
    except BaseException as e:
        if not _interrupt_in_native(e):
            raise
        sys.stderr.write("loopscope: interrupted\n")
        code = EXIT_INTERRUPTED
    sys.exit(code)


def _interrupt_in_native(e: BaseException) -> bool:
    """A Ctrl-C that landed in Python run by the native module, where it
    cannot raise: the first array it makes finds numpy's array API, which
    runs numpy's own Python (importing ``numpy.lib``, its version check), and
    the numpy crate panics when that fails. The panic's text names the
    interrupt; the command was interrupted, not broken."""
    return type(e).__name__ == "PanicException" and "KeyboardInterrupt" in str(e)
