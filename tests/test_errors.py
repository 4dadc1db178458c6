"""Errors are types: every exception loopscope raises is inside errors.py's
hierarchy, so the CLI maps each to its exit code without reading messages."""

from __future__ import annotations

import ast
import builtins

from tests.conftest import ROOT

BUILTIN = {n for n in dir(builtins) if isinstance(getattr(builtins, n), type) and issubclass(getattr(builtins, n), BaseException)}


def test_every_exception_class_of_loopscope_derives_from_its_error_hierarchy() -> None:
    outside = []
    for p in sorted((ROOT / "python" / "loopscope").rglob("*.py")):
        for node in ast.walk(ast.parse(p.read_text())):
            if not isinstance(node, ast.ClassDef):
                continue
            bases = [b.id if isinstance(b, ast.Name) else b.attr if isinstance(b, ast.Attribute) else "" for b in node.bases]
            if bases and all(b in BUILTIN for b in bases) and not (p.name == "errors.py" and node.name == "LoopscopeError"):
                outside.append(f"{p.relative_to(ROOT)}: {node.name}({', '.join(bases)})")
    assert outside == []


def test_a_run_error_says_its_component_without_its_message_being_read() -> None:
    from loopscope.errors import EXIT_FAILED, EXIT_INPUT, EXIT_INTERRUPTED, InputError, RunError
    from loopscope.kernel.store import CaptureError
    from loopscope.lab.steps import Interrupted
    from loopscope.lab.lab import LabError
    from loopscope.lab.netns import NetnsError

    assert LabError("x").component == "lab" and isinstance(LabError("x"), RunError)
    assert NetnsError("x").component == "network namespaces"
    assert RunError("tunings: y", component="tunings").component == "tunings"
    assert CaptureError("x").exit_code == EXIT_INPUT and isinstance(CaptureError("x"), InputError)
    assert Interrupted("SIGINT").exit_code == EXIT_INTERRUPTED and RunError("x").exit_code == EXIT_FAILED


def test_a_misspelled_table_name_is_an_error_not_an_empty_table(tmp_path) -> None:  # type: ignore[no-untyped-def]
    import polars as pl
    import pytest

    from loopscope.report.tables import RunTables
    from loopscope.rundir import Provenance, RunRecord

    t = RunTables(
        run=RunRecord(run_id="r", name="t", status="completed"),
        spec={},
        provenance=Provenance(),
        frames={"timer": pl.DataFrame({"latency_ns": [1]}), "channels": pl.DataFrame()},
        loads=pl.DataFrame(),
        steps=pl.DataFrame(),
    )
    assert len(t.timer) == 1 and len(t.channels) == 0
    with pytest.raises(AttributeError, match="no table 'timr'.*channels, timer"):
        _ = t.timr
