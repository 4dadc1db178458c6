"""cgroup v2 groups for a run: accounting and a kill that cannot miss.

Every run gets ``<cgroup2 mount>/loopscope/<run id>/``, and every load and
probe a child group of its own, entered by the process itself before it
execs (so nothing it forks can escape). A group's ``cpu.stat`` gives the CPU
time its processes used, ``cgroup.kill`` (Linux 5.14) kills every process
in it at once, and an empty group is removed with rmdir. Where no writable
cgroup2 hierarchy exists (no root, no delegation), ``available()`` says why
and the lab falls back to tracking process ids.
"""

from __future__ import annotations

import os
import time
from pathlib import Path

ROOT_NAME = "loopscope"


def _cgroup2_mounts() -> list[Path]:
    out = []
    try:
        for line in Path("/proc/self/mountinfo").read_text().splitlines():
            left, _, right = line.partition(" - ")
            if right.split(" ")[0] == "cgroup2":
                out.append(Path(left.split(" ")[4]))
    except OSError:
        pass
    return out


def find_root() -> tuple[Path | None, str]:
    """(loopscope's cgroup root, or None, and a sentence saying why)."""
    mounts = [m for m in _cgroup2_mounts() if (m / "cgroup.procs").exists()]
    if not mounts:
        return None, "no cgroup2 hierarchy is mounted"
    why = "no writable cgroup2 hierarchy"
    for m in mounts:
        root = m / ROOT_NAME
        probe = root / f"probe-{os.getpid()}"
        try:
            root.mkdir(exist_ok=True)
            probe.mkdir(exist_ok=True)
            has_kill = (probe / "cgroup.kill").exists()
            probe.rmdir()
        except OSError as e:
            why = f"{root}: cannot create groups ({e.strerror}); run as root or delegate a cgroup"
            continue
        if not has_kill:
            return None, f"{m}: this kernel has no cgroup.kill (needs Linux 5.14)"
        return root, f"cgroup v2 at {m}"
    return None, why


class RunGroup:
    """The cgroup subtree of one run."""

    def __init__(self, root: Path, run_id: str) -> None:
        self.path = root / run_id
        self.path.mkdir(parents=True, exist_ok=True)

    def child(self, name: str) -> Path:
        p = self.path / name
        p.mkdir(parents=True, exist_ok=True)
        return p

    @staticmethod
    def wrap(group: Path, argv: list[str]) -> list[str]:
        """argv that enters ``group`` and then execs the command."""
        return ["/bin/sh", "-c", f'echo $$ > "{group}/cgroup.procs" && exec "$@"', "loopscope-cg", *argv]

    @staticmethod
    def cpu_usec(group: Path) -> int | None:
        try:
            for line in (group / "cpu.stat").read_text().splitlines():
                k, _, v = line.partition(" ")
                if k == "usage_usec":
                    return int(v)
        except OSError:
            return None
        return None

    @staticmethod
    def pids(group: Path) -> list[int]:
        out: list[int] = []
        for p in [group, *group.rglob("*")]:
            f = p / "cgroup.procs"
            try:
                out += [int(x) for x in f.read_text().split()]
            except (OSError, ValueError):
                pass
        return out

    @staticmethod
    def kill(group: Path, timeout: float = 5.0) -> bool:
        """Kill everything in ``group`` and wait until it is empty."""
        try:
            (group / "cgroup.kill").write_text("1")
        except OSError:
            return False
        end = time.monotonic() + timeout
        while time.monotonic() < end:
            if not RunGroup.populated(group):
                return True
            time.sleep(0.02)
        return not RunGroup.populated(group)

    @staticmethod
    def populated(group: Path) -> bool:
        try:
            for line in (group / "cgroup.events").read_text().splitlines():
                if line.startswith("populated "):
                    return line.split()[1] == "1"
        except OSError:
            return False
        return False

    @staticmethod
    def remove(group: Path) -> bool:
        """Kill and remove ``group`` and everything below it."""
        if not group.exists():
            return True
        RunGroup.kill(group)
        ok = True
        for p in sorted([q for q in group.rglob("*") if q.is_dir()], key=lambda q: len(q.parts), reverse=True) + [group]:
            try:
                p.rmdir()
            except OSError:
                ok = False
        return ok


def remove_root_if_empty(run_group: Path) -> None:
    """Remove the shared ``loopscope`` group once no run uses it (rmdir
    fails harmlessly while another run's group is inside)."""
    root = run_group.parent
    if root.name == ROOT_NAME:
        try:
            root.rmdir()
        except OSError:
            pass
