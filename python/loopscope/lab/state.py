"""Where running runs are registered, so a killed one can be cleaned up.

The controller writes one small JSON file per run while it runs (its pid
and start time, the agent's, the cgroup, the run directory) and removes it
when the run ends however it ends. A file whose controller is gone belongs to
a run that was killed (SIGKILL, power loss): ``loopscope cleanup`` reads it
to kill what is left and tidy the run directory's status.
"""

from __future__ import annotations

import json
import os
from pathlib import Path
from typing import Any


def state_dir() -> Path:
    for d in (Path("/run/loopscope"), Path(os.environ.get("XDG_RUNTIME_DIR", "/nonexistent")) / "loopscope", Path(f"/tmp/loopscope-{os.getuid()}")):
        try:
            d.mkdir(parents=True, exist_ok=True)
            if os.access(d, os.W_OK):
                return d
        except OSError:
            continue
    raise OSError("no writable directory for run state (/run/loopscope, $XDG_RUNTIME_DIR, /tmp)")


def register(run_id: str, info: dict[str, Any]) -> Path:
    p = state_dir() / f"{run_id}.json"
    tmp = p.with_suffix(".tmp")
    tmp.write_text(json.dumps(info))
    tmp.replace(p)
    return p


def update(run_id: str, **kw: Any) -> None:
    p = state_dir() / f"{run_id}.json"
    try:
        info = json.loads(p.read_text())
    except (OSError, json.JSONDecodeError):
        return
    info.update(kw)
    register(run_id, info)


def unregister(run_id: str) -> None:
    try:
        (state_dir() / f"{run_id}.json").unlink()
    except (OSError, FileNotFoundError):
        pass


def registered() -> list[dict[str, Any]]:
    out = []
    try:
        files = sorted(state_dir().glob("*.json"))
    except OSError:
        return []
    for f in files:
        try:
            out.append(json.loads(f.read_text()))
        except (OSError, json.JSONDecodeError):
            continue
    return out
