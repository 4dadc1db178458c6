"""The keys a declared JSON type can print, for the docs check of every
``--json`` (tests/test_json_docs.py).

A type is a TypedDict, a pydantic model or a dataclass; its keys are its
fields (a pydantic alias when it has one), and the keys of the types its
fields hold (lists, dicts, unions and NotRequired are looked through).
"""

from __future__ import annotations

import dataclasses
import sys
import types
import typing
from typing import Any

from pydantic import BaseModel
from typing_extensions import is_typeddict


def _hints(t: Any) -> dict[str, Any]:
    """A type's field types; a field whose type is declared only for the type
    checker (the native binding's stub) is opaque: its key counts, not its insides."""
    try:
        return typing.get_type_hints(t)
    except NameError:
        out: dict[str, Any] = {}
        for name, ann in t.__annotations__.items():
            module = t.__module__
            if isinstance(ann, typing.ForwardRef):
                module, ann = ann.__forward_module__ or module, ann.__forward_arg__
            try:
                out[name] = eval(ann, dict(vars(sys.modules[module]))) if isinstance(ann, str) else ann  # noqa: S307 (an annotation of loopscope's own code)
            except NameError:
                out[name] = Any
        return out


def _fields(t: Any) -> dict[str, Any]:
    if is_typeddict(t):
        return _hints(t)
    if isinstance(t, type) and issubclass(t, BaseModel):
        hints = typing.get_type_hints(t)
        return {(f.alias or name): hints.get(name, Any) for name, f in t.model_fields.items()}
    if dataclasses.is_dataclass(t) and isinstance(t, type):
        hints = typing.get_type_hints(t)
        return {f.name: hints.get(f.name, Any) for f in dataclasses.fields(t)}
    return {}


def _inner(t: Any) -> list[Any]:
    """The types a field's type holds: list[X] → X, dict[K, V] → V, X | None → X."""
    origin = typing.get_origin(t)
    if origin is None:
        return [t]
    args = [a for a in typing.get_args(t) if a is not type(None)]
    if origin in (list, tuple, set, frozenset) or origin is typing.Union or origin is types.UnionType:
        return [x for a in args for x in _inner(a)]
    if origin is dict:
        return _inner(args[-1]) if args else []
    if str(origin).endswith(("NotRequired", "Required", "Annotated")):
        return _inner(args[0])
    return []


def keys(t: Any, seen: set[Any] | None = None) -> dict[str, str]:
    """Every key ``t`` can print, each with the type it was found in."""
    seen = set() if seen is None else seen
    if t in seen:
        return {}
    seen.add(t)
    out: dict[str, str] = {}
    for name, ft in _fields(t).items():
        out.setdefault(name, t.__name__)
        for inner in _inner(ft):
            for k, where in keys(inner, seen).items():
                out.setdefault(k, where)
    return out


def undeclared(value: Any, t: Any, path: str = "") -> list[str]:
    """Keys in ``value`` (a printed JSON object) that its declared type ``t``
    does not declare, walking the value and the type together (a ``dict[str, X]``
    holds names, not keys; a field whose type is opaque is not looked into)."""
    origin = typing.get_origin(t)
    if origin is not None and str(origin).endswith(("NotRequired", "Required", "Annotated")):
        return undeclared(value, typing.get_args(t)[0], path)
    if origin is typing.Union or origin is types.UnionType:
        options = [a for a in typing.get_args(t) if a is not type(None)]
        found = [undeclared(value, a, path) for a in options]
        return min(found, key=len) if found else []
    if isinstance(value, list) and origin in (list, tuple, set, frozenset):
        args = typing.get_args(t)
        return [k for i, v in enumerate(value) for k in undeclared(v, args[0] if args else Any, f"{path}[{i}]")] if args else []
    if isinstance(value, dict) and origin is dict:
        args = typing.get_args(t)
        return [k for name, v in value.items() for k in undeclared(v, args[-1], f"{path}.{name}")] if args else []
    fields = _fields(t)
    if isinstance(value, dict) and fields:
        out = [f"{path}.{k}" for k in value if k not in fields]
        for k, v in value.items():
            if k in fields:
                out += undeclared(v, fields[k], f"{path}.{k}")
        return out
    return []
