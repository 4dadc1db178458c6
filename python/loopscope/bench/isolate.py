"""``loopscope bench isolate``: the isolate tuning proven by A/B, with audit before and during.

A timer probe runs on CPU 1 (SCHED_OTHER, 1 kHz) beside intruders the bench
plants there, outside the lab, as a machine's own would be:

- **stray**: a CPU-bound task pinned to CPU 1 (isolation moves it);
- **kworkers**: a process on CPU 0 that writes and fsyncs a file in a loop,
  whose writeback runs in unbound kworkers and the journal's kthread
  (the workqueues' mask and the kthreads' affinity move them);
- **irq**: the virtio RNG's interrupt steered to CPU 1 and a reader of
  ``/dev/hwrng`` on CPU 0 (isolation rewrites the IRQ's affinity);
- **rcu**: a task on CPU 1 that creates and removes files, whose RCU
  callbacks run on the CPU that queued them (isolation moves the task; RCU
  callbacks themselves move only with ``rcu_nocbs=`` at boot).

The demo's CPU load runs on CPU 0 as a load of the run. One run alternates
two phases per repetition, ``shared`` and ``kept`` (``kept`` has ``tunings:
[{kind: isolate, cpus: [1]}]`` and ``compare_with: shared``), so the run's
own comparisons give the p99 and p99.9 ratios with their intervals;
``aa_spread`` is the p99 of the odd repetitions' shared phases over the even
ones'. ``loopscope audit --cpus 1`` runs before the run (each planted
intruder must be found) and inside the first kept phase (nothing but the
phase's own probe and what only a reboot moves may be left: ``boot_only``).
Every thread's allowed CPUs and every file isolate writes are read before
and after: they must be equal.
"""

from __future__ import annotations

import json
import os
import re
import shutil
import statistics
import subprocess
import sys
import time
from collections.abc import Callable
from contextlib import ExitStack
from pathlib import Path

import polars as pl
from typing_extensions import TypedDict

from loopscope.errors import RunError
from loopscope.host import isolate, tunings
from loopscope.lab import state
from loopscope.lab.audit import audit
from loopscope.host import scratch

#: the names the lab's own threads take (its controller, agents, probes and their writers)
LAB_NAMES = ("ls-", "loopscope-")
TARGET = 0.5
AA_LIMIT = 1.1
SPEC = """name: bench-isolate
probes:
  - {{kind: timer, name: timer, interval_us: 1000, cpu: [1]}}
loads:
  - {{name: demo, kind: command, command: "{load}"}}
phases:
  - {{name: shared, loads: [demo]}}
  - {{name: kept, loads: [demo], compare_with: shared, tunings: [{{kind: isolate, cpus: [1]}}]}}
duration: {seconds:g}s
repetitions: {reps}
kernel: {{capture: off}}
"""
SPIN = "import time\nt = time.time() + 3600\nwhile time.time() < t: pass"
FSYNC = "import os, sys\nf = os.open(sys.argv[1], os.O_WRONLY | os.O_CREAT)\nwhile True:\n    os.pwrite(f, b'x' * 65536, 0)\n    os.fsync(f)"
FILES = "import os, sys\nd = sys.argv[1]\nwhile True:\n    for i in range(64):\n        open(f'{d}/f{i}', 'w').close()\n    for i in range(64):\n        os.unlink(f'{d}/f{i}')"


class Ratio(TypedDict):
    ratio: float | None
    ci95: list[float | None]


class IsolateBench(TypedDict):
    """What ``loopscope bench isolate --json`` prints."""

    ratio_p99: float | None
    ci95_p99: list[float | None]
    ratio_p999: float | None
    ci95_p999: list[float | None]
    aa_spread: float | None
    #: the intruders planted on CPU 1 (the CPU 0 load aside)
    planted: list[str]
    #: of those, the ones audit found on CPU 1 before isolation
    found_before: list[str]
    #: each intruder: whether audit found it before isolation, or why it could not be planted here
    planted_found: dict[str, bool | str]
    #: how many things audit found on CPU 1 inside the isolated phase beyond the phase's own probe and boot-only items (None: not judged)
    findings_after: int | None
    #: those things (should be empty), or why they were not judged
    left_during: list[str]
    #: what only a reboot moves, as the run and audit said
    boot_only: list[str]
    #: of those, the IRQs that fired on CPU 1 inside the isolated phase (the kernel manages them), with their counts
    boot_only_fired: list[str]
    #: every thread's allowed CPUs and cpuset, and every file isolate writes, read the same after the run
    restored: bool
    state_differs: list[str]
    #: what the run said of itself (a tuning it could not give back would be here)
    notes: list[str]
    verdict: str
    seconds: float
    repetitions: int


