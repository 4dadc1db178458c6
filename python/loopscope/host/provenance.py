"""What a run's numbers depend on: the machine, its settings, our privileges.

Gathered by the agent on its host when a run starts and stored in the run
directory, so that a figure can always be traced back to the kernel, CPU,
clocksource, frequency governor, idle driver, privileges and software that
produced it. Every field is read, never guessed; what cannot be read says so.
"""

from __future__ import annotations

import ctypes
import os
import platform
import shutil
import socket
import subprocess
import sys
import time
from importlib.metadata import PackageNotFoundError, version
from pathlib import Path

from loopscope.rundir import Chrony, ClockDiscipline, CpuFreq, GitInfo, KernelClock, Machine

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
    for pkg in ("loopscope", "numpy", "polars", "nanoarrow", "pydantic", "scipy", "rich", "click"):
        try:
            out[pkg] = version(pkg)
        except PackageNotFoundError:
            out[pkg] = None
    return out


def _git() -> GitInfo:
    here = Path(__file__).resolve().parent
    try:
        sha = subprocess.run(["git", "-C", str(here), "rev-parse", "HEAD"], capture_output=True, text=True, timeout=5)
        if sha.returncode != 0:
            return GitInfo(sha=None, note="not running from a git checkout")
        dirty = subprocess.run(["git", "-C", str(here), "status", "--porcelain", "--untracked-files=no"], capture_output=True, text=True, timeout=5)
        return GitInfo(sha=sha.stdout.strip(), dirty=bool(dirty.stdout.strip()))
    except (OSError, subprocess.TimeoutExpired):
        return GitInfo(sha=None, note="git is not available")


def _cpufreq() -> CpuFreq:
    govs = {}
    for d in sorted(Path("/sys/devices/system/cpu").glob("cpu[0-9]*")):
        g = _read(str(d / "cpufreq" / "scaling_governor"))
        if g:
            govs[d.name] = g
    return CpuFreq(governors=govs or None, note=None if govs else "no cpufreq driver (typical in a VM): frequency is the host's business")


class _Timex(ctypes.Structure):
    # struct timex (x86_64): the fields read here come first; the rest is padding.
    _fields_ = [
        ("modes", ctypes.c_uint),
        ("offset", ctypes.c_long),
        ("freq", ctypes.c_long),
        ("maxerror", ctypes.c_long),
        ("esterror", ctypes.c_long),
        ("status", ctypes.c_int),
        ("constant", ctypes.c_long),
        ("precision", ctypes.c_long),
        ("tolerance", ctypes.c_long),
        ("time_sec", ctypes.c_long),
        ("time_usec", ctypes.c_long),
        ("tick", ctypes.c_long),
        ("ppsfreq", ctypes.c_long),
        ("jitter", ctypes.c_long),
        ("shift", ctypes.c_int),
        ("stabil", ctypes.c_long),
        ("jitcnt", ctypes.c_long),
        ("calcnt", ctypes.c_long),
        ("errcnt", ctypes.c_long),
        ("stbcnt", ctypes.c_long),
        ("tai", ctypes.c_int),
        ("pad", ctypes.c_int * 11),
    ]


def clock_discipline() -> ClockDiscipline:
    """What disciplines this host's CLOCK_REALTIME: the kernel's NTP state
    (adjtimex, read only), chrony's tracking report and whether ptp4l or
    phc2sys run. Recorded per host because a clock slewed or stepped by a
    daemon during a run is what the clock-sync estimate has to follow."""
    out = ClockDiscipline()
    try:
        tx = _Timex()
        libc = ctypes.CDLL(None, use_errno=True)
        state = libc.adjtimex(ctypes.byref(tx))
        if state >= 0:
            STA_UNSYNC, STA_NANO = 0x0040, 0x2000
            out.kernel = KernelClock(
                state={0: "TIME_OK", 1: "TIME_INS", 2: "TIME_DEL", 3: "TIME_OOP", 4: "TIME_WAIT", 5: "TIME_ERROR"}.get(state, str(state)),
                synchronised=not tx.status & STA_UNSYNC,
                frequency_ppm=tx.freq / 65536.0,
                offset_ns=tx.offset if tx.status & STA_NANO else tx.offset * 1000,
                max_error_us=tx.maxerror,
                est_error_us=tx.esterror,
                tai_offset_s=tx.tai,
            )
    except (OSError, AttributeError):
        out.kernel = None
    if shutil.which("chronyc"):
        try:
            r = subprocess.run(["chronyc", "-c", "tracking"], capture_output=True, text=True, timeout=2)
            f = r.stdout.strip().split(",")
            if r.returncode == 0 and len(f) >= 14:
                out.chrony = Chrony(
                    reference=f[1],
                    stratum=int(f[2]),
                    system_time_offset_s=float(f[4]),
                    last_offset_s=float(f[5]),
                    rms_offset_s=float(f[6]),
                    frequency_ppm=float(f[7]),
                    skew_ppm=float(f[9]),
                    leap=f[13],
                )
            else:
                out.chrony = Chrony(note=(r.stderr.strip() or r.stdout.strip() or "chronyd not answering")[:200])
        except (OSError, subprocess.TimeoutExpired, ValueError) as e:
            out.chrony = Chrony(note=str(e)[:200])
    running = []
    for d in Path("/proc").iterdir():
        if d.name.isdigit():
            try:
                comm = (d / "comm").read_text().strip()
            except OSError:
                continue
            if comm in ("ptp4l", "phc2sys", "chronyd", "ntpd", "systemd-timesyn"):
                running.append(comm)
    out.daemons = sorted(set(running))
    return out


def gather(cgroup_note: str | None = None) -> Machine:
    u = os.uname()
    try:
        load = os.getloadavg()
    except OSError:
        load = None
    return Machine.model_validate(
        {
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
            "clock_discipline": clock_discipline(),
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
            "boot_id": _read("/proc/sys/kernel/random/boot_id"),
            "pid_ns": _ns_inode("pid"),
            "loopscope_version": _own_version(),
        }
    )


def _ns_inode(kind: str) -> int | None:
    """The inode of this process's ``kind`` namespace: equal on two hosts of one kernel when they see the same process ids."""
    try:
        return os.stat(f"/proc/self/ns/{kind}").st_ino
    except OSError:
        return None


def _own_version() -> str:
    import loopscope

    return str(loopscope.__version__)


def _preempt_from_version(v: str) -> str | None:
    for word in ("PREEMPT_RT", "PREEMPT_DYNAMIC", "PREEMPT"):
        if word in v:
            return word
    return None
