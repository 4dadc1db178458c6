"""Where running runs are registered, so a killed one can be cleaned up.

The controller writes one small JSON file per run while it runs (its pid
and start time, the agent's, the cgroup, the run directory) and removes it
when the run ends however it ends. A file whose controller is gone belongs to
a run that was killed (SIGKILL, power loss): ``loopscope cleanup`` reads it
to kill what is left and tidy the run directory's status.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

from pydantic import BaseModel, ConfigDict, Field, ValidationError

from loopscope.host.statedir import state_dir as state_dir


class AgentEntry(BaseModel):
    """One of the run's local agents: its host, pid and start time (a pid reused by another process is not it)."""

    host: str | None = None
    pid: int | None = None
    start: int | None = None


class RunState(BaseModel):
    """What a running run registers: enough to find and remove what it left if it is killed."""

    model_config = ConfigDict(extra="allow")

    run_id: str
    run_dir: str = ""
    controller_pid: int
    controller_start: int | None = None
    agents: list[AgentEntry] = Field(default_factory=list)
    agent_pid: int | None = None
    agent_start: int | None = None
    cgroup: str | None = None
    cgroups: list[str] = Field(default_factory=list)
    namespaces: list[str] = Field(default_factory=list)


def register(info: RunState) -> Path:
    p = state_dir() / f"{info.run_id}.json"
    tmp = p.with_suffix(".tmp")
    tmp.write_text(info.model_dump_json())
    tmp.replace(p)
    return p


def _read(p: Path) -> RunState | None:
    try:
        return RunState.model_validate_json(p.read_text())
    except (OSError, ValidationError):
        return None


def update(run_id: str, **kw: Any) -> None:
    info = _read(state_dir() / f"{run_id}.json")
    if info is None:
        return
    register(RunState.model_validate({**info.model_dump(), **kw}))


def unregister(run_id: str) -> None:
    try:
        (state_dir() / f"{run_id}.json").unlink()
    except (OSError, FileNotFoundError):
        pass


def registered() -> list[RunState]:
    """Every run registered here (a file that is not one is passed over)."""
    try:
        files = sorted(state_dir().glob("*.json"))
    except OSError:
        return []
    return [info for f in files if (info := _read(f)) is not None]
