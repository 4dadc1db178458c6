"""What a report section shows of a run beyond its tables, read once.

The report runs load → analyse → render: only its load steps take the run
directory. ``SectionInputs`` is what the kinds' sections and the Why section
read besides the tables: explain's attribution rows (``tables/attribution.parquet``,
one frame for every probe and phase) and the images a program left next to
its traces (``<trace>-frames/*.png``, the first few of each). The report's
load step (``report.load.derived``) fills it; the sections only look things up.
"""

from __future__ import annotations

import base64
from dataclasses import dataclass, field
from pathlib import Path

import polars as pl

from loopscope.analysis.explained import Outlier
from loopscope.rundir import RunRecord
from loopscope.analysis.steps import Kinds, program_parts


def _frames(trace: str) -> str:
    """Where a program's images are: ``<trace without .lstrace>-frames``."""
    return trace.removesuffix(".lstrace") + "-frames"


#: how many images of each phase a section shows (and so how many of each trace's are read)
IMAGES_PER_PHASE = 3


@dataclass(frozen=True)
class Image:
    """One image a program left: its name (the file's stem) and its PNG bytes."""

    name: str
    png: bytes


@dataclass(frozen=True)
class SectionInputs:
    """Explain's attribution rows (None: the run was not explained) and the
    images next to the traces, keyed by the trace's path in the run."""

    attribution: pl.DataFrame | None = None
    images: dict[str, list[Image]] = field(default_factory=dict)
    #: ``worst``'s answers, by how many outliers were asked for
    _ranked: dict[int, dict[tuple[str, str], list[Outlier]]] = field(default_factory=dict, compare=False, repr=False)

    @classmethod
    def read(cls, run_dir: Path, run: RunRecord, kinds: Kinds) -> "SectionInputs":
        """The attribution table, and the first images of each program's ``<trace>-frames`` directory."""
        p = run_dir / "tables" / "attribution.parquet"
        att = pl.read_parquet(p) if p.exists() else None
        images: dict[str, list[Image]] = {}
        for st in run.steps:
            for part in program_parts(st, run, kinds):
                d = run_dir / _frames(part.trace)
                if part.trace not in images and d.is_dir():
                    images[part.trace] = [Image(f.stem, f.read_bytes()) for f in sorted(d.glob("*.png"))[:IMAGES_PER_PHASE]]
        return cls(att, images)

    def attribution_of(self, probe: str) -> pl.DataFrame | None:
        """The explained outliers of a probe (its own and its intervals', named ``<probe> <interval>``)."""
        a = self.attribution
        if a is None:
            return None
        return a.select("rep", "phase", "probe", "id", "t_ns", "cause", "ns").filter((pl.col("probe") == probe) | pl.col("probe").str.starts_with(probe + " "))

    def worst(self, probe: str, phase: str, n: int = 5) -> list[Outlier]:
        """The ``n`` largest outliers of a probe and phase, each with its causes
        (largest first; an outlier the same size as another by id, the later first, and
        causes of the same time by name)."""
        if n not in self._ranked:
            self._ranked[n] = self._worst(n)
        return self._ranked[n].get((probe, phase), [])

    def _worst(self, n: int) -> dict[tuple[str, str], list[Outlier]]:
        """``worst`` for every probe and phase at once: the outliers ranked in one
        sort, and only the ``n`` largest of each made into rows (the Why section
        asks for each of its phases in turn, and a long run has tens)."""
        a = self.attribution
        if a is None or not len(a):
            return {}
        ranked = (
            a.group_by("probe", "phase", "id")
            .agg(pl.col("latency_ns").first())
            .sort(["latency_ns", "id"], descending=True)
            .group_by("probe", "phase", maintain_order=True)
            .head(n)
            .with_row_index("rank")
            .select("probe", "phase", "id", "rank")
        )
        top = a.join(ranked, on=["probe", "phase", "id"]).sort(["rank", "ns", "cause"], descending=[False, True, False])
        out: dict[tuple[str, str], list[Outlier]] = {}
        last: Outlier | None = None
        span = "span" in top.columns
        for r in top.iter_rows(named=True):
            if last is None or last["id"] != r["id"]:
                last = {
                    "id": int(r["id"]),
                    "rep": int(r["rep"]),
                    "t_ns": int(r["t_ns"]),
                    "latency_ns": int(r["latency_ns"]),
                    "cpu": r["cpu"],
                    "span": bool(r["span"]) if span else False,
                    "migrations": int(r["migrations"]),
                    "page_faults": int(r["page_faults"]),
                    "complete": bool(r["complete"]),
                    "causes": [],
                }
                out.setdefault((str(r["probe"]), str(r["phase"])), []).append(last)
            last["causes"].append((r["cause"], int(r["ns"])))
        return out

    def images_of(self, run: RunRecord, probe: str, phases: list[str], kinds: Kinds) -> list[dict[str, str | int]]:
        """The images a probe's programs left, a few per phase, inlined as data URIs."""
        out: list[dict[str, str | int]] = []
        for ph in phases:
            n = 0
            for st in run.steps:
                if st.probe != probe or st.phase != ph:
                    continue
                for part in program_parts(st, run, kinds):
                    for im in self.images.get(part.trace, [])[: IMAGES_PER_PHASE - n]:
                        out.append(
                            {
                                "phase": ph,
                                "rep": st.rep,
                                "name": f"{part.name or probe}: {im.name}",
                                "src": "data:image/png;base64," + base64.b64encode(im.png).decode(),
                            }
                        )
                        n += 1
        return out
