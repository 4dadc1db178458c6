"""``loopscope bench fleet``: bringing a fleet's agents up and down through launchers.

A fleet of ``hosts`` namespaces on one switch (``bench/fleet.py``) is what
the runs reach, through each launcher asked for:

- ``netns``: exec hosts through ``ip netns exec``;
- ``nsenter``: exec hosts through ``nsenter --net`` (no sysfs of its own:
  the agents see cgroups);
- ``slurm``: exec hosts through ``srun --nodelist=n<i>`` to a real Slurm
  cluster, one ``slurmd`` per namespace (``bench/slurm.py``), when Slurm is
  installed;
- ``lab``: the same number of hosts as loopscope's own ``netns`` kind (the
  run builds its namespaces itself): the peer the exec kind is held to.

Each repetition, every launcher in turn (alternating, so the machine's
drift falls on all alike), runs one experiment: a 200 ms timer on ``h1``,
the kernel capture on (one capture for the fleet's one kernel). From
run.json: ``lab_up`` (agents spawned to every hello answered) and
``lab_down`` (every agent stopped, every host's files home through its
agent, namespaces and cgroups gone); after each run, what is left (the
run's processes, its directory on the hosts, a Slurm job) is counted and
must be 0.

The floor of each launcher: ``hosts`` bare agents through it, all spawned
at once, each asked ``hello`` and ``shutdown`` (no run, no provenance kept,
no files): up is spawn to the last hello, down is the shutdowns to the last
exit. The ratio says what the lab adds over starting the agents at all.

The weak case (on unless ``--no-weak``): every host runs its own timer (10,000
wake-ups in 1 s), so every host has a trace to bring home through its
agent's channel (base64 in JSON lines, where loopscope's own netns hosts
write straight into the run directory), and the run's end waits for the
slowest host.

Last, a host killed mid-run: every host measures (0.5 s each, two
repetitions) under ``on_host_failure: continue`` and the middle host's
agent is SIGKILLed as its first step is due; the run must exit 0 naming the host in its summary,
mark the host's steps, complete every other host's, and leave nothing.

Targets (issue): 16 hosts through ``exec``: up ≤ 5 s, down ≤ 3 s, nothing left.
"""

from __future__ import annotations

import json
import os
import shutil
import statistics
import subprocess
import sys
import tempfile
import time
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path
from typing import Any, Callable

from typing_extensions import TypedDict

from loopscope.bench.fleet import NS_LAUNCHERS, Fleet
from loopscope.errors import RunError
from loopscope.host import procs
from loopscope.lab import netns
from loopscope.lab.launch import argv as launch_argv, launcher_env
from loopscope.bench import slurm

Say = Callable[[str], None] | None
LAUNCHERS = ("netns", "nsenter", "slurm", "lab")


class Spread(TypedDict):
    median: float
    range: list[float]


class Case(TypedDict):
    launcher: str
    hosts: int
    up_s: Spread
    down_s: Spread
    floor_up_s: Spread | None
    floor_down_s: Spread | None
    up_ratio: float | None
    down_ratio: float | None
    files_mb: float
    left: int
    runs: int


class Killed(TypedDict):
    """A host killed mid-run under ``on_host_failure: continue``."""

    hosts: int
    victim: str
    exit_code: int
    named_in_summary: bool
    lost: list[str]
    lost_steps: list[str]
    others_complete: int
    others_expected: int
    left: int
    run_s: float


class FleetBench(TypedDict):
    hosts: int
    repeat: int
    cases: list[Case]
    weak: list[Case]
    killed: Killed | None
    skipped: dict[str, str]
    target_up_s: float
    target_down_s: float


def _spread(xs: list[float]) -> Spread:
    return {"median": round(statistics.median(xs), 3), "range": [round(min(xs), 3), round(max(xs), 3)]}


def _launcher(kind: str, f: Fleet, cluster: Any, i: int) -> list[str]:
    if kind in NS_LAUNCHERS:
        return NS_LAUNCHERS[kind](f.ns(i))
    return list(cluster.launcher(i))


