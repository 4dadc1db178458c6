"""Loading an experiment file, with every problem reported at once.

The YAML is parsed twice from the same text: once into plain data that the
pydantic models validate, once into PyYAML's node tree, which keeps the line
of every key and item. Each validation error's location (``loads.0.level``)
is walked down that tree to the line to blame, and its message is rewritten
to say what is allowed and what was found, the way the user will fix it:
``noise.yaml:7: loads.0.level: must be 1..512 processes or 1..100 % [got 0]``.
"""

from __future__ import annotations

import difflib
import os
import types
import typing
from dataclasses import dataclass
from pathlib import Path
from collections.abc import Mapping
from typing import Any

import yaml
from pydantic import BaseModel, ValidationError

from loopscope.errors import InputError
from loopscope.spec.models import Experiment, HasModels, experiment_model, probe_kinds


@dataclass(frozen=True)
class Problem:
    line: int | None
    path: str
    message: str

    def render(self, file: str) -> str:
        where = f"{file}:{self.line}" if self.line else file
        return f"{where}: {self.path}: {self.message}" if self.path else f"{where}: {self.message}"


class SpecError(InputError):
    """An experiment file with problems; ``problems`` lists them all."""

    def __init__(self, file: str, problems: list[Problem]) -> None:
        self.file = file
        self.problems = problems
        if len(problems) == 1:
            text = problems[0].render(file)
        else:
            text = f"{file}: {len(problems)} problems, nothing was run:\n" + "\n".join("  " + p.render(file) for p in problems)
        super().__init__(text)


def _line(node: yaml.Node | None) -> int | None:
    return node.start_mark.line + 1 if node is not None else None


def _locate(root: yaml.Node | None, loc: tuple[Any, ...], tags: set[str] | None = None) -> tuple[int | None, list[str]]:
    """Line of the deepest node along ``loc`` and the path elements that exist
    in the data (pydantic adds union tags that the file does not have)."""
    node, line = root, _line(root)
    tags = _TAGS if tags is None else tags
    shown: list[str] = []
    for key in loc:
        if isinstance(node, yaml.MappingNode):
            hit = next(((k, v) for k, v in node.value if isinstance(k, yaml.ScalarNode) and k.value == str(key)), None)
            if hit is None:
                if isinstance(key, str) and shown and key in tags:
                    continue  # a discriminator tag
                shown.append(str(key))
                continue
            line = _line(hit[0])
            node = hit[1]
            shown.append(str(key))
        elif isinstance(node, yaml.SequenceNode) and isinstance(key, int):
            if 0 <= key < len(node.value):
                node = node.value[key]
                line = _line(node)
            shown.append(str(key))
        else:
            if isinstance(key, str) and key in tags:
                continue
            shown.append(str(key))
    return line, shown


_TAGS = {
    "affinity",
    "sched",
    "limit",
    "irq",
    "dma_latency",
    "cpuidle",
    "mlock",
    "write",
    "cpu",
    "memory",
    "io",
    "net",
    "mix",
    "command",
    "function-after",
    "int",
    "str",
    "list[str]",
}


def _tags(model: type[Experiment]) -> set[str]:
    """Union tags pydantic puts in a location: the load kinds, the model's probe kinds, a few types."""
    return _TAGS | set(probe_kinds(model))


def _model_at(model: type[Experiment], loc: tuple[Any, ...]) -> type[BaseModel] | None:
    """The model that owns the last element of ``loc`` (for listing allowed fields)."""
    cur: Any = model
    for key in loc[:-1]:
        cur = _unwrap(cur, key)
        if cur is None:
            return None
    cur = _unwrap(cur, None)
    return cur if isinstance(cur, type) and issubclass(cur, BaseModel) else None


def _unwrap(t: Any, key: Any) -> Any:
    while True:
        origin = typing.get_origin(t)
        if origin is typing.Annotated:
            t = typing.get_args(t)[0]
        elif origin in (typing.Union, types.UnionType):
            args = [a for a in typing.get_args(t) if a is not type(None)]
            if isinstance(key, str):
                for a in args:
                    a0 = _unwrap(a, None)
                    f = getattr(a0, "model_fields", {}).get("kind")
                    if f is not None and key in typing.get_args(f.annotation):
                        return a0
            if len(args) == 1:
                t = args[0]
            else:
                return t
        else:
            break
    if key is None:
        return t
    if typing.get_origin(t) is list and isinstance(key, int):
        return typing.get_args(t)[0]
    if isinstance(t, type) and issubclass(t, BaseModel) and isinstance(key, str) and key in t.model_fields:
        return t.model_fields[key].annotation
    return None


