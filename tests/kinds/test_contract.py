"""Every registered kind answers every hook explain and the report rely
on, so a kind that forgets one fails here instead of silently getting no
attribution."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import polars as pl
import pytest

from loopscope.analysis.explain import RunSource
from loopscope.analysis.windows import WINDOWS
from loopscope.kinds import KINDS
from loopscope.kinds.base import ProbeKind
from loopscope.rundir import Capture, RunRecord, Step


def _run(**fields: Any) -> RunRecord:
    return RunRecord.model_validate({"run_id": "r", "name": "contract", "status": "completed", "hosts": {"h1": "h1"}, **fields})


def _step(**fields: Any) -> Step:
    return Step.model_validate(
        {"probe": "p", "rep": 1, "phase": "idle", "trace": "t.lstrace", "json": "t.json", "spawn_mono_ns": 0, "end_mono_ns": 1, **fields}
    )


def _source(tmp: Path) -> RunSource:
    return RunSource(tmp, _run(), {"h1": 0})


@pytest.mark.parametrize("kind", list(KINDS), ids=lambda k: k.name)
def test_every_kind_gives_explain_its_windows_in_the_one_frame(kind: ProbeKind, tmp_path: Path) -> None:
    # a step whose trace is missing: an empty frame of the contract's columns, never an error
    step = _step(kind=kind.name, host="h1", trace="steps/r01-idle/p.lstrace")
    assert type(kind).windows is not ProbeKind.windows, f"{kind.name} does not say which of its intervals explain splits"
    w = kind.windows(step, _source(tmp_path))
    assert isinstance(w, pl.DataFrame) and dict(w.schema) == WINDOWS and w.is_empty()


@pytest.mark.parametrize("kind", [k for k in KINDS if k.model is not None], ids=lambda k: k.name)
def test_every_probe_kind_has_its_model_measures_and_section(kind: ProbeKind) -> None:
    assert kind.describe, f"{kind.name}: no description for its report section"
    assert kind.model.model_fields["kind"].annotation.__args__ == (kind.name,)  # type: ignore[union-attr]
    assert type(kind).measures is not ProbeKind.measures, f"{kind.name}: no measures to compare across phases"
    assert type(kind).rows is not ProbeKind.rows, f"{kind.name}: adds nothing to the run's tables"


def test_a_kind_without_the_windows_hook_fails_loudly(tmp_path: Path) -> None:
    class Forgetful(ProbeKind):
        name = "forgetful"

    with pytest.raises(NotImplementedError, match="forgetful"):
        Forgetful().windows(_step(kind="forgetful"), _source(tmp_path))


def test_explain_says_which_steps_no_registered_kind_explains(tmp_path: Path, lab: None) -> None:
    from loopscope.analysis.explain import windows_of

    run = _run(steps=[_step(kind="nosuch", probe="x")])
    w, unknown = windows_of(tmp_path, run, KINDS, [Capture(host="h1", covers=["h1"])])
    assert w.is_empty() and unknown == ["x (nosuch)"]


@pytest.mark.parametrize("kind", list(KINDS), ids=lambda k: k.name)
def test_every_kind_says_which_programs_its_steps_started(kind: ProbeKind) -> None:
    from loopscope.analysis.steps import Part, program_parts

    step = _step(
        kind=kind.name,
        host="h1",
        processes=[{"name": "a", "host": "h1", "trace": "a.lstrace", "json": "a.json"}],
        hubs=[{"name": "hub-h1", "host": "h1", "trace": "hub.lstrace", "json": "hub.json"}],
    )
    parts = program_parts(step, _run(), KINDS)
    assert all(isinstance(p, Part) for p in parts) and parts[-1].name == "hub-h1"
    # the program kinds name theirs; every other kind started none of its own
    assert [p.name for p in parts[:-1]] == {"program": [""], "app": ["a"]}.get(kind.name, [])


def _empty_tables() -> Any:
    from loopscope.report.tables import ANALYSIS_TABLES, RunTables, _empty
    from loopscope.rundir import Provenance

    frames = {t: _empty(schema) if schema else pl.DataFrame() for k in KINDS for t, schema in k.tables.items()}
    frames.update({t: pl.DataFrame() for t in ANALYSIS_TABLES})
    return RunTables(
        run=_run(),
        spec={"probes": [{"kind": k.name, "name": f"p-{k.name}", "dest": "127.0.0.1:9"} for k in KINDS]},
        provenance=Provenance(),
        frames=frames,
        loads=pl.DataFrame(),
        steps=pl.DataFrame(),
    )


@pytest.mark.parametrize("kind", [k for k in KINDS if k.model is not None], ids=lambda k: k.name)
def test_every_kind_answers_the_report_hooks_for_a_run_without_its_rows(kind: ProbeKind) -> None:
    # a run whose steps of this kind recorded nothing: every hook answers empty, none fails
    t, probe = _empty_tables(), f"p-{kind.name}"
    assert kind.measures(t) == []
    assert all(len(s.frame) == 0 for s in kind.series(t, probe))
    assert all(len(v) == 0 for _, v in kind.sweep_values(t, probe))
    assert all(not per for per in kind.missed(t, probe).values())


@pytest.mark.parametrize("kind", [k for k in KINDS if k.model is not None and k.tables], ids=lambda k: k.name)
def test_every_kind_with_tables_offers_its_samples_to_the_datasets_records_from_its_own_tables(kind: ProbeKind) -> None:
    assert kind.records, f"{kind.name}: its samples are missing from `loopscope query`'s records view (ProbeKind.records)"
    for table, measure, value in kind.records:
        assert table in kind.tables, f"{kind.name}: records from {table!r}, a table it does not declare"
        schema = kind.tables[table]
        assert not schema or value in schema, f"{kind.name}: {value!r} is not a column of {table}"
        assert measure.strip(), f"{kind.name}: no measure name for {value}"
