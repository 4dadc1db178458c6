"""The figures tests/test_code_shape.py holds (the ratchets), each counted the
one way the project's issues count it, so a figure read in a review and the
figure a test holds are the same number.

- ``dict_any``: lines of python/loopscope that say ``dict[str, Any]``;
- ``any_params``: function parameters annotated ``Any`` (or ``typing.Any``);
- ``probe_kind_branches``: a comparison (``==``, ``!=``, ``in``, ``not in``)
  or ``case`` against a probe kind's name, on a line that also says ``kind``,
  outside kinds/;
- ``host_kind_branches``: the same against a host kind's name, anywhere;
- ``local_imports``: import statements inside a function, each once, and those
  of them that repeat one of their file's top-level import statements;
- ``long_files``: Python and Rust sources over 600 lines, tests/ aside;
- ``circles``: strongly connected groups of modules that import each other,
  in the Python package (every import, function-local and ``TYPE_CHECKING``
  ones included) and within each crate (``use crate::``/``super::`` paths)."""

from __future__ import annotations

import ast
import functools
import re
from collections.abc import Iterator
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
PKG = ROOT / "python" / "loopscope"
PROBE_KINDS = frozenset({"timer", "sched", "syscall", "pipeline", "program", "app", "rr", "threads"})
HOST_KINDS = frozenset({"netns", "local", "ssh", "exec"})
LONG = 600


@functools.cache
def _parsed() -> tuple[tuple[Path, str, ast.Module], ...]:
    return tuple((p, p.read_text(), ast.parse(p.read_text())) for p in sorted(PKG.rglob("*.py")))


def sources() -> Iterator[tuple[Path, str, ast.Module]]:
    yield from _parsed()


def dict_any() -> list[str]:
    return [f"{p.relative_to(ROOT)}:{i}" for p, text, _ in sources() for i, line in enumerate(text.split("\n"), 1) if "dict[str, Any]" in line]


def _is_any(a: ast.expr | None) -> bool:
    if isinstance(a, ast.Name):
        return a.id == "Any"
    if isinstance(a, ast.Attribute):
        return a.attr == "Any" and isinstance(a.value, ast.Name) and a.value.id == "typing"
    if isinstance(a, ast.Constant):
        return a.value in ("Any", "typing.Any")
    return False


def any_params() -> list[str]:
    out = []
    for p, _, tree in sources():
        for n in ast.walk(tree):
            if isinstance(n, (ast.FunctionDef, ast.AsyncFunctionDef)):
                a = n.args
                for arg in [*a.posonlyargs, *a.args, *a.kwonlyargs, *([a.vararg] if a.vararg else []), *([a.kwarg] if a.kwarg else [])]:
                    if _is_any(arg.annotation):
                        out.append(f"{p.relative_to(ROOT)}:{arg.lineno} {n.name}({arg.arg})")
    return out


def _strings(e: ast.expr) -> set[str]:
    if isinstance(e, ast.Constant) and isinstance(e.value, str):
        return {e.value}
    if isinstance(e, (ast.Tuple, ast.List, ast.Set)):
        return {x.value for x in e.elts if isinstance(x, ast.Constant) and isinstance(x.value, str)}
    return set()


def branches_in(tree: ast.Module, text: str, names: frozenset[str], *, kind_line: bool) -> list[int]:
    """Lines of ``tree`` that compare with (or ``case`` on) one of ``names``."""
    lines = text.split("\n")
    out = []
    for n in ast.walk(tree):
        hit: set[str] = set()
        if isinstance(n, ast.Compare) and any(isinstance(o, (ast.Eq, ast.NotEq, ast.In, ast.NotIn)) for o in n.ops):
            for e in [n.left, *n.comparators]:
                hit |= _strings(e) & names
        elif isinstance(n, ast.MatchValue):
            hit = _strings(n.value) & names
        if hit and (not kind_line or "kind" in lines[n.lineno - 1]):
            out.append(n.lineno)
    return out


def _branches(names: frozenset[str], *, kind_line: bool, skip: str | None) -> list[str]:
    out = []
    for p, text, tree in sources():
        if skip and p.relative_to(PKG).parts[0] == skip:
            continue
        out += [f"{p.relative_to(ROOT)}:{i}" for i in branches_in(tree, text, names, kind_line=kind_line)]
    return out


def probe_kind_branches() -> list[str]:
    return _branches(PROBE_KINDS, kind_line=True, skip="kinds")


def host_kind_branches() -> list[str]:
    return _branches(HOST_KINDS, kind_line=False, skip=None)


def _top_imports(tree: ast.Module) -> set[str]:
    out = set()
    for n in ast.walk(tree):
        if isinstance(n, (ast.Import, ast.ImportFrom)):
            out.add(ast.unparse(n))
    for f in ast.walk(tree):
        if isinstance(f, (ast.FunctionDef, ast.AsyncFunctionDef)):
            for n in ast.walk(f):
                if isinstance(n, (ast.Import, ast.ImportFrom)):
                    out.discard(ast.unparse(n))
    return out


