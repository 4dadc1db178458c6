"""Run a probe from a ``Launch``: what an agent's probe process does.

The agent starts ``loopscope probe launch LAUNCH_JSON``; this module finds
the probe's module by kind, validates the parameters with its model (the
same model the experiment file was checked with, so nothing is parsed back
from text), and runs it. Each probe module answers ``PARAMS`` (its model)
and ``launched(params, launch)`` (its result, with ``to_json()`` and
``interrupted``). Modules are imported only when their kind runs.
"""

from __future__ import annotations

import importlib
from typing import Any, Protocol

from pydantic import ValidationError

from loopscope.errors import InputError
from loopscope.probes.params import Launch, Params

#: kind → the module that runs it
MODULES = {"timer": "loopscope.probes.timer", "sched": "loopscope.probes.sched", "syscall": "loopscope.probes.syscall"}


class Result(Protocol):
    interrupted: bool

    def to_json(self) -> dict[str, Any]: ...


def params_of(kind: str) -> type[Params]:
    """The parameter model of a kind that starts from a ``Launch``."""
    mod = importlib.import_module(MODULES[kind])
    model: type[Params] = mod.PARAMS
    return model


def run(launch: Launch) -> Result:
    """Validate the parameters with the kind's model and run the probe."""
    if launch.kind not in MODULES:
        raise InputError(f"launch: unknown probe kind {launch.kind!r}; known: {', '.join(sorted(MODULES))}")
    mod = importlib.import_module(MODULES[launch.kind])
    try:
        p = mod.PARAMS.model_validate(launch.params)
    except ValidationError as e:
        err = e.errors()[0]
        raise InputError(f"launch: {launch.kind}.{'.'.join(str(x) for x in err['loc'])}: {err['msg']}") from None
    res: Result = mod.launched(p, launch)
    return res