def _spec(kind: str, f: Fleet, cluster: Any, weak: bool) -> str:
    out = ["name: fleet", "hosts:"]
    for i in range(1, f.n + 1):
        if kind == "lab":
            out.append(f"  - {{name: h{i}, kind: netns}}")
        else:
            out.append(f"  - {{name: h{i}, kind: exec, launcher: {json.dumps(_launcher(kind, f, cluster, i))}, address: {f.address(i)}}}")
    out.append("probes:")
    if weak:  # every host measures, 10,000 wake-ups in 1 s: every host has a trace to bring home
        out += [f"  - {{kind: timer, name: t{i}, host: h{i}, interval_us: 100, duration: 1s}}" for i in range(1, f.n + 1)]
    else:
        out.append("  - {kind: timer, name: t1, host: h1, interval_us: 1000, duration: 200ms}")
    out += ["duration: 200ms", "baseline: true"]
    return "\n".join(out) + "\n"


def _left(run_id: str, cluster: Any) -> int:

    n = len(procs.pids_of_run(run_id))
    n += int((Path("/tmp/loopscope-runs") / run_id).exists())
    tag = netns.tag_of(run_id)
    n += sum(1 for x in netns.existing() if x.startswith(f"ls-{tag}-"))
    if cluster is not None:
        r = subprocess.run(["squeue", "-h"], capture_output=True, text=True, env=cluster.env, timeout=20)
        n += len([l for l in r.stdout.splitlines() if l.strip()])
    return n


def _one_run(kind: str, f: Fleet, cluster: Any, weak: bool, work: Path, k: int) -> tuple[float, float, float, int]:
    spec = work / f"{kind}-{k}.yaml"
    spec.write_text(_spec(kind, f, cluster, weak))
    run_id = f"fleet-{kind}-{'w' if weak else 'm'}{k}"
    rd = work / run_id
    r = subprocess.run(
        [sys.executable, "-m", "loopscope.cli", "run", str(spec), "--run-dir", str(rd), "--no-report"], capture_output=True, text=True, timeout=900
    )
    if r.returncode != 0:
        raise RunError(f"bench fleet: the {kind} run failed ({r.returncode}): {r.stderr.strip()[-800:]}")
    t = json.loads((rd / "run.json").read_text())["timings"]
    time.sleep(0.3)  # the agents' last exits
    left = _left(run_id, cluster)
    mb = sum(p.stat().st_size for p in (rd / "hosts").rglob("*") if p.is_file()) / 1e6 if (rd / "hosts").exists() else 0.0
    shutil.rmtree(rd, ignore_errors=True)
    return t["lab_up_ns"] / 1e9, t["lab_down_ns"] / 1e9, mb, left


def _floor(kind: str, f: Fleet, cluster: Any) -> tuple[float, float]:
    """``f.n`` bare agents through the launcher: spawn to the last hello, shutdown to the last exit."""
    env = launcher_env("fleet-floor")
    ps = []
    t0 = time.monotonic()
    for i in range(1, f.n + 1):
        line = f"exec {sys.executable} -m loopscope.agent"
        ps.append(
            subprocess.Popen(
                launch_argv(_launcher(kind, f, cluster, i), line),
                stdin=subprocess.PIPE,
                stdout=subprocess.PIPE,
                stderr=subprocess.DEVNULL,
                env=env,
                start_new_session=True,
            )
        )
    hello = json.dumps({"id": 1, "op": "hello", "run_id": "fleet-floor", "run_dir": tempfile.gettempdir() + "/fleet-floor", "cgroups": False}) + "\n"
    for p in ps:
        assert p.stdin is not None
        p.stdin.write(hello.encode())
        p.stdin.flush()

    def read(p: subprocess.Popen[bytes]) -> None:
        assert p.stdout is not None
        p.stdout.readline()

    with ThreadPoolExecutor(max_workers=len(ps)) as pool:
        list(pool.map(read, ps))
    up = time.monotonic() - t0
    t1 = time.monotonic()
    for p in ps:
        assert p.stdin is not None
        p.stdin.write(b'{"id": 2, "op": "shutdown"}\n')
        p.stdin.close()
    for p in ps:
        p.wait(timeout=60)
    shutil.rmtree(tempfile.gettempdir() + "/fleet-floor", ignore_errors=True)
    return up, time.monotonic() - t1


