"""What a command needs on some of its paths only, imported on first use:
the one place loopscope defers an import.

The probe kinds (``loopscope.kinds``: their models, their analysis, polars
and numpy under them) cost 0.25-0.35 s to import. An agent needs them at its
first probe, not at its start (a fleet's agents start side by side); a
listing (``loopscope runs``) never, unless a question names the ``records``
view; a bench at its own command. Such a path calls ``lazy.kinds()``; every
other module imports at its top. ``tests/test_startup.py`` holds which
commands do not load them. Heavy modules a command never needs stay out of
its module's imports altogether (the command line loads only the module of
the command it runs: ``cli/base.py``'s ``LazyGroup``).
"""

from __future__ import annotations

from typing import TYPE_CHECKING

if TYPE_CHECKING:
    from loopscope.kinds.base import Kinds


def kinds() -> Kinds:
    """The probe kinds' registry (``loopscope.kinds.KINDS``), imported now if it was not."""
    from loopscope.kinds import KINDS

    return KINDS
