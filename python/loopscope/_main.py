"""The ``loopscope`` command's entry point, kept apart from the CLI.

Importing the CLI takes a few tenths of a second (more on a busy machine);
a Ctrl-C in that time would print a Python traceback. This module imports
nothing heavy itself, so the interrupt lands where it is caught and the
command ends as it does when interrupted later: exit code 130, one line.
"""

import sys

from loopscope.errors import EXIT_INTERRUPTED


def main() -> None:
    try:
        from loopscope.cli import main as cli_main
    except KeyboardInterrupt:
        sys.stderr.write("loopscope: interrupted\n")
        sys.exit(EXIT_INTERRUPTED)
    cli_main()
