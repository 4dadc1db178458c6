"""The clock-sync probes as helpers: not a probe kind of an experiment file
(``clocksync:`` asks for them), but processes an agent starts by name. The
lab's side is ``lab/clocksync.py``; the estimate is ``clock/``."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import polars as pl

from loopscope.kinds.base import ProbeKind, WindowSource, cli, no_windows


def _serve(p: dict[str, Any], duration_ns: int, trace: Path, scratch: Path) -> list[str]:
    return cli("sync-serve") + ["--bind", p["bind"], "--json", "--trace", str(trace)]


def _probe(p: dict[str, Any], duration_ns: int, trace: Path, scratch: Path) -> list[str]:
    return cli("sync") + ["--dest", p["dest"], "--flow", str(p["flow"]), "--rate", repr(float(p["rate"])), "--gap", f"{int(p['gap_ns'])}ns",
                         "--json", "--trace", str(trace)]


class Sync(ProbeKind):
    name = "clocksync"
    helpers = {"sync-serve": _serve, "sync": _probe}
    # the lab's own threads are named so attribution can tell them apart
    comm = {"sync-serve": "ls-sync", "sync": "ls-sync"}

    def windows(self, step: dict[str, Any], src: WindowSource) -> pl.DataFrame:
        """None: the clock-sync probes are the lab's, never explained themselves."""
        return no_windows()


KIND = Sync()