def rng_irq() -> int | None:
    """The virtio RNG's interrupt line (a steerable IRQ whose rate a reader sets), if this machine has one."""
    devs = [p.name for p in Path("/sys/bus/virtio/drivers/virtio_rng").glob("virtio*")] if Path("/sys/bus/virtio/drivers/virtio_rng").is_dir() else []
    for line in Path("/proc/interrupts").read_text().splitlines()[1:]:
        head, _, rest = line.partition(":")
        if head.strip().isdigit() and any(re.search(rf"\b{d}-input", rest) for d in devs):  # (its request queue's, not -config)
            return int(head.strip())
    return None


#: what the bench's children start under: the kernel kills them when the bench dies (util-linux's setpriv sets PR_SET_PDEATHSIG and execs)
DIE_WITH_ME = ["setpriv", "--pdeathsig", "KILL"]


class Intruders:
    """The planted intruders, started and given back (the IRQ's affinity too) on every way out."""

    def __init__(self, work: Path, stack: ExitStack) -> None:
        self.work, self.stack = work, stack
        self.procs: dict[str, subprocess.Popen[bytes]] = {}
        self.planted: dict[str, bool | str] = {}
        self.irq: int | None = None

    def _start(self, name: str, cpu: int, argv: list[str]) -> None:
        # (each dies with the bench, whatever kills it: a kill -9 of the bench leaves no intruder running)
        p = subprocess.Popen([*DIE_WITH_ME, "taskset", "-c", str(cpu), *argv], stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL, start_new_session=True)
        self.procs[name] = p

        def stop() -> None:
            p.kill()
            p.wait()

        self.stack.callback(stop)
        self.planted[name] = False

    def start(self) -> None:
        self._start("stray", 1, [sys.executable, "-c", SPIN])
        self._start("kworkers", 0, [sys.executable, "-c", FSYNC, str(self.work / "fsync.dat")])
        (self.work / "files").mkdir(exist_ok=True)
        self._start("rcu", 1, [sys.executable, "-c", FILES, str(self.work / "files")])
        n = rng_irq()
        f = Path(f"/proc/irq/{n}/smp_affinity_list") if n is not None else None
        if f is None or not Path("/dev/hwrng").exists():
            self.planted["irq"] = "no virtio RNG here: no steerable interrupt source to plant"
            return
        # steered as a tuning is, its old affinity journalled first: a killed bench's is given back by `loopscope cleanup`
        steered = tunings.Applied(state.state_dir() / f"bench-isolate-{os.getpid()}-irq.tunings")
        try:
            steered.apply([{"kind": "irq", "irq": n, "cpus": [1]}], "bench isolate")
        except RunError as e:
            steered.restore()
            self.planted["irq"] = f"IRQ {n} refused CPU 1 ({e})"
            return
        self.stack.callback(steered.restore)
        self.irq = n
        self._start("irq", 0, ["sh", "-c", "while :; do dd if=/dev/hwrng of=/dev/null bs=64 count=64 2>/dev/null; done"])


def _audit(seconds: float) -> dict[str, object]:
    """``loopscope audit --cpus 1`` in this process, at nice -15: CPU 0 carries the
    demo load, the intruders' helpers and the lab, and a new ``loopscope audit``
    process took over 5 s there to start its watch, past the isolated phase."""
    was = os.getpriority(os.PRIO_PROCESS, 0)
    os.setpriority(os.PRIO_PROCESS, 0, -15)
    try:
        return dict(audit([1], seconds))
    finally:
        os.setpriority(os.PRIO_PROCESS, 0, was)


def found_before(a: dict[str, object], intr: Intruders) -> None:
    """Which planted intruders audit found on CPU 1."""
    ran = [x for x in a["ran"]]  # type: ignore[attr-defined]
    tids = {int(x["tid"]) for x in ran}
    for name in ("stray", "rcu"):
        if name in intr.procs:
            intr.planted[name] = intr.procs[name].pid in tids
    if "kworkers" in intr.procs:
        intr.planted["kworkers"] = any(x["what"] != "task" and str(x["comm"]).startswith(("kworker/u", "jbd2", "kworker/1:")) for x in ran)
    if intr.irq is not None:
        intr.planted["irq"] = any(int(x["irq"]) == intr.irq for x in a["irqs"])  # type: ignore[attr-defined]


