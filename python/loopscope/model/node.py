"""Node calibration: what CPU time a machine charges for the pieces programs are made of.

Carlinet et al. 2000 calibrated a node by the CPU time of each system call and of an
execution environment between calls, under computation, I/O and memory
loads. A node model here (JSON, ``FORMAT``/``VERSION``) holds, per
*condition* (``idle``, or a load kind and level such as ``memory-1``):

- ``syscalls``: each call's mean cost with its 95 % CI, from the syscall
  probe (independent batches until the CI is within the target, or a cap,
  said by ``converged``), in its minimal form (``read``: one byte) and, for
  the calls that move data, at a few sizes (``read:4096``; ``SIZES``): a
  cost-by-size curve an app's calls are priced on at the sizes they move.
  Transforms use the typical batch (``typical_ns``; ``typical`` says why
  neither the mean nor the median);
- ``environments``: the CPU cost of one operation of two execution
  environments measured in thread CPU time: ``cpython`` (a loop of integer
  arithmetic, a list and a dict, what interpreted code between calls does)
  and ``compiled`` (native xorshift, dependent load and store in a 2 MiB
  table: ``_native.env_compiled``). Their batches are taken in slices
  between the system calls' measurements, so they sample the whole time
  the condition was measured: a shared machine drifts by several per cent
  over seconds, and a loop measured in one 30 ms window once disagreed
  with programs run over minutes by 30 % (docs/models.md);

and, per loaded condition, ``changes``: every cost's ratio to idle with a
95 % CI (bootstrap of the batch means, a slice at a time where they were
taken in slices: ``boot_typical``) and whether it is significant (its
interval outside 1 ± 2 %, ``stats.MIN_EFFECT``; the
shape of Carlinet et al. 2000's tables of costs per load), plus the machine description.

A load is held by the same workers a run's loads use
(``loopscope.loads.worker``), started in their own session and always
stopped, whatever happens.
"""

from __future__ import annotations

import contextlib
import os
import signal
import subprocess
import sys
import time
from collections.abc import Iterator
from typing import Any, Callable

import numpy as np
from loopscope import lazy
from pydantic import BaseModel, ConfigDict, Field

from loopscope.rundir import Machine
from loopscope import _native
from loopscope.errors import InputError
from loopscope.units import parse_bytes
from loopscope.probes import syscall
from loopscope.probes.params import SyscallParams
from loopscope.stats import beyond
from loopscope.host.provenance import gather
from loopscope.host import scratch as scratchdir

FORMAT = "loopscope-node-model"
VERSION = 1
LOAD_KINDS = ["cpu", "memory", "io"]
# Sizes (bytes) the data-moving calls are calibrated at besides their minimal form.
SIZES: dict[str, list[int]] = {"read": [64, 4096, 65536], "write": [64, 4096, 65536], "sendto": [256, 1400, 16384], "recvfrom": [256, 1400, 16384]}
# The bytes the minimal form of each moves (the syscall probe: 1-byte pread/pwrite, 64-byte datagrams).
MINIMAL_BYTES = {"read": 1, "write": 1, "sendto": 64, "recvfrom": 64}


class _Part(BaseModel):
    # a newer minor version's fields are kept as they are
    model_config = ConfigDict(extra="allow")


class Cost(_Part):
    """One measured cost (ns per call or per operation): its batches and their summary."""

    mean_ns: float
    batch_ns: list[float]
    ci95_half_ns: float | None = None
    median_ns: float | None = None
    #: the mean without the slowest and fastest 10 % (``typical``)
    typical_ns: float | None = None
    batches: int | None = None
    converged: bool | None = None
    #: batches per slice, when they were taken in slices (``boot_typical`` resamples whole slices)
    slices: list[int] | None = None


class Change(_Part):
    """A loaded condition's cost over idle, with its 95 % CI."""

    ratio: float
    ci95: list[float]
    significant: bool


class Changes(_Part):
    syscalls: dict[str, Change] = Field(default_factory=dict)
    environments: dict[str, Change] = Field(default_factory=dict)


