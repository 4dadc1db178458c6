"""What a run's numbers depend on: the machine, its settings, our privileges.

Gathered by the agent on its host when a run starts and stored in the run
directory, so that a figure can always be traced back to the kernel, CPU,
clocksource, frequency governor, idle driver, privileges and software that
produced it. Every field is read, never guessed; what cannot be read says so.
"""

from __future__ import annotations

import os
import platform
import socket
import subprocess
import sys
import time
from importlib.metadata import PackageNotFoundError, version
from pathlib import Path
from typing import Any

# Bits of CapEff in /proc/self/status.
CAPS = {"CAP_SYS_NICE": 23, "CAP_NET_ADMIN": 12, "CAP_SYS_ADMIN": 21, "CAP_IPC_LOCK": 14, "CAP_SYS_RESOURCE": 24}


def _read(path: str) -> str | None:
    try:
        return Path(path).read_text().strip()
    except OSError:
        return None


def _cpu_model() -> str | None:
    info = _read("/proc/cpuinfo") or ""
    for line in info.splitlines():
        if line.startswith("model name"):
            return line.split(":", 1)[1].strip()
    return None


def _caps() -> dict[str, bool]:
    status = _read("/proc/self/status") or ""
    eff = 0
    for line in status.splitlines():
        if line.startswith("CapEff:"):
            eff = int(line.split()[1], 16)
    return {k: bool(eff >> bit & 1) for k, bit in CAPS.items()}


def _versions() -> dict[str, str | None]:
    out: dict[str, str | None] = {"python": platform.python_version()}
    for pkg in ("loopscope", "numpy", "polars", "pyarrow", "pydantic", "scipy", "rich", "click"):
        try:
            out[pkg] = version(pkg)
        except PackageNotFoundError:
            out[pkg] = None
    return out


def _git() -> dict[str, Any]:
    here = Path(__file__).resolve().parent
    try:
        sha = subprocess.run(["git", "-C", str(here), "rev-parse", "HEAD"], capture_output=True, text=True, timeout=5)
        if sha.returncode != 0:
            return {"sha": None, "note": "not running from a git checkout"}
        dirty = subprocess.run(["git", "-C", str(here), "status", "--porcelain", "--untracked-files=no"], capture_output=True, text=True, timeout=5)
        return {"sha": sha.stdout.strip(), "dirty": bool(dirty.stdout.strip())}
    except (OSError, subprocess.TimeoutExpired):
        return {"sha": None, "note": "git is not available"}


def _cpufreq() -> dict[str, Any]:
    govs = {}
    for d in sorted(Path("/sys/devices/system/cpu").glob("cpu[0-9]*")):
        g = _read(str(d / "cpufreq" / "scaling_governor"))
        if g:
            govs[d.name] = g
    return {"governors": govs or None, "note": None if govs else "no cpufreq driver (typical in a VM): frequency is the host's business"}


def gather(cgroup_note: str | None = None) -> dict[str, Any]:
    u = os.uname()
    try:
        load = os.getloadavg()
    except OSError:
        load = None
    return {
        "host": socket.gethostname(),
        "time_utc": time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime()),
        "kernel": {"release": u.release, "version": u.version, "machine": u.machine, "cmdline": _read("/proc/cmdline")},
        "cpu": {
            "model": _cpu_model(),
            "cpus": os.cpu_count(),
            "usable_cpus": sorted(os.sched_getaffinity(0)),
            "isolated": _read("/sys/devices/system/cpu/isolated"),
            "smt": _read("/sys/devices/system/cpu/smt/active"),
        },
        "memory_kib": next((int(l.split()[1]) for l in (_read("/proc/meminfo") or "").splitlines() if l.startswith("MemTotal:")), None),
        "clocksource": _read("/sys/devices/system/clocksource/clocksource0/current_clocksource"),
        "cpufreq": _cpufreq(),
        "cpuidle_driver": _read("/sys/devices/system/cpu/cpuidle/current_driver"),
        "preempt": _read("/sys/kernel/debug/sched/preempt") or _preempt_from_version(u.version),
        "loadavg_at_start": load,
        "privileges": {"euid": os.geteuid(), "capabilities": _caps()},
        "cgroup": cgroup_note,
        "tracefs": next((p for p in ("/sys/kernel/tracing", "/sys/kernel/debug/tracing") if Path(p, "trace").exists()), None),
        "software": _versions(),
        "loopscope_git": _git(),
        "executable": sys.executable,
    }


def _preempt_from_version(v: str) -> str | None:
    for word in ("PREEMPT_RT", "PREEMPT_DYNAMIC", "PREEMPT"):
        if word in v:
            return word
    return None
