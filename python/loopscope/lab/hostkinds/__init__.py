"""The host kinds' registry: each kind's lab half by name (``HOST_KINDS``),
one module per kind; ``spec/hostkinds.py`` declares what each kind's entry
in the experiment file holds and what ``auto`` becomes."""

from __future__ import annotations

from loopscope.lab.hostkinds.base import Down, HostKind, HostRt
from loopscope.lab.hostkinds.exec import Exec
from loopscope.lab.hostkinds.local import Local
from loopscope.lab.hostkinds.netns import Netns
from loopscope.lab.hostkinds.ssh import Ssh

HOST_KINDS: dict[str, HostKind] = {k.name: k for k in (Netns(), Local(), Ssh(), Exec())}

__all__ = ["HOST_KINDS", "Down", "HostKind", "HostRt"]