class LoadSpec(_Part):
    kind: str
    processes: int
    cpus: list[int] | None = None


class Condition(_Part):
    """The machine under one condition: idle, or a load."""

    load: LoadSpec | None = None
    syscalls: dict[str, Cost] = Field(default_factory=dict)
    environments: dict[str, Cost] = Field(default_factory=dict)


class Placement(_Part):
    cpus: list[int] | None = None
    load_cpus: list[int] | None = None


class NodeModel(_Part):
    """What a node model file holds (``FORMAT``, ``VERSION``)."""

    format: str = FORMAT
    version: int = VERSION
    created: str | None = None
    #: the loopscope that made it
    loopscope: dict[str, str | int] = Field(default_factory=dict)
    #: the machine's facts as gathered (free-form: what this kernel exposes)
    machine: Machine = Field(default_factory=Machine)
    conditions: dict[str, Condition]
    changes: dict[str, Changes] = Field(default_factory=dict)
    placement: Placement | None = None


def default_calls(sizes: list[int] | None = None) -> list[str]:
    """Every call the probe knows, and the data-moving ones at ``sizes``
    (each capped at what the call allows) or at ``SIZES``."""

    out = list(_native.syscall_names())
    cap = dict(_native.syscall_sized())
    for name, zs in SIZES.items():
        out += [f"{name}:{z}" for z in sorted({min(z, cap[name]) for z in (sizes or zs)})]
    return out


def parse_sizes(text: str) -> list[int]:
    """'256,4096' -> [256, 4096] (bytes; size suffixes allowed: 4KiB)."""

    out = []
    for x in (x.strip() for x in text.split(",") if x.strip()):
        try:
            z = int(parse_bytes(x))
        except (ValueError, InputError):
            raise InputError(f"--sizes: {x!r} is not a size in bytes (e.g. 4096 or 4KiB)") from None
        if z < 1:
            raise InputError(f"--sizes: {x!r}: a size is at least 1 byte")
        out.append(z)
    if not out:
        raise InputError("--sizes: give at least one size, e.g. --sizes 256,4096,65536")
    return out


def cost_curve(costs: dict[str, Cost], name: str) -> list[tuple[float, str]]:
    """The (bytes, call key) points a node model has for ``name``, by size."""
    pts = [(float(MINIMAL_BYTES[name]), name)] if name in costs and name in MINIMAL_BYTES else []
    for k in costs:
        base, _, z = k.partition(":")
        if base == name and z:
            pts.append((float(z), k))
    return sorted(pts)


def _py_op_batch(ops: int) -> float:
    """CPU ns per operation of the CPython environment (one batch)."""
    d: dict[int, int] = {}
    acc: list[int] = []
    c0 = time.thread_time_ns()
    x = 1
    for i in range(ops):
        x = (x * 1103515245 + 12345) & 0x7FFFFFFF
        d[x & 1023] = i
        if i & 15 == 0:
            acc.append(d.get(i & 1023, 0))
    return (time.thread_time_ns() - c0) / ops


def _compiled_batch() -> float:
    """CPU ns per operation of the compiled environment (one batch)."""

    return float(_native.env_compiled(200_000, 1)[0])


ENV_BATCHES: dict[str, Any] = {"cpython": lambda: _py_op_batch(20_000), "compiled": _compiled_batch}


def env_slice(acc: dict[str, list[list[float]]], batches: int = 4) -> None:
    """A slice of a few batches of each environment, appended to ``acc``."""
    for k, f in ENV_BATCHES.items():
        f()  # the first batch after other work warms the caches back
        acc.setdefault(k, []).append([float(f()) for _ in range(batches)])


