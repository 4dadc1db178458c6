"""Where this machine keeps loopscope's state between processes: the
registered runs (``lab/state.py``) and the tunings' journals
(``host/tunings.py``), the controller's and an agent's alike. The first
writable of ``/run/loopscope`` (root), ``$XDG_RUNTIME_DIR/loopscope`` and
``/tmp/loopscope-<uid>``: a tmpfs where there is one, since what is kept
here (process ids, settings of the running kernel) means nothing after a
reboot."""

from __future__ import annotations

import os
from pathlib import Path


def state_dir() -> Path:
    for d in (Path("/run/loopscope"), Path(os.environ.get("XDG_RUNTIME_DIR", "/nonexistent")) / "loopscope", Path(f"/tmp/loopscope-{os.getuid()}")):
        try:
            d.mkdir(parents=True, exist_ok=True)
            if os.access(d, os.W_OK):
                return d
        except OSError:
            continue
    raise OSError("no writable directory for run state (/run/loopscope, $XDG_RUNTIME_DIR, /tmp)")
