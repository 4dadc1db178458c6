"""Field types shared by the experiment file's models (``spec``) and the
probes' parameter models (``probes/params.py``), which sit side by side in
the layers: one rule for a rate or an endpoint, checked the same in both."""

from __future__ import annotations

import re
import shlex
from typing import Annotated, Any

from pydantic import AfterValidator, BeforeValidator, WithJsonSchema
from pydantic_core import PydanticCustomError

from loopscope.units import parse_rate

ENDPOINT = re.compile(r"^(?P<host>[^:\s]+):(?P<port>[0-9]{1,5})$")


def pps(what: str) -> Any:
    """A rate in messages per second (``1000pps``), for ``what`` in messages."""

    def check(v: object) -> str:
        try:
            _, kind = parse_rate(str(v))
        except ValueError as e:
            raise PydanticCustomError("rate", "{why}", {"why": str(e)}) from None
        if kind != "pps":
            raise PydanticCustomError("rate", "{what} rate is messages per second, like 1000pps [got {got}]", {"what": what, "got": v})
        return str(v)

    return Annotated[str, BeforeValidator(check)]


def _hostport(lowest: int, example: str, what: str) -> Any:
    """HOST:PORT with a port from ``lowest`` to 65535."""

    def check(v: str) -> str:
        m = ENDPOINT.match(v)
        if m is None or not lowest <= int(m["port"]) <= 65535:
            raise PydanticCustomError(
                "hostport",
                "must be HOST:PORT with a port {lowest}..65535{what}, e.g. {example} [got {got}]",
                {"lowest": lowest, "what": what, "example": example, "got": v},
            )
        return v

    return Annotated[str, AfterValidator(check)]


#: HOST:PORT of a server
Endpoint = _hostport(1, "127.0.0.1:7000", "")
#: HOST:PORT a server binds (port 0: the kernel picks one)
Bind = _hostport(0, "0.0.0.0:7000", " (0: any free port)")


def _command(v: object) -> list[str]:
    """A command line as a string (split as a shell would) or a list of arguments."""
    if isinstance(v, str):
        try:
            parts = shlex.split(v)
        except ValueError as e:
            raise PydanticCustomError("command", "is not a valid command line: {why}", {"why": str(e)}) from None
    elif isinstance(v, list) and all(isinstance(x, str) for x in v):
        parts = v
    else:
        raise PydanticCustomError("command", "must be a command line or a list of arguments [got {got}]", {"got": v})
    if not parts:
        raise PydanticCustomError("command", "must not be empty", {})
    return parts


Command = Annotated[list[str], BeforeValidator(_command), WithJsonSchema({"oneOf": [{"type": "string"}, {"type": "array", "items": {"type": "string"}}]})]