def syscalls(calls: list[str] | None, max_seconds_per_call: float, workdir: str) -> dict[str, Cost]:

    p = SyscallParams(target_pct=3, max_seconds_per_call=max_seconds_per_call, **({"calls": calls} if calls else {}))
    r = syscall.run(p, workdir)
    if r.interrupted:
        raise KeyboardInterrupt  # a calibration cut short is no calibration
    return {
        c.name: Cost(
            mean_ns=c.mean_ns,
            ci95_half_ns=c.ci_half_ns,
            median_ns=float(np.median(c.batch_ns)),
            typical_ns=float(typical(c.batch_ns)),
            batches=c.batches,
            converged=c.converged,
            batch_ns=c.batch_ns.tolist(),
        )
        for c in r.calls
    }


def parse_load(text: str) -> tuple[str, int]:
    """'memory' / 'memory:2' -> (kind, processes)."""

    kind, _, lv = text.partition(":")
    if kind not in LOAD_KINDS:
        raise InputError(f"--loads: unknown load kind {kind!r}; use {', '.join(LOAD_KINDS)}, optionally with :PROCESSES (e.g. memory:2)")
    try:
        n = int(lv) if lv else 1
    except ValueError:
        raise InputError(f"--loads {text!r}: the level after ':' is a number of processes") from None
    if not 1 <= n <= 64:
        raise InputError(f"--loads {text!r}: 1..64 processes")
    return kind, n


@contextlib.contextmanager
def pinned(cpus: list[int] | None) -> Iterator[None]:
    """This thread on ``cpus`` while the block runs (None: as it is)."""
    if not cpus:
        yield
        return
    before = os.sched_getaffinity(0)
    os.sched_setaffinity(0, cpus)
    try:
        yield
    finally:
        os.sched_setaffinity(0, before)


def _start_workers(kind: str, processes: int, scratch: str, cpus: list[int] | None) -> list[subprocess.Popen[bytes]]:
    argv = [sys.executable, "-m", "loopscope.loads.worker", kind]
    if kind == "io":
        argv += ["--dir", os.path.join(scratch, "io-load")]
    if kind == "memory":
        argv += ["--count", "10000000"]
    pre = (lambda: os.sched_setaffinity(0, cpus)) if cpus else None
    # the workers die with this process (and not with whoever started it, if a lab did: loopscope.lineage)
    env = {**os.environ, "LOOPSCOPE_PDEATHSIG": str(os.getpid())}
    return [
        subprocess.Popen(argv, stdin=subprocess.DEVNULL, stdout=subprocess.DEVNULL, stderr=subprocess.PIPE, start_new_session=True, preexec_fn=pre, env=env)
        for _ in range(processes)
    ]


def _check_workers(kind: str, ps: list[subprocess.Popen[bytes]]) -> None:
    for p in ps:
        if p.poll() is not None:
            from loopscope.errors import RunError

            err = (p.stderr.read() if p.stderr else b"").decode(errors="replace").strip()[-300:]
            raise RunError(f"the {kind} load exited ({p.returncode}): {err}")


def _stop_workers(ps: list[subprocess.Popen[bytes]]) -> None:
    for p in ps:
        for sig in (signal.SIGTERM, signal.SIGCONT):  # a paused worker takes its SIGTERM once continued
            with contextlib.suppress(ProcessLookupError):
                os.killpg(p.pid, sig)
    for p in ps:
        try:
            p.wait(timeout=5)
        except subprocess.TimeoutExpired:
            with contextlib.suppress(ProcessLookupError):
                os.killpg(p.pid, signal.SIGKILL)
            p.wait()
    for p in ps:
        if p.stderr:
            p.stderr.close()


@contextlib.contextmanager
def load(kind: str, processes: int, scratch: str, cpus: list[int] | None = None) -> Iterator[None]:
    """Hold a load while the block runs (its workers on ``cpus`` when given);
    its workers are always stopped."""
    ps: list[subprocess.Popen[bytes]] = []
    try:
        ps = _start_workers(kind, processes, scratch, cpus)
        time.sleep(0.5)  # let it reach its steady state
        _check_workers(kind, ps)
        yield
    finally:
        _stop_workers(ps)