def local_imports() -> tuple[list[str], list[str]]:
    """(every function-local import, those that repeat a top-level one)."""
    found, repeats = [], []
    for p, _, tree in sources():
        top = {ast.unparse(n) for n in tree.body if isinstance(n, (ast.Import, ast.ImportFrom))}
        top |= {ast.unparse(n) for b in tree.body if isinstance(b, ast.If) for n in b.body if isinstance(n, (ast.Import, ast.ImportFrom))}
        seen: set[int] = set()
        for f in ast.walk(tree):
            if not isinstance(f, (ast.FunctionDef, ast.AsyncFunctionDef)):
                continue
            for n in ast.walk(f):
                if isinstance(n, (ast.Import, ast.ImportFrom)) and id(n) not in seen:
                    seen.add(id(n))
                    where = f"{p.relative_to(ROOT)}:{n.lineno} {ast.unparse(n)}"
                    found.append(where)
                    if ast.unparse(n) in top:
                        repeats.append(where)
    return found, repeats


def long_files() -> list[str]:
    out = []
    for p in [*sorted(PKG.rglob("*.py")), *sorted((ROOT / "crates").rglob("*.rs"))]:
        rel = p.relative_to(ROOT)
        if "tests" in rel.parts or "target" in rel.parts:
            continue
        n = p.read_text().count("\n")
        if n > LONG:
            out.append(f"{rel} ({n} lines)")
    return out


def _module(p: Path) -> str:
    parts = list(p.relative_to(PKG.parent).with_suffix("").parts)
    if parts[-1] == "__init__":
        parts.pop()
    return ".".join(parts)


def _resolve(mod: str, is_pkg: bool, n: ast.ImportFrom) -> list[str]:
    if n.level:
        base = mod.split(".")
        base = base if is_pkg else base[:-1]
        base = base[: len(base) - (n.level - 1)]
        head = ".".join(base + ([n.module] if n.module else []))
    else:
        head = n.module or ""
    return [head, *(f"{head}.{a.name}" for a in n.names)]


def python_graph() -> dict[str, set[str]]:
    mods = {_module(p): p for p in PKG.rglob("*.py")}
    graph: dict[str, set[str]] = {m: set() for m in mods}
    for m, p in mods.items():
        for n in ast.walk(ast.parse(p.read_text())):
            targets: list[str] = []
            if isinstance(n, ast.Import):
                targets = [a.name for a in n.names]
            elif isinstance(n, ast.ImportFrom):
                targets = _resolve(m, p.name == "__init__.py", n)
            for t in targets:
                # the deepest module the name names (a name from a module is an edge to that module)
                while t and t not in mods:
                    t = t.rpartition(".")[0]
                if t and t != m and t.startswith("loopscope"):
                    graph[m].add(t)
    return graph


def rust_graphs() -> dict[str, dict[str, set[str]]]:
    """Per crate: module (file stem path) → modules it names by ``crate::``."""
    out = {}
    for cargo in sorted((ROOT / "crates").glob("*/Cargo.toml")):
        src = cargo.parent / "src"
        files = {p: ".".join(p.relative_to(src).with_suffix("").parts) for p in src.rglob("*.rs")}
        mods = {m.removesuffix(".mod") for m in files.values()}
        graph: dict[str, set[str]] = {m: set() for m in mods}
        for p, m in files.items():
            m = m.removesuffix(".mod")
            code = p.read_text().split("#[cfg(test)]")[0]
            for path in re.findall(r"\bcrate::((?:\w+::)*\w+)", code):
                t = path.replace("::", ".")
                while t and t not in mods:
                    t = t.rpartition(".")[0]
                if t and t != m and t not in ("lib", "main"):
                    graph[m].add(t)
        out[cargo.parent.name] = graph
    return out


def circles(graph: dict[str, set[str]]) -> list[list[str]]:
    """Tarjan's strongly connected components of more than one module."""
    index: dict[str, int] = {}
    low: dict[str, int] = {}
    stack: list[str] = []
    on: set[str] = set()
    out: list[list[str]] = []

    def visit(v: str) -> None:
        index[v] = low[v] = len(index)
        stack.append(v)
        on.add(v)
        for w in graph.get(v, ()):
            if w not in index:
                visit(w)
                low[v] = min(low[v], low[w])
            elif w in on:
                low[v] = min(low[v], index[w])
        if low[v] == index[v]:
            comp = []
            while True:
                w = stack.pop()
                on.discard(w)
                comp.append(w)
                if w == v:
                    break
            if len(comp) > 1:
                out.append(sorted(comp))

    for v in sorted(graph):
        if v not in index:
            visit(v)
    return out


def _parents(graph: dict[str, set[str]]) -> dict[str, set[str]]:
    """A package's ``__init__`` re-exporting its modules is not a circle with
    them: drop the edge from a package to a module inside it."""
    return {m: {t for t in ts if not t.startswith(m + ".")} for m, ts in graph.items()}


def python_circles() -> list[list[str]]:
    return circles(_parents(python_graph()))


def rust_circles() -> list[list[str]]:
    return [[f"{c}::{m}" for m in comp] for c, g in rust_graphs().items() for comp in circles(g)]


if __name__ == "__main__":
    loc, rep = local_imports()
    for name, v in (
        ("dict[str, Any]", dict_any()),
        ("Any parameters", any_params()),
        ("probe-kind branches", probe_kind_branches()),
        ("host-kind branches", host_kind_branches()),
        ("function-local imports", loc),
        ("  repeating a top-level import", rep),
        ("files over 600 lines", long_files()),
        ("python circles", python_circles()),
        ("rust circles", rust_circles()),
    ):
        print(f"{name}: {len(v)}")
