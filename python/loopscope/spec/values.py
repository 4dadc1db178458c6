"""The values an experiment file holds as a user types them (``10s``,
``2GB``, a load level), each parsed and checked where it is read, and
``Model``, the base of every model of the file (unknown fields refused).
"""

from __future__ import annotations

import re
from typing import Annotated, Union

from pydantic import BaseModel, BeforeValidator, ConfigDict, Field, PlainSerializer, WithJsonSchema
from pydantic_core import PydanticCustomError

from loopscope.units import duration_text, parse_duration_ns


def duration_value(v: object) -> int:
    if isinstance(v, bool) or not isinstance(v, (str, int, float)):
        raise PydanticCustomError("duration", "must be a duration like 30s, 500ms or 2m [got {got}]", {"got": v})
    if isinstance(v, (int, float)):
        raise PydanticCustomError("duration", "needs a unit, e.g. {got}s or {got}ms [got {got}]", {"got": v})
    try:
        return parse_duration_ns(v)
    except ValueError as e:
        raise PydanticCustomError("duration", "{why}", {"why": str(e)}) from None


Duration = Annotated[
    int,
    BeforeValidator(duration_value),
    PlainSerializer(duration_text, return_type=str),
    WithJsonSchema({"type": "string", "pattern": r"^\s*[0-9]*\.?[0-9]+\s*(ns|us|µs|ms|s|m|min|h)\s*$", "examples": ["30s", "500ms", "2m"]}),
]


def zero_or_duration_value(v: object) -> int:
    if v in (0, "0"):
        return 0
    return duration_value(v)


OptDuration = Annotated[
    int,
    BeforeValidator(zero_or_duration_value),
    PlainSerializer(lambda ns: duration_text(ns) if ns else "0", return_type=str),
    WithJsonSchema({"type": ["string", "integer"], "description": "a duration like 5s, or 0", "examples": ["5s", 0]}),
]


class Level(BaseModel):
    """How much of a load: a number of processes, or a duty cycle on every CPU."""

    model_config = ConfigDict(frozen=True)
    processes: int | None = None
    percent: float | None = None

    def label(self) -> str:
        if self.percent is not None:
            return f"{self.percent:g}pct"
        return str(self.processes)

    def __str__(self) -> str:
        return f"{self.percent:g}%" if self.percent is not None else f"{self.processes}"


def level_value(v: object) -> Level:
    msg = "must be a number of processes (1..512, e.g. 2) or a duty cycle on every CPU (1..100 %, e.g. '50%') [got {got}]"
    if isinstance(v, Level):
        return v
    if isinstance(v, bool):
        raise PydanticCustomError("level", msg, {"got": v})
    if isinstance(v, int):
        if 1 <= v <= 512:
            return Level(processes=v)
        raise PydanticCustomError("level", msg, {"got": v})
    if isinstance(v, str):
        m = re.fullmatch(r"\s*([0-9]+(?:\.[0-9]+)?)\s*%\s*", v)
        if m and 1 <= float(m.group(1)) <= 100:
            return Level(percent=float(m.group(1)))
        if re.fullmatch(r"\s*[0-9]+\s*", v) and 1 <= int(v) <= 512:
            return Level(processes=int(v))
    raise PydanticCustomError("level", msg, {"got": v})


LevelField = Annotated[
    Level,
    BeforeValidator(level_value),
    PlainSerializer(lambda lv: lv.percent and f"{lv.percent:g}%" or lv.processes, return_type=Union[int, str]),
    WithJsonSchema(
        {
            "oneOf": [
                {"type": "integer", "minimum": 1, "maximum": 512, "description": "processes"},
                {"type": "string", "pattern": r"^[0-9]+(\.[0-9]+)?%$", "description": "duty cycle on every CPU, 1..100 %"},
            ]
        }
    ),
]

Name = Annotated[str, Field(pattern=r"^[A-Za-z0-9][A-Za-z0-9._-]{0,63}$", description="letters, digits, . _ - (used in file names)")]


class Model(BaseModel):
    model_config = ConfigDict(extra="forbid", populate_by_name=True, defer_build=True)


#: CPU numbers, as a list
CpuList = list[Annotated[int, Field(ge=0)]]
