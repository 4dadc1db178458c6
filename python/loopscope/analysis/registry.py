"""What analysis and the report may ask of the probe kinds, as types.

The kinds sit above analysis and the report in the layers (a kind uses
their building blocks), so these never import ``loopscope.kinds``: its
registry (``KINDS``) is handed down to them. ``Registry`` and ``KindView``
say what they may ask of it, so a checker sees the contract instead of
``Any``; ``kinds/base.py``'s ``Kinds`` and ``ProbeKind`` satisfy them (the
type checker verifies it where the registry is handed down).
"""

from __future__ import annotations

from pathlib import Path
from typing import Any, Iterator, Protocol

import polars as pl

from loopscope.analysis.phases import Measure
from loopscope.analysis.steps import Part
from loopscope.rundir import RunRecord, Step


#: a table's columns as a kind declares them: name → polars dtype (an instance or the class)
Columns = dict[str, "pl.DataType | type[pl.DataType]"]

class KindView(Protocol):
    """One probe kind, as analysis and the report read it."""

    name: str
    describe: str
    tables: dict[str, Columns]
    steady: tuple[tuple[str, str, tuple[str, ...]], ...]
    labels: dict[str, str]
    summary: frozenset[str] | None
    main: tuple[str, str] | None

    def measures(self, tables: Any) -> list[Measure]: ...

    def series(self, tables: Any, probe: str) -> list[Any]: ...

    def sweep_values(self, tables: Any, probe: str) -> list[tuple[str, pl.DataFrame]]: ...

    def programs(self, step: Step, run: RunRecord) -> list[Part]: ...

    def windows(self, step: Step, src: Any) -> pl.DataFrame: ...

    def rows(self, step: Step, trace: pl.DataFrame, result: dict[str, Any], read: Any, tag: Any) -> Any: ...

    def missed(self, tables: Any, probe: str) -> dict[str, list[tuple[int, int]]]: ...

    def section(self, sec: dict[str, Any], tables: Any, comp: pl.DataFrame, present: list[str], run_dir: Path | None) -> None: ...


class Registry(Protocol):
    """The registered kinds: by name, and all of them."""

    def get(self, name: str) -> KindView | None: ...

    def __iter__(self) -> Iterator[KindView]: ...
