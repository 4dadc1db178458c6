"""Command-line options made from a probe's parameter model.

``loopscope probe KIND`` takes the same parameters as the experiment
file's probe of that kind, under the same names (``interval_us`` is
``--interval-us``), with the model's help, default and bounds: the
model (``probes/params.py``, a ``Params``) is the one declaration. A field may
add short or older spellings in its ``json_schema_extra`` (``x-flags``).
Values click has already range-checked are validated by the model again,
and a refusal names the option.
"""

from __future__ import annotations

import re
import types
import typing
from typing import Any, Callable, Literal, Mapping, TypeVar, get_args, get_origin

import annotated_types as at
import click
from pydantic import BaseModel, ValidationError
from pydantic.fields import FieldInfo

from loopscope.cli.base import CpuList
from loopscope.errors import InputError

F = TypeVar("F", bound=Callable[..., Any])
M = TypeVar("M", bound=BaseModel)


def _unwrap(annotation: Any) -> tuple[Any, bool, list[Any]]:
    """(the bare type, whether None is allowed, the bound metadata found on the way)."""
    meta: list[Any] = []
    optional = False
    t = annotation
    while True:
        origin = get_origin(t)
        if origin is typing.Annotated:
            args = get_args(t)
            t = args[0]
            for m in args[1:]:
                meta.extend(m.metadata if isinstance(m, FieldInfo) else [m])
        elif origin in (typing.Union, types.UnionType):
            rest = [a for a in get_args(t) if a is not type(None)]
            optional = optional or len(rest) < len(get_args(t))
            if len(rest) != 1:
                return t, optional, meta
            t = rest[0]
        else:
            return t, optional, meta


def _range(meta: list[Any]) -> tuple[Any, Any, bool, bool]:
    lo: Any = None
    hi: Any = None
    lo_open = hi_open = False
    for m in meta:
        if isinstance(m, at.Ge):
            lo = m.ge
        elif isinstance(m, at.Gt):
            lo, lo_open = m.gt, True
        elif isinstance(m, at.Le):
            hi = m.le
        elif isinstance(m, at.Lt):
            hi, hi_open = m.lt, True
    return lo, hi, lo_open, hi_open


def _click_type(name: str, annotation: Any, meta: list[Any]) -> Any:
    t, _, inner = _unwrap(annotation)
    meta = meta + inner
    if get_origin(t) is list:
        (item,) = get_args(t)
        bare, _, _ = _unwrap(item)
        if bare is int:  # CPU numbers, the only integer lists: 1, 0,2 or 0-3
            return CpuList()
        return click.STRING  # comma-separated; split in _values
    if get_origin(t) is Literal:
        return click.Choice([str(a) for a in get_args(t)])
    if t is int:
        lo, hi, lo_open, hi_open = _range(meta)
        return click.IntRange(lo, hi, min_open=lo_open, max_open=hi_open) if lo is not None or hi is not None else click.INT
    if t is float:
        lo, hi, lo_open, hi_open = _range(meta)
        return click.FloatRange(lo, hi, min_open=lo_open, max_open=hi_open) if lo is not None or hi is not None else click.FLOAT
    return click.STRING


def flag(name: str) -> str:
    """The option a field becomes: ``interval_us`` → ``--interval-us``."""
    return "--" + name.replace("_", "-")


def options(model: type[BaseModel], skip: tuple[str, ...] = ()) -> Callable[[F], F]:
    """Click options for every field of ``model`` but ``skip``, in the model's order."""

    def deco(fn: F) -> F:
        for name, f in reversed(list(model.model_fields.items())):
            if name in skip:
                continue
            extra = f.json_schema_extra if isinstance(f.json_schema_extra, dict) else {}
            more = [str(x) for x in extra.get("x-flags", [])]  # type: ignore[union-attr]
            t, optional, _ = _unwrap(f.annotation)
            help_text = (f.description or "").rstrip(".")
            if not re.match(r"^[a-z_]+:", help_text):  # "udp: …" defines a value: left as written
                help_text = help_text[:1].upper() + help_text[1:]
            help_text += "."
            if t is bool:
                decl = [f"{flag(name)}/--no-{name.replace('_', '-')}", name]
                fn = click.option(*decl, default=f.default, show_default=True, help=help_text)(fn)
                continue
            default = None if f.is_required() else f.get_default(call_default_factory=True)
            if isinstance(default, list):  # a comma list on the command line
                default = ",".join(str(x) for x in default)
            fn = click.option(
                flag(name),
                *more,
                name,
                type=_click_type(name, f.annotation, list(f.metadata)),
                default=default,
                required=f.is_required(),
                show_default=default is not None,
                help=help_text,
            )(fn)
        return fn

    return deco


def build(model: type[M], values: Mapping[str, object]) -> M:
    """The model from parsed option values (comma lists split), a refusal naming the option."""
    data: dict[str, object] = {}
    for name, f in model.model_fields.items():
        if name not in values:
            continue
        v = values[name]
        t, _, _ = _unwrap(f.annotation)
        if get_origin(t) is list and isinstance(v, str):
            v = [x.strip() for x in v.split(",") if x.strip()]
        if v is not None or not f.is_required():
            data[name] = v
    try:
        return model.model_validate(data)
    except ValidationError as e:
        err = e.errors()[0]
        where = flag(str(err["loc"][0])) if err["loc"] else "options"
        raise InputError(f"{where}: {err['msg']} [got {err.get('input')!r}]") from None
