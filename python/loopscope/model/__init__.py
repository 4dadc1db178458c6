"""Node calibration and portable CPU-time models (Carlinet et al. 2000): ``node`` (what a
machine charges for system calls and execution environments, per load),
``app`` (a program's CPU time and system-call structure), ``predict`` (an
app carried from one node or condition to another)."""

from __future__ import annotations

from typing import TypeVar

from pydantic import BaseModel
from pydantic import ValidationError
from loopscope.errors import InputError
import json

M = TypeVar("M", bound=BaseModel)


def read_model(path: str, model: type[M], what: str, fmt: str, version: int, writer: str) -> M:
    """A model file read into ``model`` (``read_versioned``'s checks first,
    then each part against its model): anything else is bad input naming the
    file, the field and the command that writes a good one."""

    data = read_versioned(path, what, fmt, version, writer)
    try:
        return model.model_validate(data)
    except ValidationError as e:
        err = e.errors()[0]
        raise InputError(f"{path}: {'.'.join(str(x) for x in err['loc'])}: {err['msg']}; write it again with {writer}") from None


def read_versioned(path: str, what: str, fmt: str, version: int, writer: str) -> dict[str, object]:
    """A model file, its format and version checked: anything else is bad
    input naming the file and the command that writes a good one."""

    try:
        with open(path) as f:
            m = json.loads(f.read())
    except OSError as e:
        raise InputError(f"{path}: cannot read the {what}: {e.strerror}") from None
    except ValueError as e:
        raise InputError(f"{path}: not JSON ({e}); a {what} is written by `{writer}`") from None
    if not isinstance(m, dict) or m.get("format") != fmt:
        got = m.get("format") if isinstance(m, dict) else None
        raise InputError(f"{path}: not a {what} (format {got!r}, expected {fmt!r}); write one with `{writer}`")
    if m.get("version") != version:
        again = writer.split()[-1]
        raise InputError(f"{path}: {what} format version {m.get('version')!r}; this loopscope reads version {version}: calibrate the {again} again")
    return m
