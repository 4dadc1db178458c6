"""``loopscope bench monitor --fleet``: a monitor over four hosts of every kind, one of them killed.

The fleet: a netns host (``n``), two exec hosts into namespaces of a fleet
(``e1`` through ``ip netns exec``, ``e2`` through ``nsenter``,
``bench/fleet.py``) and an ssh host (``s``, a real sshd in a namespace,
``bench/sshd.py``). Each runs a 1 kHz timer probe (SCHED_FIFO 50) on CPU 1;
a 2 ms SCHED_FIFO burst (priority 60) there once a second holds them all up
together. ``loopscope monitor --for M`` under ``on_host_failure: continue``;
at ``--kill-at`` the agent of ``e2`` is SIGKILLed (what a machine lost, or an
OOM kill, does). Measured:

- per host: outliers above the threshold (1 ms: only the burst, and this
  VM's own rare stalls, come above it), kept, explained, and how many the
  burst tops (``burst_share``, target ≥ 0.95 on every host);
- the controller's RSS at minute 2 and at the end (target: end ≤ 1.1 ×
  minute 2), and the monitor's own processes' (agents, recorder) beside it;
- the directory's disk per hour for the whole fleet (``du``; target ≤ 50 MB/h);
- the killed host: marked lost (when, why), started again, and the others
  measuring every period (``others_complete``);
- Ctrl-C: a second, short monitor of the same fleet interrupted inside a
  period; the seconds from SIGINT to its exit (target ≤ 2 s) and whether
  every host's open period was closed.

Its weakest case is the kill: the lost host's lane misses the periods until
its agent is back, and the restart happens between periods, so every lane
waits for it (``RESTART_TIMEOUT_S`` at most).
"""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import time
from pathlib import Path
from typing import Callable

from typing_extensions import TypedDict

from loopscope import cbuild
from loopscope.bench.fleet import Fleet, agent_in
from loopscope.bench.monitor import HERE, _all_cpus, _du_mb, _off_the_probe, _own_rss_mb
from loopscope.bench.sshd import Sshd, served
from loopscope.errors import RunError
from loopscope.host import scratch

THRESHOLD = "1ms"
HOSTS = ("n", "e1", "e2", "s")
VICTIM = "e2"


class HostFigures(TypedDict):
    host: str
    kind: str
    periods: int
    outliers_above: int
    kept: int
    explained: int
    burst_top: int
    #: the share of its outliers the burst tops (None: none came above)
    burst_share: float | None
    #: seconds its probe measured, so bursts it saw (one a second, each making one outlier above 1 ms)
    seconds_measured: float
    #: burst-topped outliers over the bursts it measured through
    burst_recall: float | None
    #: what topped the rest (this VM's own stalls: "CPU idle" while the hypervisor did not run it)
    other_causes: dict[str, int]
    lost: bool
    back: bool


class FleetRun(TypedDict):
    """The long run's figures."""

    hosts: list[HostFigures]
    worst_burst_share: float | None
    controller_rss_mb_minute2: float | None
    controller_rss_mb_end: float | None
    rss_ratio: float | None
    own_rss_mb_end: float | None
    disk_mb_per_h: float
    status: str
    others_complete: bool


class FleetMonitorBench(FleetRun):
    minutes: float
    kill_at_minutes: float
    period: str
    threshold: str
    interrupt_exit_s: float
    interrupt_closed_every_host: bool


def _spec(fleet: Fleet, sshd: Sshd, zoo: Path, period: str) -> str:
    burst = [str(zoo), "fifo", "--cpu", "1", "--prio", "60", "--burst-us", "2000", "--period-us", "1000000"]
    return (
        "name: bench-fleet\non_host_failure: continue\nhosts:\n"
        "  - {name: n, kind: netns}\n"
        f"  - {{name: e1, kind: exec, launcher: [ip, netns, exec, {fleet.ns(1)}], address: {fleet.address(1)}}}\n"
        f"  - {{name: e2, kind: exec, launcher: [nsenter, '--net=/run/netns/{fleet.ns(2)}'], address: {fleet.address(2)}}}\n"
        + sshd.host("s")
        + "probes:\n"
        + "".join(f"  - {{kind: timer, name: t-{h}, host: {h}, interval_us: 1000, cpu: [1], priority: 50, dma_latency_us: 0}}\n" for h in HOSTS)
        + f"loads:\n  - {{name: burst, kind: command, command: {json.dumps(burst)}}}\n"
        + f"monitor: {{period: {period}, threshold: {THRESHOLD}}}\n"
    )


def _rss_mb(pid: int) -> float | None:
    try:
        return next(int(x.split()[1]) for x in Path(f"/proc/{pid}/status").read_text().splitlines() if x.startswith("VmRSS:")) / 1024
    except (OSError, StopIteration, ValueError):
        return None


