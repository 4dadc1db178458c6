"""The clock-sync probes as helpers: not a probe kind of an experiment file
(``clocksync:`` asks for them), but processes an agent starts by name. The
lab's side is ``lab/clocksync.py``; the estimate is ``clock/``."""

from __future__ import annotations


import polars as pl

from loopscope.rundir import Step
from loopscope.spec.models import ProbeModel
from loopscope.kinds.base import ProbeKind, WindowSource, no_windows
from loopscope.probes.params import SyncParams, SyncServeParams


class Sync(ProbeKind[ProbeModel]):
    name = "clocksync"
    helpers = {"sync-serve": SyncServeParams, "sync": SyncParams}
    # the lab's own threads are named so attribution can tell them apart
    comm = {"sync-serve": "ls-sync", "sync": "ls-sync"}

    def windows(self, step: Step, src: WindowSource) -> pl.DataFrame:
        """None: the clock-sync probes are the lab's, never explained themselves."""
        return no_windows()


KIND = Sync()
