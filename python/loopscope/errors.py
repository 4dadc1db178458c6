"""Errors a user can act on, and the exit codes they map to.

loopscope distinguishes bad input (a file, option or name the user gave is
wrong: exit code 2) from a failed run (something broke while measuring: exit
code 1); ``compare --fail-if`` exits 3 when a criterion trips. Every message names the thing at fault (file and offset, option,
component) and, where there is one, what to do. The CLI prints
``loopscope: error: <message>`` and exits with the code; no traceback.
The native module raises these same classes.
"""

from __future__ import annotations
import importlib

EXIT_OK = 0
EXIT_FAILED = 1
EXIT_INPUT = 2
#: ``loopscope compare --fail-if``: a criterion tripped (a regression gate for CI)
EXIT_CRITERION = 3
#: ``loopscope compare --fail-if … --strict``: no criterion failed, but one could not be decided
EXIT_INCONCLUSIVE = 4
EXIT_INTERRUPTED = 130


class LoopscopeError(Exception):
    """Base class; ``exit_code`` says how the CLI ends."""

    exit_code = EXIT_FAILED


class InputError(LoopscopeError):
    """The user's input is wrong (exit code 2)."""

    exit_code = EXIT_INPUT


class RunError(LoopscopeError):
    """The run failed (exit code 1). ``component`` names the part of
    loopscope that failed (``tunings``, ``lab``, …) when the raiser knows
    it: the run record says so, without reading the message."""

    exit_code = EXIT_FAILED

    def __init__(self, message: str = "", component: str | None = None) -> None:
        super().__init__(message)
        self.component = component


class Stopped(LoopscopeError):
    """A signal or a peer asked this component to stop (exit code 130):
    control flow that unwinds through the clean-up, not a fault."""

    exit_code = EXIT_INTERRUPTED


def missing_part(module: str, extra: str, what: str) -> str | None:
    """Why ``what`` cannot work when ``module`` (the ``extra`` optional part)
    does not import, saying how to install it; None when it imports."""

    try:
        importlib.import_module(module)
    except ImportError:
        return f"{what} needs {module}, an optional part of loopscope: install it with `pip install 'loopscope[{extra}]'` (in a clone: `make install-{extra}`)"
    return None
