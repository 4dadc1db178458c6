"""What analysis and the report may ask of the probe kinds, as types.

The kinds sit above analysis and the report in the layers (a kind uses
their building blocks), so these never import ``loopscope.kinds``: its
registry (``KINDS``) is handed down to them. ``Registry`` and ``KindView``
say what they may ask of it, so a checker sees the contract instead of
``Any``; ``kinds/base.py``'s ``Kinds`` and ``ProbeKind`` satisfy them (the
type checker verifies it where the registry is handed down).
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any, Iterator, Protocol

from typing_extensions import TypedDict

import polars as pl

from loopscope.analysis.phases import Measure
from loopscope.analysis.inputs import SectionInputs
from loopscope.analysis.steps import Part
from loopscope.rundir import RunRecord, Step


#: a table's columns as a kind declares them: name → polars dtype (an instance or the class)
Columns = dict[str, "pl.DataType | type[pl.DataType]"]


class Tables(Protocol):
    """A run as tables, as a kind reads it (``report.tables.RunTables``):
    its record, its experiment as run, each step's result by (rep, phase,
    probe), and every table a kind declares, by name (a name no kind
    declares is an error, never an empty table)."""

    run: RunRecord
    spec: dict[str, Any]
    results: dict[tuple[int, str, str], dict[str, Any]]
    steps: pl.DataFrame

    def __getattr__(self, name: str) -> pl.DataFrame: ...


class MetricCell(TypedDict):
    """One metric of one phase: its value with CI, and its ratio to the baseline with CI (text for the page)."""

    value: str
    ci: str
    ratio: str
    ratio_ci: str
    sig: bool
    up: bool
    p: str


class MetricsRow(TypedDict):
    phase: str
    loads: str
    n: int
    reps: int
    cells: dict[str, MetricCell]


class MetricsTable(TypedDict):
    """One measure's table: a row per phase, a column per metric."""

    title: str
    metrics: list[str]
    heads: list[str]
    rows: list[MetricsRow]


@dataclass
class Section:
    """One probe's section of the report, as its kind fills it
    (``ProbeKind.section``) and the page shows it: charts are inline SVG,
    tables and grids are rows for the page."""

    name: str
    kind: str
    describe: str
    charts: list[str] = field(default_factory=list)
    tables: list[MetricsTable] = field(default_factory=list)
    grids: list[Any] = field(default_factory=list)
    #: what the anomaly detectors found in its series
    detected: list[str] = field(default_factory=list)
    #: sample frames a program saved
    images: list[Any] = field(default_factory=list)
    #: a kind's own parts: a syscall probe's per-call table, a pipeline's hop
    #: tables, its queueing fits and its message accounting
    syscall: Any = None
    pipeline: Any = None
    queueing: Any = None
    accounting: Any = None


class KindView(Protocol):
    """One probe kind, as analysis and the report read it."""

    name: str
    describe: str
    tables: dict[str, Columns]
    steady: tuple[tuple[str, str, tuple[str, ...]], ...]
    labels: dict[str, str]
    summary: frozenset[str] | None
    main: tuple[str, str] | None

    def measures(self, tables: Tables) -> list[Measure]: ...

    def series(self, tables: Tables, probe: str) -> list[Any]: ...

    def sweep_values(self, tables: Tables, probe: str) -> list[tuple[str, pl.DataFrame]]: ...

    def programs(self, step: Step, run: RunRecord) -> list[Part]: ...

    def windows(self, step: Step, src: Any) -> pl.DataFrame: ...

    def rows(self, step: Step, trace: pl.DataFrame, result: dict[str, object], read: Any, tag: Any) -> Any: ...

    def missed(self, tables: Tables, probe: str) -> dict[str, list[tuple[int, int]]]: ...

    def silent(self, results: list[dict[str, object]]) -> str: ...

    def section(self, sec: Section, tables: Tables, comp: pl.DataFrame, present: list[str], inputs: SectionInputs) -> None: ...


class Registry(Protocol):
    """The registered kinds: by name, and all of them."""

    def get(self, name: str) -> KindView | None: ...

    def __iter__(self) -> Iterator[KindView]: ...