def left_during(a: dict[str, object], lab: set[int]) -> list[str]:
    """What audit found on CPU 1 inside the isolated phase that isolation should
    have moved (``lab``: the lab's threads, which it leaves where the experiment put them)."""
    left = []
    for x in a["ran"]:  # type: ignore[attr-defined]
        if x["what"] == "per-CPU kthread" or int(x["tid"]) in lab or str(x["comm"]).startswith(LAB_NAMES):
            continue  # (a lab thread that came and went inside the watch is known by its name)
        left.append(f"{x['what']} {x['comm']} ({x['tid']}) {int(x['ns']) / 1e3:.0f} µs")
    for x in a["irqs"]:  # type: ignore[attr-defined]
        if not _still_on(int(x["irq"])):  # (one the kernel kept there, a managed IRQ, is boot only)
            left.append(f"IRQ {x['irq']} {x['name']} ×{x['count']}")
    return left


def boot_only_fired(a: dict[str, object]) -> list[str]:
    """The IRQs that fired on CPU 1 inside the isolated phase because the kernel keeps them there (managed)."""
    return [f"IRQ {x['irq']} {x['name']} ×{x['count']}" for x in a["irqs"] if _still_on(int(x["irq"]))]  # type: ignore[attr-defined]


def _isolating(journal: Path) -> bool:
    """Whether the isolated phase has begun: its journal lists the threads it moved."""
    try:
        return bool(json.loads(journal.read_text()).get("moved"))
    except (OSError, ValueError):
        return False


def _threads_of(pids: set[int]) -> set[int]:
    """Every thread of these processes (the lab's: taken before and after the watch, as its threads come and go)."""
    return {tid for pid, tid, _ in isolate.threads() if pid in pids}


def _still_on(n: int) -> bool:
    """Whether IRQ ``n`` still may go to CPU 1 (isolation could not move it: the kernel manages it)."""
    try:
        return 1 in isolate.cpus_without(Path(f"/proc/irq/{n}/smp_affinity_list").read_text(), set())
    except OSError:
        return True


def _ratio(c: pl.DataFrame, metric: str) -> Ratio:
    r = c.filter((pl.col("probe") == "timer") & (pl.col("measure") == "latency") & (pl.col("metric") == metric) & (pl.col("phase") == "kept"))
    if not len(r):
        return {"ratio": None, "ci95": [None, None]}
    row = r.row(0, named=True)
    return {"ratio": row["ratio"], "ci95": [row["ratio_lo"], row["ratio_hi"]]}


def aa_spread(timer: pl.DataFrame) -> float | None:
    """p99 of the shared phase in odd repetitions over the even ones' (the noise floor)."""
    sh = timer.filter(pl.col("phase") == "shared")
    per = {int(r): float(g["latency_ns"].quantile(0.99) or 0) for (r,), g in sh.group_by("rep")}
    a = [v for r, v in per.items() if r % 2 == 1]
    b = [v for r, v in per.items() if r % 2 == 0]
    return float(statistics.median(a) / statistics.median(b)) if a and b and statistics.median(b) else None