def _agent_in(ns: str) -> int | None:
    ino = os.stat(f"/run/netns/{ns}").st_ino
    for d in Path("/proc").iterdir():
        try:
            if d.name.isdigit() and b"loopscope.agent" in (d / "cmdline").read_bytes() and os.stat(d / "ns" / "net").st_ino == ino:
                return int(d.name)
        except OSError:
            pass
    return None


def killed_case(f: Fleet, work: Path) -> Killed:
    """Every host measures, twice; the middle host's agent is killed as its first step is due."""
    victim = f.n // 2 + 1
    lines = ["name: killed", "on_host_failure: continue", "hosts:"]
    lines += [f"  - {{name: h{i}, kind: exec, launcher: {json.dumps(_launcher('nsenter', f, None, i))}, address: {f.address(i)}}}" for i in range(1, f.n + 1)]
    lines += [
        "probes:",
        *(f"  - {{kind: timer, name: t{i}, host: h{i}, interval_us: 1000}}" for i in range(1, f.n + 1)),
        "duration: 500ms",
        "baseline: true",
        "repetitions: 2",
    ]
    spec = work / "killed.yaml"
    spec.write_text("\n".join(lines) + "\n")
    rd = work / "fleet-killed"
    t0 = time.monotonic()
    with subprocess.Popen(
        [sys.executable, "-m", "loopscope.cli", "run", str(spec), "--run-dir", str(rd)], stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True
    ) as p:
        end = time.monotonic() + 120
        while time.monotonic() < end:
            try:
                if len(json.loads((rd / "run.json").read_text()).get("steps") or []) >= victim - 1:  # its own step next
                    break
            except (OSError, ValueError):
                pass
            time.sleep(0.05)
        pid = _agent_in(f.ns(victim))
        if pid is None:
            p.kill()
            raise RunError(f"bench fleet: no agent of h{victim} to kill")
        os.kill(pid, 9)
        out, err = p.communicate(timeout=600)
    run_s = time.monotonic() - t0
    run = json.loads((rd / "run.json").read_text())
    done = {(s["rep"], s["probe"]) for s in run["steps"]}
    others = [f"t{i}" for i in range(1, f.n + 1) if i != victim]
    time.sleep(0.3)
    res: Killed = {
        "hosts": f.n,
        "victim": f"h{victim}",
        "exit_code": p.returncode,
        "named_in_summary": f"LOST HOST h{victim}" in out,
        "lost": [lh["host"] for lh in run.get("lost_hosts") or []],
        "lost_steps": [s for lh in run.get("lost_hosts") or [] for s in lh["steps"]],
        "others_complete": sum(1 for r in (1, 2) for t in others if (r, t) in done),
        "others_expected": 2 * len(others),
        "left": _left("fleet-killed", None),
        "run_s": round(run_s, 2),
    }
    shutil.rmtree(rd, ignore_errors=True)
    return res


