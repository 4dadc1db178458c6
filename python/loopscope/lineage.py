"""A lab child's life tied to its parent's.

Every process the lab starts asks the kernel to signal it when its parent
dies (``PR_SET_PDEATHSIG``), so that no probe, load or reader outlives a
killed agent or controller. The request only covers deaths after it, and a
Python child makes it after its imports, hundreds of milliseconds after the
fork on a loaded machine: a parent killed meanwhile has already handed the
child to another process. So the parent writes its own pid in the child's
environment (``LOOPSCOPE_PDEATHSIG``), and the child, after the request,
checks that its parent is still that pid, and stops if not.

Lowest layer: the kernel reader, the probes and the agent all use it.
"""

from __future__ import annotations

import ctypes
import os
import signal

PR_SET_PDEATHSIG = 1


def die_with_parent(sig: int = signal.SIGKILL, parent: int | None = None) -> bool:
    """Ask the kernel to send ``sig`` when the parent dies; False if it
    already has. ``parent`` is the pid that started this process (default:
    the one in ``LOOPSCOPE_PDEATHSIG``); without one, the parent at the call,
    which misses a death before it."""
    if parent is None:
        parent = parent_from_env()
    ppid = os.getppid() if parent is None else parent
    try:
        libc = ctypes.CDLL(None, use_errno=True)
        libc.prctl(PR_SET_PDEATHSIG, sig, 0, 0, 0)
    except (OSError, AttributeError):
        return True
    return os.getppid() == ppid


def parent_from_env() -> int | None:
    """The pid ``LOOPSCOPE_PDEATHSIG`` names: the process this one dies with."""
    v = os.environ.get("LOOPSCOPE_PDEATHSIG", "")
    return int(v) if v.isdigit() and int(v) > 0 else None