def run(quick: bool, seconds: float | None, reps: int | None, progress: Callable[[str], None] | None = None) -> IsolateBench:
    say = progress or (lambda _m: None)
    if os.geteuid() != 0 or (os.cpu_count() or 1) < 2:
        raise RunError("bench isolate needs root and two CPUs (one to isolate, one for the rest)", component="bench")
    secs = seconds or 5.0
    n = reps or (2 if quick else 6)
    load = "stress-ng --cpu 1 --taskset 0 --quiet" if shutil.which("stress-ng") else f"taskset -c 0 {sys.executable} -c 'while True: pass'"
    with scratch.directory("bench-isolate") as tmp, ExitStack() as stack:
        work = Path(tmp)
        intr = Intruders(work, stack)
        intr.start()
        time.sleep(0.5)
        say("audit of CPU 1 with the intruders planted …")
        found_before(_audit(2.0), intr)
        before = isolate.snapshot()
        run_id = f"bench-isolate-{os.getpid()}"
        (work / "iso.yaml").write_text(SPEC.format(load=load, seconds=secs, reps=n))
        say(f"run: {n} repetitions of shared and kept (isolate CPU 1), {secs:g} s each …")
        # (stopped as by Ctrl-C when the bench dies: it gives its isolation back itself)
        p = subprocess.Popen(
            [*DIE_WITH_ME[:-1], "TERM", sys.executable, "-m", "loopscope.cli", "run", "iso.yaml", "--run-dir", run_id],
            cwd=work,
            stdout=subprocess.PIPE,
            stderr=subprocess.PIPE,
            text=True,
        )
        journal = state.state_dir() / f"{run_id}.tunings"
        during: list[str] = ["(not judged: the isolated phase was not seen)"]
        judged = False
        kept_irqs: list[str] = []
        while p.poll() is None:
            if _isolating(journal):
                say("audit of CPU 1 inside the isolated phase …")
                lab = _threads_of(isolate.lab_pids(p.pid))
                # (audit takes 1-3 s to start its capture on this loaded machine: its watch must end inside the phase)
                seen = _audit(1.0)
                during = left_during(seen, lab | _threads_of(isolate.lab_pids(p.pid)))
                judged = True
                kept_irqs = boot_only_fired(seen)
                if not _isolating(journal):
                    during = [f"(not judged: audit's watch outlasted the {secs:g} s isolated phase; give a longer --seconds)"]
                    judged = False
                break
            time.sleep(0.05)
        out, err = p.communicate(timeout=600 + 4 * n * secs)
        if p.returncode != 0:
            raise RunError(f"bench isolate: the run failed: {err.strip()[-800:]}", component="run")
        after = isolate.snapshot()
        differs = [f"{k}: {before[k]} -> {after[k]}" for k in before.keys() & after.keys() if before[k] != after[k]]
        rd = work / run_id
        rec = json.loads((rd / "run.json").read_text())
        said = [c["new"] for t in rec.get("tunings") or [] for c in t["changes"] if c["tuning"] == "isolate"]
        boot = sorted({x.strip() for s in said[:1] for x in s.split("left (boot only): ", 1)[-1].split(";") if x.strip() and x.strip() != "none"})
        c = pl.read_parquet(rd / "tables" / "comparisons.parquet")
        p99, p999 = _ratio(c, "p99"), _ratio(c, "p999")
        aa = aa_spread(pl.read_parquet(rd / "tables" / "timer.parquet"))
    hi99, hi999 = p99["ci95"][1], p999["ci95"][1]
    if aa is None or not 1 / AA_LIMIT <= aa <= AA_LIMIT:
        verdict = "inconclusive"
    elif hi99 is not None and hi999 is not None and hi99 < TARGET and hi999 < TARGET and not during and not differs:
        verdict = "met"
    else:
        verdict = "not met"
    return {
        "ratio_p99": p99["ratio"],
        "ci95_p99": p99["ci95"],
        "ratio_p999": p999["ratio"],
        "ci95_p999": p999["ci95"],
        "aa_spread": aa,
        "planted": [k for k, v in intr.planted.items() if isinstance(v, bool)],
        "found_before": [k for k, v in intr.planted.items() if v is True],
        "planted_found": intr.planted,
        "findings_after": None if judged is False else len(during),
        "left_during": during,
        "boot_only": boot,
        "boot_only_fired": kept_irqs,
        "restored": not differs,
        "state_differs": differs[:20],
        "notes": list(rec.get("notes") or []),
        "verdict": verdict,
        "seconds": secs,
        "repetitions": n,
    }


def print_human(r: IsolateBench) -> None:
    def f(x: float | None) -> str:
        return "-" if x is None else f"{x:.3f}"

    print(f"isolate CPU 1, {r['repetitions']} × ({r['seconds']:g} s shared, {r['seconds']:g} s kept)")
    print(f"  p99 kept/shared {f(r['ratio_p99'])} [{f(r['ci95_p99'][0])}, {f(r['ci95_p99'][1])}]   (target < {TARGET})")
    print(f"  p99.9 kept/shared {f(r['ratio_p999'])} [{f(r['ci95_p999'][0])}, {f(r['ci95_p999'][1])}]")
    print(f"  aa_spread {f(r['aa_spread'])} (within [{1 / AA_LIMIT:.2f}, {AA_LIMIT}] to judge)")
    for k, v in r["planted_found"].items():
        print(f"  planted {k}: " + ("found by audit before" if v is True else "NOT found by audit before" if v is False else str(v)))
    print(f"  left on CPU 1 while isolated: {', '.join(r['left_during']) or 'nothing'}")
    print(f"  boot only: {'; '.join(r['boot_only'][:6]) or 'nothing'}{' …' if len(r['boot_only']) > 6 else ''}")
    print(f"  boot only, fired on CPU 1 while isolated: {', '.join(r['boot_only_fired']) or 'nothing'}")
    print(f"  machine state after: {'as before' if r['restored'] else 'DIFFERS: ' + '; '.join(r['state_differs'][:5])}")
    for n in r["notes"]:
        print(f"  note: {n}")
    print(f"  verdict: {r['verdict']}")
