"""How loopscope's own processes name themselves to the kernel.

Attribution names the tasks that ran while a probe waited by the name the
kernel records for them (``comm``, 15 characters). loopscope's own
components take names that say what they are, so that the lab can name
itself among the causes instead of showing up as ``python``:

==============  ==================================================
``ls-kcapture``  the kernel capture's reader          → lab: capture
``ls-agent``     a host's agent                       → lab: agent
``ls-ctl``       the controller                       → lab: agent
``ls-netem``     the link emulator                    → lab: emulator
``ls-sync…``     clock-sync probes                    → lab: sync
``ls-probe``     a probe process's main thread        → lab: probe
``ld:<name>``    a worker of the load called <name>   → load: <name>
==============  ==================================================

Threads take their creator's name, so a process names itself before it
starts any. ``LOOPSCOPE_COMM`` in the environment names a loopscope child
the same way, from the package's first import (the agent sets it for load
workers and probes; a program a probe runs does not inherit it).
"""

from __future__ import annotations

import ctypes
import os

PR_SET_NAME = 15


def set_comm(name: str) -> bool:
    """Name the calling thread (and the threads it starts later) ``name`` (cut to 15 bytes)."""
    try:
        libc = ctypes.CDLL(None, use_errno=True)
        return libc.prctl(PR_SET_NAME, ctypes.c_char_p(name.encode()[:15]), 0, 0, 0) == 0
    except (OSError, AttributeError):
        return False


def current() -> str:
    try:
        with open("/proc/thread-self/comm") as f:
            return f.read().strip()
    except OSError:
        return ""


def from_env() -> None:
    """Take the name ``LOOPSCOPE_COMM`` gives, if any."""
    name = os.environ.get("LOOPSCOPE_COMM")
    if name:
        set_comm(name)


def load_comm(load_name: str) -> str:
    return f"ld:{load_name}"[:15]