def _lines(p: Path) -> list[dict[str, object]]:
    return [json.loads(x) for x in p.read_text().splitlines() if x.strip().startswith("{")] if p.exists() else []


def _per_host(out: Path, lost: set[str], back: set[str]) -> list[HostFigures]:
    kinds = {"n": "netns", "e1": "exec (ip netns exec)", "e2": "exec (nsenter)", "s": "ssh"}
    outl = _lines(out / "outliers.jsonl")
    rows = _lines(out / "periods.jsonl")
    figs: list[HostFigures] = []
    for h in HOSTS:
        mine = [o for o in outl if o.get("host") == h]
        top = sum(1 for o in mine if o.get("top_cause") == "load: burst")
        secs = sum(float(str(r.get("seconds") or 0)) for r in rows if r.get("host") == h and r.get("count"))
        others: dict[str, int] = {}
        for o in mine:
            if o.get("top_cause") != "load: burst":
                k = str(o.get("top_cause") or "not kept")
                others[k] = others.get(k, 0) + 1
        figs.append(
            {
                "host": h,
                "kind": kinds[h],
                "periods": sum(1 for r in rows if r.get("host") == h and r.get("count")),
                "outliers_above": len(mine),
                "kept": sum(1 for o in mine if o.get("window")),
                "explained": sum(1 for o in mine if o.get("top_cause")),
                "burst_top": top,
                "burst_share": top / len(mine) if mine else None,
                "seconds_measured": round(secs, 1),
                "burst_recall": top / int(secs) if int(secs) else None,
                "other_causes": others,
                "lost": h in lost,
                "back": h in back,
            }
        )
    return figs


def _monitor(spec: Path, out: Path, for_s: float | None) -> subprocess.Popen[str]:
    cmd = [sys.executable, "-m", "loopscope.cli", "monitor", str(spec), "-o", str(out), "--json", *(["--for", f"{for_s:g}s"] if for_s else [])]
    return subprocess.Popen(cmd, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)


def long_run(fleet: Fleet, work: Path, spec: Path, minutes: float, kill_at: float, say: Callable[[str], None]) -> FleetRun:
    out = work / "mon-fleet"
    say(f"  a fleet of 4 hosts, monitored for {minutes:g} min; {VICTIM}'s agent killed at minute {kill_at:g} …")
    _all_cpus()
    p = _monitor(spec, out, minutes * 60)
    _off_the_probe()
    t0 = time.monotonic()
    rss2 = rss_end = own_end = None
    killed = False
    while p.poll() is None:
        time.sleep(1.0)
        el = time.monotonic() - t0
        if rss2 is None and el >= min(120.0, minutes * 60 * 0.4):
            rss2 = _rss_mb(p.pid)
        if not killed and el >= kill_at * 60:
            victim = agent_in(fleet.ns(2))
            if victim is not None:
                os.kill(victim, signal.SIGKILL)
                killed = True
                say(f"  minute {el / 60:.1f}: killed {VICTIM}'s agent (pid {victim})")
        if el < minutes * 60 - 2:
            rss_end, own_end = _rss_mb(p.pid), _own_rss_mb(p.pid)
    stdout, stderr = p.communicate()
    if p.returncode != 0:
        raise RunError(f"bench monitor --fleet: the monitor failed: {stderr.strip()[-600:]}", component="bench")
    rec = json.loads(stdout.strip().splitlines()[-1])
    run = json.loads(next(out.glob("sessions/*/run.json")).read_text())
    lost = {x["host"] for x in run.get("lost_hosts") or []}
    back = {x["host"] for x in run.get("lost_hosts") or [] if x.get("back_utc")}
    hosts = _per_host(out, lost, back)
    shares = [h["burst_share"] for h in hosts if h["burst_share"] is not None]
    return {
        "hosts": hosts,
        "worst_burst_share": min(shares) if len(shares) == len(hosts) else None,
        "controller_rss_mb_minute2": rss2,
        "controller_rss_mb_end": rss_end,
        "rss_ratio": rss_end / rss2 if rss2 and rss_end else None,
        "own_rss_mb_end": own_end,
        "disk_mb_per_h": _du_mb(out) / (minutes / 60),
        "status": str(rec["status"]),
        "others_complete": rec["status"] == "completed" and all(h["periods"] > 0 for h in hosts if h["host"] != VICTIM) and lost <= {VICTIM},
    }


