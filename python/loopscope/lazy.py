"""Deferred imports: the one pattern, and where it lives.

A module imports at its top. What a command needs on some of its paths only,
and costs to import, is imported on first use, through an accessor, in one
of two places by layer:

- here, at the lowest layer (this module imports nothing of loopscope):
  third-party modules. ``stats()``: scipy's statistics cost 0.55 s, and only
  a node model's trimmed mean (``loopscope model``) needs them. Every test a
  report runs (a warm-up's and a comparison's rank-sum test, a drift's line
  and Theil–Sen fits, a count's binomial test and Clopper–Pearson interval,
  Welch's interval, a sweep's F test, a queueing fit's Erlang distribution
  and its Kolmogorov–Smirnov distance) is numpy and ``special()``,
  scipy.special (0.14 s), each held against scipy.stats' own result in
  tests/analysis;
- ``cli/base.py``, at the top: ``kinds()``, the probe kinds (their models,
  their analysis, polars and numpy under them: 0.25-0.35 s), which a listing
  (``loopscope runs``) needs only when a question names the ``records`` view
  and a bench only at its own command; and ``LazyGroup``, which loads only
  the module of the command that runs. (The agent imports the kinds at its
  first probe, not at its start: a fleet's agents start side by side.)

Not an import, but deferred the same way: the spec's models, the probes'
parameter models and the run record's build their validators when first
used (pydantic's ``defer_build``), not when their module is imported: a
report or a listing validates none of the spec's models (0.05 s of a
report's start).

And once a command's modules are imported, what they made is frozen out of
the cyclic collector's passes (``gc.freeze`` in ``cli/base.py``'s
``LazyGroup``): it lives as long as the process, and walking it again at
every pass and at exit cost a report 0.15 s.

One more form: a module a command needs only at its end, imported
meanwhile on another thread (``meanwhile``), while the command's own work
runs natively without the interpreter lock. ``loopscope import`` decodes its
first batch while the run record's types (pydantic's models, 0.1 s of
imports) load beside it; it needs them only to write the record.

``tests/test_startup.py`` holds which commands leave these unloaded.
"""

from __future__ import annotations

import importlib
import threading
from types import ModuleType


def special() -> ModuleType:
    """``scipy.special`` (0.14 s, against scipy.stats' 0.6 s: a line fit's
    p-value needs Student's t and nothing else of scipy's statistics)."""
    from scipy import special as sp

    return sp


def stats() -> ModuleType:
    """``scipy.stats``, imported now if it was not."""
    from scipy import stats as st

    return st


def meanwhile(module: str) -> threading.Thread:
    """Import ``module`` on another thread, now; join the thread returned
    before the process may end (an import cut short at exit can fail
    loudly). A failed import is left for the module's own import to raise."""

    def load() -> None:
        try:
            importlib.import_module(module)
        except Exception:  # raised again, where it is used, by that import
            pass

    t = threading.Thread(target=load, name="ls-import-meanwhile", daemon=True)
    t.start()
    return t