def bench(hosts: int = 16, repeat: int = 5, launchers: tuple[str, ...] = LAUNCHERS, weak: bool = True, kill: bool = True, say: Say = None) -> FleetBench:
    skipped: dict[str, str] = {}
    if "slurm" in launchers and (why := slurm.available()) is not None:
        skipped["slurm"] = why
        launchers = tuple(x for x in launchers if x != "slurm")
    if os.geteuid() != 0:
        raise RunError("bench fleet: the fleet's namespaces need root")
    work = Path(tempfile.mkdtemp(prefix="lsfleet-"))
    raw: dict[tuple[str, bool], dict[str, list[float]]] = {}
    try:
        with Fleet(hosts, attach="slurm" in launchers) as f:
            cluster = slurm.Cluster(f).up() if "slurm" in launchers else None
            try:
                for k in range(repeat):
                    for kind in launchers:
                        for w in (False, True) if weak else (False,):
                            up, down, mb, left = _one_run(kind, f, cluster if kind == "slurm" else None, w, work, k)
                            d = raw.setdefault((kind, w), {"up": [], "down": [], "mb": [], "left": [], "fup": [], "fdown": []})
                            d["up"].append(up)
                            d["down"].append(down)
                            d["mb"].append(mb)
                            d["left"].append(left)
                            if say:
                                say(
                                    f"  rep {k + 1} {kind}{' (every host measures)' if w else ''}: up {up:.2f} s, down {down:.2f} s, {mb:.1f} MB home, {left} left"
                                )
                        if kind != "lab":
                            fu, fd = _floor(kind, f, cluster)
                            raw[(kind, False)]["fup"].append(fu)
                            raw[(kind, False)]["fdown"].append(fd)
            finally:
                if cluster is not None:
                    cluster.down()
            killed = killed_case(f, work) if kill else None
            if say and killed:
                say(
                    f"  killed: h{hosts // 2 + 1} lost, exit {killed['exit_code']}, {killed['others_complete']}/{killed['others_expected']} other hosts complete, {killed['left']} left"
                )
    finally:
        shutil.rmtree(work, ignore_errors=True)

    def case(kind: str, w: bool) -> Case:
        d = raw[(kind, w)]
        fl = raw[(kind, False)]
        up, down = _spread(d["up"]), _spread(d["down"])
        fup = _spread(fl["fup"]) if fl["fup"] else None
        fdown = _spread(fl["fdown"]) if fl["fdown"] else None
        return {
            "launcher": kind,
            "hosts": hosts,
            "up_s": up,
            "down_s": down,
            "floor_up_s": fup,
            "floor_down_s": fdown,
            "up_ratio": round(up["median"] / fup["median"], 2) if fup else None,
            "down_ratio": round(down["median"] / fdown["median"], 2) if fdown else None,
            "files_mb": round(statistics.median(d["mb"]), 2),
            "left": int(sum(d["left"])),
            "runs": len(d["up"]),
        }

    return {
        "hosts": hosts,
        "repeat": repeat,
        "cases": [case(k, False) for k in launchers],
        "weak": [case(k, True) for k in launchers] if weak else [],
        "killed": killed,
        "skipped": skipped,
        "target_up_s": 5.0,
        "target_down_s": 3.0,
    }


def print_human(r: FleetBench) -> None:
    print(
        f"{r['hosts']} hosts, {r['repeat']} repetitions (medians [range]; floor: bare agents through the same launcher; targets: up ≤ {r['target_up_s']:g} s, down ≤ {r['target_down_s']:g} s)"
    )
    for title, cases in (("one host measures", r["cases"]), ("weak case, every host measures and has files to bring home", r["weak"])):
        if not cases:
            continue
        print(f"  {title}:")
        for c in cases:
            fl = (
                f", floor up {c['floor_up_s']['median']} s down {c['floor_down_s']['median']} s (x{c['up_ratio']}, x{c['down_ratio']})"
                if c["floor_up_s"] and c["floor_down_s"]
                else ""
            )
            print(
                f"    {c['launcher']:8s} up {c['up_s']['median']} s {c['up_s']['range']}, down {c['down_s']['median']} s {c['down_s']['range']}{fl}; "
                f"{c['files_mb']} MB home; {c['left']} left over {c['runs']} runs"
            )
    k = r["killed"]
    if k is None:
        return
    print(
        f"  a host killed mid-run (on_host_failure: continue): {k['victim']} of {k['hosts']} lost, exit code {k['exit_code']}, named in the summary: "
        f"{'yes' if k['named_in_summary'] else 'NO'}; its steps marked: {', '.join(k['lost_steps']) or 'none'}; other hosts complete "
        f"{k['others_complete']}/{k['others_expected']}; {k['left']} left; {k['run_s']} s"
    )
    for name, why in r["skipped"].items():
        print(f"  {name}: skipped: {why}")
