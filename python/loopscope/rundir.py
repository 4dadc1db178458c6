"""A run directory, as the commands that read one open it.

``RunDir.open`` is the one place that decides whether a path is a run
directory (it holds the ``run.json`` that ``loopscope run`` writes first)
and says so in one message, exit code 2, naming the path. It is the seed of
the typed run directory: paths of the files every reader looks for, and
the run record read once.
"""

from __future__ import annotations

import json
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from loopscope.errors import InputError


@dataclass(frozen=True)
class RunDir:
    path: Path

    @classmethod
    def open(cls, path: str | Path) -> RunDir:
        p = Path(path)
        if not (p / "run.json").is_file():
            raise InputError(f"{path}: not a run directory (no run.json); give a directory `loopscope run` printed")
        return cls(p)

    @property
    def run_json(self) -> Path:
        return self.path / "run.json"

    @property
    def provenance_json(self) -> Path:
        return self.path / "provenance.json"

    def run(self) -> dict[str, Any]:
        """The run record (run.json); InputError naming the file when it is damaged."""
        try:
            return json.loads(self.run_json.read_text())  # type: ignore[no-any-return]
        except (OSError, json.JSONDecodeError) as e:
            raise InputError(f"{self.run_json}: cannot be read ({e}); the run directory is damaged") from None