class Switch:
    """Loads started once and paused (SIGSTOP); ``to(kind)`` lets one run
    (SIGCONT) and pauses the others, at once: conditions can alternate run
    by run, so a drift of the machine falls on all of them alike."""

    def __init__(self, groups: dict[str, list[subprocess.Popen[bytes]]]) -> None:
        self.groups = groups
        self.now: str | None = None

    def to(self, kind: str | None) -> None:
        for k, ps in self.groups.items():
            if (k == kind) != (self.now == "all" or k == self.now):
                for p in ps:
                    with contextlib.suppress(ProcessLookupError):
                        os.killpg(p.pid, signal.SIGCONT if k == kind else signal.SIGSTOP)
            _check_workers(k, ps)
        self.now = kind


@contextlib.contextmanager
def switchable(loads: dict[str, tuple[str, list[int] | None]], scratch: str) -> Iterator[Switch]:
    """One worker per named load (its kind, its CPUs), paused, to be
    switched among; all are stopped (continued first) whatever happens."""
    groups: dict[str, list[subprocess.Popen[bytes]]] = {}
    try:
        for name, (kind, cpus) in loads.items():
            groups[name] = _start_workers(kind, 1, scratch, cpus)
        time.sleep(0.5)
        sw = Switch(groups)
        sw.now = "all"  # every worker is running: pause them all
        sw.to(None)
        yield sw
    finally:
        for ps in groups.values():
            _stop_workers(ps)


TRIM = 0.1


def typical(x: Any, axis: int | None = None) -> Any:
    """The cost a set of batches stands for: their mean with the slowest
    and fastest 10 % left out. Not the plain mean: a batch the load
    preempted or an interrupt landed in is slower for reasons that are not
    the call's CPU cost (which is what an app's CPU time is made of). Not
    the median either: this VM's speed switches between states (once 1.6×
    apart), a calibration's batches are then a mixture of two modes, and a
    median flips between them with a small change of proportions (idle
    against idle again, interleaved: 1.21×), where programs' CPU times
    average over the mixture."""
    return lazy.stats().trim_mean(np.asarray(x, dtype=float), TRIM, axis=axis if axis is not None else 0)


MIN_SLICES = 8


def boot_typical(entry: Cost, k: int, rng: np.random.Generator) -> np.ndarray:
    """``k`` bootstrap draws of an entry's typical cost. Batches taken in
    one slice share the machine's state of that moment, so they are not
    independent: with ``MIN_SLICES`` slices or more (``slices``: batches per
    slice) whole slices are resampled, otherwise batches."""
    x = np.asarray(entry.batch_ns, dtype=float)
    sl = entry.slices or []
    if len(sl) >= MIN_SLICES:
        ends = np.cumsum(sl)
        groups = np.split(x, ends[:-1])
        pick = rng.integers(0, len(groups), (k, len(groups)))
        return np.asarray([typical(np.concatenate([groups[j] for j in row])) for row in pick])
    return np.asarray(typical(x[rng.integers(0, len(x), (k, len(x)))], axis=1))


def ratio_ci(base: Cost, other: Cost, resamples: int = 1000, seed: int = 1) -> tuple[float, float, float]:
    """typical(other)/typical(base) of two cost entries, with a 95 %
    bootstrap CI (``boot_typical``)."""
    rng = np.random.default_rng(seed)
    r = boot_typical(other, resamples, rng) / boot_typical(base, resamples, rng)
    return float(typical(other.batch_ns) / typical(base.batch_ns)), float(np.percentile(r, 2.5)), float(np.percentile(r, 97.5))


def _change(base: Cost, other: Cost) -> Change:
    r, lo, hi = ratio_ci(base, other)

    return Change(ratio=r, ci95=[lo, hi], significant=beyond(r, lo, hi))


def summ_slices(slices: list[list[float]], target: float | None = None) -> Cost:
    """Batches taken in slices as one entry (``slices`` keeps their sizes);
    ``converged`` when a ``target`` is given and the CI is within it."""
    flat = [x for s in slices for x in s]
    a = np.asarray(flat, dtype=float)
    mean = float(a.mean())
    half = float(1.96 * a.std(ddof=1) / np.sqrt(len(a))) if len(a) > 1 else float("inf")
    return Cost(
        mean_ns=mean,
        ci95_half_ns=half,
        median_ns=float(np.median(a)),
        typical_ns=float(typical(a)),
        batches=len(a),
        converged=bool(target is not None and half <= target * mean),
        batch_ns=flat,
        slices=[len(s) for s in slices],
    )


