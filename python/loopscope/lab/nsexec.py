"""Run a command inside a network namespace and, optionally, a time namespace.

``python -m loopscope.lab.nsexec --net /run/netns/NAME --monotonic-ns N -- CMD…``
joins the network namespace with ``setns`` only (unlike ``ip netns exec``,
which also remounts /sys and so hides the cgroup file system the agent
needs), then, for a clock offset, creates a time namespace whose
CLOCK_MONOTONIC and CLOCK_BOOTTIME run ``N`` ns ahead (or behind) and execs
the command, which enters it (time namespaces apply to children and to the
program an unsharing process executes). ``unshare --time --monotonic``
takes whole seconds only; offsets here are nanoseconds.
"""

from __future__ import annotations

import ctypes
import os
import sys

CLONE_NEWNET = 0x40000000
CLONE_NEWTIME = 0x00000080


def _libc() -> ctypes.CDLL:
    return ctypes.CDLL(None, use_errno=True)


def join_netns(path: str) -> None:
    fd = os.open(path, os.O_RDONLY | os.O_CLOEXEC)
    try:
        if _libc().setns(fd, CLONE_NEWNET) != 0:
            e = ctypes.get_errno()
            raise OSError(e, f"setns({path}): {os.strerror(e)}")
    finally:
        os.close(fd)


def new_time_namespace(offset_ns: int) -> None:
    if _libc().unshare(CLONE_NEWTIME) != 0:
        e = ctypes.get_errno()
        raise OSError(e, f"unshare(CLONE_NEWTIME): {os.strerror(e)} (time namespaces need Linux 5.6+ and CAP_SYS_ADMIN)")
    sec, ns = divmod(offset_ns, 1_000_000_000)
    with open("/proc/self/timens_offsets", "w") as f:
        f.write(f"monotonic {sec} {ns}\nboottime {sec} {ns}\n")


def main(argv: list[str]) -> int:
    net = None
    offset = 0
    i = 0
    while i < len(argv) and argv[i] != "--":
        if argv[i] == "--net":
            net = argv[i + 1]
            i += 2
        elif argv[i] == "--monotonic-ns":
            offset = int(argv[i + 1])
            i += 2
        else:
            sys.stderr.write(f"loopscope nsexec: unknown option {argv[i]!r}\n")
            return 2
    cmd = argv[i + 1 :]
    if not cmd:
        sys.stderr.write("loopscope nsexec: no command after --\n")
        return 2
    try:
        if net:
            join_netns(net)
        if offset:
            new_time_namespace(offset)
        os.execvp(cmd[0], cmd)
    except OSError as e:
        sys.stderr.write(f"loopscope nsexec: {e}\n")
        return 1
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
