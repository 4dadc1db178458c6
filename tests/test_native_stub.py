"""python/loopscope/_native.pyi declares exactly what the native module has."""

from __future__ import annotations

import ast
import inspect
from pathlib import Path

from loopscope import _native

STUB = Path(__file__).resolve().parent.parent / "python" / "loopscope" / "_native.pyi"


def _stub() -> tuple[dict[str, ast.AST], dict[str, ast.ClassDef]]:
    tree = ast.parse(STUB.read_text())
    top: dict[str, ast.AST] = {}
    classes: dict[str, ast.ClassDef] = {}
    for node in tree.body:
        if isinstance(node, ast.FunctionDef):
            top[node.name] = node
        elif isinstance(node, ast.ClassDef) and node.name.startswith("_"):
            continue  # the stub's own types (the probes' result shapes), not the module's
        elif isinstance(node, ast.ClassDef):
            top[node.name] = node
            classes[node.name] = node
        elif isinstance(node, ast.AnnAssign) and isinstance(node.target, ast.Name):
            top[node.target.id] = node
    return top, classes


def _params(fn: ast.FunctionDef) -> list[str]:
    return [a.arg for a in fn.args.args if a.arg != "self"]


def test_the_stub_and_the_module_declare_the_same_names() -> None:
    top, _ = _stub()
    public = {n for n in dir(_native) if not n.startswith("_")}
    assert set(top) == public


def test_function_parameters_match_the_native_signatures() -> None:
    top, classes = _stub()
    for name, node in top.items():
        if isinstance(node, ast.FunctionDef):
            sig = inspect.signature(getattr(_native, name))
            assert _params(node) == list(sig.parameters), name
    for cname, cnode in classes.items():
        cls = getattr(_native, cname)
        for m in cnode.body:
            is_prop = isinstance(m, ast.FunctionDef) and any(isinstance(d, ast.Name) and d.id == "property" for d in m.decorator_list)
            # Slot methods (__call__) have no introspectable signature; their names are still checked.
            if isinstance(m, ast.FunctionDef) and m.name.startswith("__"):
                assert hasattr(cls, m.name), f"{cname}.{m.name}"
            elif isinstance(m, ast.FunctionDef) and not is_prop:
                sig = inspect.signature(getattr(cls, m.name))
                assert _params(m) == [p for p in sig.parameters if p != "self"], f"{cname}.{m.name}"