def measure(calls: list[str] | None, max_seconds_per_call: float, env_seconds: float, scratch: str) -> Condition:
    """One condition's costs, as the machine is now: each call in turn, a
    slice of environment batches after each (``env_seconds`` in all, at
    least 10 batches each), so both sample the same stretch of time."""
    names = calls or default_calls()
    # a slice's batches: cpython ~5 ms, compiled ~1 ms each, so ~6 ms per pair
    per_slice = max(2, round(env_seconds / 0.006 / max(1, len(names))))
    env: dict[str, list[list[float]]] = {}
    sc: dict[str, Cost] = {}
    for c in names:
        sc.update(syscalls([c], max_seconds_per_call, scratch))
        env_slice(env, per_slice)
    while min(sum(map(len, v)) for v in env.values()) < 10:
        env_slice(env, per_slice)
    return Condition(syscalls=sc, environments={k: summ_slices(v, target=0.01) for k, v in env.items()})


def assemble(conditions: dict[str, Condition]) -> NodeModel:
    """The node model: the conditions, each loaded one's changes from idle, the machine."""
    from loopscope.probes.common import envelope

    changes: dict[str, Changes] = {}
    idle = conditions["idle"]
    for name, c in conditions.items():
        if name == "idle":
            continue
        changes[name] = Changes(
            syscalls={k: _change(idle.syscalls[k], v) for k, v in c.syscalls.items() if k in idle.syscalls},
            environments={k: _change(idle.environments[k], v) for k, v in c.environments.items()},
        )
    prov = gather()
    return NodeModel(
        format=FORMAT,
        version=VERSION,
        created=time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime()),
        loopscope=envelope("node-model"),
        machine=Machine.model_validate(
            prov.model_dump(include={"host", "kernel", "cpu", "memory_kib", "clocksource", "cpufreq", "cpuidle_driver", "preempt", "software"})
        ),
        conditions=conditions,
        changes=changes,
    )


def calibrate(
    loads: list[str],
    calls: list[str] | None = None,
    max_seconds_per_call: float = 2.0,
    env_seconds: float = 2.0,
    say: Callable[[str], None] = lambda s: None,
    cpus: list[int] | None = None,
    load_cpus: list[int] | None = None,
) -> NodeModel:
    """Idle, then each load; ``cpus``: where the measuring thread runs (pin
    the apps there too, ``calibrate app --cpu``), ``load_cpus``: where the
    load workers run."""
    conditions: dict[str, Condition] = {}
    with scratchdir.directory("calibrate") as scratch:
        plan: list[tuple[str, str | None, int]] = [("idle", None, 0)] + [(f"{k}-{n}", k, n) for k, n in (parse_load(x) for x in loads)]
        for name, kind, n in plan:
            say(f"calibrating: {name}")
            with load(kind, n, scratch, load_cpus) if kind else contextlib.nullcontext(), pinned(cpus):
                c = measure(calls, max_seconds_per_call, env_seconds, scratch)
                c.load = LoadSpec(kind=kind, processes=n) if kind else None
                conditions[name] = c
    m = assemble(conditions)
    m.placement = Placement(cpus=cpus, load_cpus=load_cpus)
    return m


def read(path: str) -> NodeModel:
    """A node model, its format and version checked, each part against its model."""
    from loopscope.model import read_model

    return read_model(path, NodeModel, "node model", FORMAT, VERSION, "loopscope calibrate node")


def condition(model: NodeModel, name: str | None, path: str) -> Condition:

    name = name or "idle"
    if name not in model.conditions:
        raise InputError(f"{path}: no condition {name!r}; it has {', '.join(model.conditions)}")
    return model.conditions[name]