def _got(v: object) -> str:
    s = repr(v) if isinstance(v, str) else str(v)
    return s if len(s) <= 60 else s[:57] + "..."


def _near(word: str, names: list[str], prefix: str = " ") -> str:
    """`` (did you mean 'x'?)`` when one name is close to what was written."""
    close = difflib.get_close_matches(word, [n for n in names if n], n=1, cutoff=0.6)
    if not close or close[0] == word:
        return ""
    return f"{prefix}did you mean {close[0]!r}?" if prefix.strip() else f" (did you mean {close[0]!r}?)"


# PyYAML's words for the usual slips, in the words of someone fixing the file.
YAML_SLIPS = [
    (
        "mapping values are not allowed here",
        "a `key: value` where this line's indentation or the line above does not allow one: indent it under its parent, or quote a value that contains ': '",
    ),
    ("expected <block end>, but found", "this line's indentation does not match the lines around it: items of one list or mapping start in the same column"),
    ("could not find expected ':'", "a key without its ':' (or a line that continues the one above without being indented under it)"),
    ("found character '\\t' that cannot start any token", "a tab in the indentation: YAML indents with spaces only"),
    ("found undefined alias", "a `*name` with no `&name` before it"),
    ("while parsing a flow", "a [ … ] or { … } that is not closed on this line or the next"),
    ("found unexpected end of stream", "a quote or bracket that is never closed"),
]


def _yaml_problem(e: yaml.YAMLError) -> Problem:
    mark = getattr(e, "problem_mark", None)
    what = getattr(e, "problem", None) or str(e)
    context = getattr(e, "context", None) or ""
    for raw, plain in YAML_SLIPS:
        if raw in what or raw in context:
            return Problem(mark.line + 1 if mark else None, "", f"invalid YAML: {plain} (the parser: {what})")
    return Problem(mark.line + 1 if mark else None, "", f"invalid YAML: {what}")


def _message(model: type[Experiment], err: Mapping[str, Any]) -> str:
    t, ctx, inp = err["type"], err.get("ctx") or {}, err.get("input")
    if t == "missing":
        return "is required"
    if t == "extra_forbidden":
        m = _model_at(model, tuple(err["loc"]))
        if m is None:
            return "unknown field"
        names = [f.alias or n for n, f in m.model_fields.items()]
        near = _near(str(err["loc"][-1]), names)
        return f"unknown field{near}; allowed here: {', '.join(names)}"
    if t == "union_tag_invalid":
        tags = [x.strip(" '") for x in str(ctx.get("expected_tags") or "").split(",")]
        return f"unknown kind {ctx.get('tag')!r}{_near(str(ctx.get('tag')), tags)}; use one of {ctx.get('expected_tags')}"
    if t == "union_tag_not_found":
        return "needs a `kind`"
    if t == "literal_error":
        choices = [x.strip(" '") for x in str(ctx.get("expected") or "").replace(" or ", ",").split(",")]
        return f"must be one of {ctx.get('expected')} [got {_got(inp)}]{_near(str(inp), choices, prefix='; ')}"
    if t in ("int_parsing", "int_type", "int_from_float"):
        return f"must be a whole number [got {_got(inp)}]"
    if t in ("float_parsing", "float_type"):
        return f"must be a number [got {_got(inp)}]"
    if t in ("bool_parsing", "bool_type"):
        return f"must be true or false [got {_got(inp)}]"
    if t in ("string_type",):
        return f"must be text [got {_got(inp)}]"
    if t in ("list_type",):
        return f"must be a list [got {_got(inp)}]"
    if t in ("model_type", "model_attributes_type", "dict_type"):
        return f"must be a mapping of fields [got {_got(inp)}]"
    bounds = {
        "greater_than_equal": ("at least", "ge"),
        "less_than_equal": ("at most", "le"),
        "greater_than": ("more than", "gt"),
        "less_than": ("less than", "lt"),
    }
    if t in bounds:
        word, k = bounds[t]
        return f"must be {word} {ctx.get(k)} [got {_got(inp)}]"
    if t == "too_short":
        return f"needs at least {ctx.get('min_length')} item(s)"
    if t == "too_long":
        return f"allows at most {ctx.get('max_length')} item(s) [got {ctx.get('actual_length')}]"
    if t == "string_pattern_mismatch":
        return f"must be 1-64 letters, digits, '.', '_' or '-', starting with a letter or digit [got {_got(inp)}]"
    if t in ("level", "duration", "command"):
        return str(err["msg"])
    return f"{err['msg']} [got {_got(inp)}]"