def interrupt(work: Path, spec: Path, say: Callable[[str], None]) -> tuple[float, bool]:
    """A short monitor of the fleet, SIGINT inside its third round: seconds to exit, every host's period closed."""
    out = work / "mon-interrupt"
    _all_cpus()
    p = _monitor(spec, out, None)
    _off_the_probe()
    deadline = time.monotonic() + 120
    while len(_lines(out / "periods.jsonl")) < 8 and time.monotonic() < deadline and p.poll() is None:
        time.sleep(0.1)
    time.sleep(1.5)
    t = time.monotonic()
    p.send_signal(signal.SIGINT)
    p.communicate(timeout=60)
    took = time.monotonic() - t
    rows = _lines(out / "periods.jsonl")
    closed = {str(r.get("host")) for r in rows[-len(HOSTS) :] if r.get("interrupted")} == set(HOSTS)
    say(f"  Ctrl-C: exited in {took:.2f} s; every host's open period closed: {closed}")
    return took, closed


def run(*, minutes: float | None = None, kill_at: float | None = None, quick: bool = False, progress: Callable[[str], None] | None = None) -> FleetMonitorBench:
    if os.geteuid() != 0:
        raise RunError("bench monitor --fleet needs root (namespaces, SCHED_FIFO, a trace instance)", component="bench")
    if (os.cpu_count() or 1) < 2:
        raise RunError("bench monitor --fleet needs 2 CPUs (the probes' and the rest)", component="bench")
    say = progress or (lambda s: None)
    minutes = minutes or (0.5 if quick else 10.0)
    kill_at = kill_at if kill_at is not None else minutes / 2
    period = "5s" if quick or minutes < 2 else "10s"
    with scratch.directory("bench-fleetmon") as d, Fleet(2) as fleet, served(Path(d)) as sshd:
        work = Path(d)
        zoo = work / "ls-zoo"
        r = subprocess.run([cbuild.compiler(), "-O2", "-pthread", str(HERE / "zoo_inject.c"), "-o", str(zoo)], capture_output=True, text=True)
        if r.returncode != 0:
            raise RunError(f"bench monitor --fleet: building ls-zoo failed: {r.stderr.strip()[-600:]}", component="bench")
        spec = work / "fleet.yaml"
        spec.write_text(_spec(fleet, sshd, zoo, period))
        got = long_run(fleet, work, spec, minutes, kill_at, say)
        short = work / "short.yaml"
        short.write_text(_spec(fleet, sshd, zoo, "3s"))
        took, closed = interrupt(work, short, say)
    return {
        "minutes": minutes,
        "kill_at_minutes": kill_at,
        "period": period,
        "threshold": THRESHOLD,
        **got,
        "interrupt_exit_s": took,
        "interrupt_closed_every_host": closed,
    }


def _f(x: float | None, fmt: str = "{:.2f}") -> str:
    return "-" if x is None else fmt.format(x)


def print_human(r: FleetMonitorBench) -> None:
    print(
        f"a fleet monitor: 4 hosts, {r['minutes']:g} min of {r['period']} periods, threshold {r['threshold']}; {VICTIM} killed at minute {r['kill_at_minutes']:g}"
    )
    print(f"  {'host':<4} {'kind':<22} {'periods':>7} {'above':>6} {'kept':>6} {'explained':>9} {'burst top':>9} {'share':>6} {'recall':>6}  lost/back  others")
    for h in r["hosts"]:
        print(
            f"  {h['host']:<4} {h['kind']:<22} {h['periods']:>7} {h['outliers_above']:>6} {h['kept']:>6} {h['explained']:>9} {h['burst_top']:>9}"
            f" {_f(h['burst_share']):>6} {_f(h['burst_recall']):>6}  {'lost' if h['lost'] else '-':>4}/{'back' if h['back'] else '-':<4}"
            f"  {', '.join(f'{k} {v}' for k, v in sorted(h['other_causes'].items(), key=lambda kv: -kv[1])) or '-'}"
        )
    print(
        f"  worst burst share {_f(r['worst_burst_share'])} (target ≥ 0.95; recall: bursts seen named for the burst);"
        f" the others complete: {r['others_complete']} (status {r['status']})"
    )
    print(
        f"  controller RSS {_f(r['controller_rss_mb_minute2'], '{:.0f}')} MB at minute 2, {_f(r['controller_rss_mb_end'], '{:.0f}')} MB at the end:"
        f" ratio {_f(r['rss_ratio'], '{:.3f}')} (target ≤ 1.1); the monitor's own processes {_f(r['own_rss_mb_end'], '{:.0f}')} MB"
    )
    print(f"  disk {r['disk_mb_per_h']:.1f} MB/h for the fleet (target ≤ 50)")
    print(f"  Ctrl-C: exit in {r['interrupt_exit_s']:.2f} s (target ≤ 2), every host's open period closed: {r['interrupt_closed_every_host']}")