def problems_from(model: type[Experiment], e: ValidationError, root: yaml.Node | None) -> list[Problem]:
    out: list[Problem] = []
    tags = _tags(model)
    for err in e.errors(include_url=False):
        if err["type"] == "spec_references":
            for loc, msg in err["ctx"]["problems"]:
                line, shown = _locate(root, tuple(err["loc"]) + tuple(loc), tags)
                out.append(Problem(line, ".".join(shown), msg))
            continue
        loc = tuple(err["loc"])
        if err["type"] in ("union_tag_invalid", "union_tag_not_found"):
            loc = loc + ("kind",)
        line, shown = _locate(root, loc, tags)
        out.append(Problem(line, ".".join(shown), _message(model, err)))
    return sorted(out, key=lambda p: (p.line or 0, p.path))


def parse(text: str, file: str, kinds: HasModels) -> Experiment:
    """Validate experiment text against the model of ``kinds``' probes; SpecError lists every problem."""
    try:
        root = yaml.compose(text, Loader=yaml.SafeLoader)
        data = yaml.safe_load(text)
    except RecursionError:
        raise SpecError(
            file, [Problem(None, "", "the file nests mappings or lists too deeply to read (thousands of levels); an experiment file needs a handful")]
        ) from None
    except yaml.YAMLError as e:
        raise SpecError(file, [_yaml_problem(e)]) from None
    if not isinstance(data, dict):
        raise SpecError(file, [Problem(_line(root), "", "the file must be a mapping of fields (name, probes, loads, duration, ...)")])
    from loopscope.spec import inventory

    found = inventory.expand(data, Path(file).parent)
    if found:
        single = isinstance(yaml.safe_load(text).get("hosts"), dict)
        out = []
        for i, bad in found:
            loc: tuple[Any, ...] = ("hosts", bad.field) if single else ("hosts", i, bad.field)
            line, _ = _locate(root, loc)
            out.append(Problem(line, ".".join(str(x) for x in loc), str(bad)))
        raise SpecError(file, out)
    model = experiment_model(kinds)
    if isinstance(data.get("monitor"), dict) and "duration" not in data:
        # a monitor's probes measure a period at a time: that is their duration
        data["duration"] = data["monitor"].get("period", "60s")
    try:
        return model.model_validate(data)
    except RecursionError:
        raise SpecError(file, [Problem(_line(root), "", "the file nests too deeply to check; an experiment file needs a handful of levels")]) from None
    except ValidationError as e:
        raise SpecError(file, problems_from(model, e, root)) from None


def where(file: str, path: str) -> str:
    """``file:line`` of a dotted field path (``probes.0.cpu``) in an
    experiment file, or ``file`` when the line cannot be found: for checks
    made after the file validated (preflight)."""
    try:
        root = yaml.compose(Path(file).read_text(), Loader=yaml.SafeLoader)
    except (OSError, UnicodeDecodeError, yaml.YAMLError):
        return file
    line, _ = _locate(root, tuple(int(k) if k.isdigit() else k for k in path.split(".")))
    return f"{file}:{line}" if line else file


def load(path: str | os.PathLike[str], kinds: HasModels) -> Experiment:
    """An experiment file read with the probe kinds of ``kinds`` (the registry, ``loopscope.kinds.KINDS``)."""
    p = Path(path)
    try:
        text = p.read_text()
    except FileNotFoundError:
        raise InputError(f"{p}: no such experiment file") from None
    except IsADirectoryError:
        raise InputError(f"{p}: is a directory, not an experiment file") from None
    except (OSError, UnicodeDecodeError) as e:
        raise InputError(f"{p}: cannot read: {e}") from None
    return parse(text, str(p), kinds)
