"""Kernel capture across a lab: one trace instance per kernel, read between windows.

Netns and local hosts share this machine's kernel, so the first of them
records for all; ssh and exec hosts are grouped by their kernel's boot id,
and one host of each kernel records for all hosts on it. The captures start once the
agents are up (after the clock-sync probes) and stop after the last phase.
The controller calls ``drain`` after every probe step, when no probe
measures, so the reader's work falls between windows; buffers are sized for
the longest probe window. When a buffer still filled to half inside a window
the reader ran then, and ``stop`` says so in the run's notes with the time
and the step it fell in.

Files live in ``hosts/<name>/kernel/``; ``run.json`` lists them under
``kernel`` with the hosts each one covers, what it recorded, what the kernel
lacked and what the reader cost. A refusal (no tracefs, no privilege) is a
note in the run with ``capture: auto`` and an error with ``capture: on``.
"""

from __future__ import annotations

import os
from dataclasses import dataclass, field
from pathlib import Path
from typing import TYPE_CHECKING, Any

from loopscope import protocol as P
from loopscope.lab.lab import Lab
from loopscope.kernel.capture import HalfFull
from loopscope.rundir import Capture, CaptureReport, CpuLimit, KernelRecord, ReadDuring, Step
from loopscope.lab.hosts import AgentFailure
from loopscope.lab.hostkinds import HostRt
from loopscope.spec.plan import probe_seconds

if TYPE_CHECKING:
    from loopscope.spec.models import Experiment


def kernels(lab: Lab) -> list[tuple[str, list[str]]]:
    """(host that records, hosts its kernel serves): one capture per kernel,
    hosts told apart by their agents' boot ids (netns and local hosts share
    this machine's; exec hosts in namespaces or containers share theirs). The
    recorder is a host of this machine when the kernel is this machine's, so
    its files need no way home."""
    groups: dict[str, list[Any]] = {}
    apart = os.environ.get("LOOPSCOPE_APART_KERNELS") == "1"
    for h in lab.hosts.values():
        if h.lost:
            continue
        boot = h.hello.provenance.boot_id if h.hello is not None else None
        key = f"host {h.name}" if h.remote and (apart or not boot) else boot if boot else "here"
        groups.setdefault(key, []).append(h)
    out = []
    for hs in groups.values():
        rec = next((h for h in hs if not h.remote), next((h for h in hs if h.here), hs[0]))
        out.append((rec.name, [h.name for h in hs]))
    return out


def on_this_kernel(h: HostRt) -> bool:
    """Host ``h`` runs on the controller's kernel (never an ssh or exec host
    under ``LOOPSCOPE_APART_KERNELS=1``: tests only, so that one machine
    serves for the path through another kernel's agent)."""
    return not h.remote or (h.here and os.environ.get("LOOPSCOPE_APART_KERNELS") != "1")


@dataclass
class CaptureRun:
    """The captures of a run while they record: what ``run.json`` keeps of
    each (``captures``) and the hosts whose capture still runs."""

    captures: list[Capture] = field(default_factory=list)
    running: list[str] = field(default_factory=list)

    def record(self) -> KernelRecord:
        """What the run record keeps of the captures."""
        return KernelRecord(captures=self.captures)


def start(lab: Lab, exp: Experiment, notes: list[str]) -> CaptureRun:
    k = exp.kernel
    window_s = max([probe_seconds(exp, p) for p in exp.probes] or [10.0])
    info = CaptureRun()
    for host, covers in kernels(lab):
        out_dir = f"{lab.hosts[host].base}/kernel"
        meta = lab.agent(host).ask(P.StartKcapture(out_dir=out_dir, events=k.events, buffer_mb=k.buffer_mb, window_s=window_s, read=k.read), timeout=60)
        # what the capture said of itself on starting (its files and reader figures come at its stop)
        said = meta.model_dump(mode="json", include=set(CaptureReport.model_fields) - {"data", "log", "seconds", "reader_cpu_s", "reader", "reader_tids"})
        entry = Capture.model_validate({"host": host, "covers": covers, "dir": lab.rel(host, out_dir), **said})
        if meta.refused:
            msg = f"kernel capture on {host} ({', '.join(covers)}): {meta.refused}; the report cannot say why outliers happened there"
            if k.capture == "on":
                raise AgentFailure(msg, host=host, component="kernel capture")
            notes.append(msg)
        else:
            info.running.append(host)
            if meta.missing_events:
                notes.append(f"kernel capture on {host}: this kernel lacks {', '.join(meta.missing_events)}")
            if meta.unfiltered_events:
                notes.append(
                    f"kernel capture on {host}: this kernel refused the per-thread filters of {', '.join(meta.unfiltered_events)}; they are recorded for every thread"
                )
        info.captures.append(entry)
    return info


def drain(lab: Lab, info: CaptureRun | None, label: str) -> None:
    """Read every running capture's buffers now (between probe windows)."""
    for host in info.running if info is not None else []:
        r = lab.agent(host).ask(P.DrainKcapture(label=label), timeout=120)
        if r.error:
            raise AgentFailure(f"kernel capture on {host}: {r.error}", host=host, component="kernel capture")
        if r.cpu_limits:
            entry = next(e for e in info.captures if e.host == host)  # type: ignore[union-attr]
            entry.cpu_limits = merge_limits(entry.cpu_limits, r.cpu_limits)


def merge_limits(had: list[CpuLimit], now: list[CpuLimit]) -> list[CpuLimit]:
    """The groups seen so far and now: each group's latest limit and
    counters, and every thread seen in it at any look."""
    out = {(g.hierarchy, g.path): g for g in had}
    for g in now:
        old = out.get((g.hierarchy, g.path))
        out[(g.hierarchy, g.path)] = g if old is None else g.model_copy(update={"tids": sorted(set(old.tids) | set(g.tids))})
    return list(out.values())


def stop(lab: Lab, info: CaptureRun, quiet: bool = False, steps: list[Step] | None = None, notes: list[str] | None = None) -> None:
    for host in list(info.running):
        entry = next(e for e in info.captures if e.host == host)
        try:
            end = lab.agent(host).ask(P.StopKcapture(), timeout=180)
            entry.seconds, entry.reader_cpu_s, entry.reader, entry.reader_tids = end.seconds, end.reader_cpu_s, end.reader, end.reader_tids
            if end.data:
                entry.data = lab.rel(host, end.data)
                entry.log = lab.rel(host, end.log or "")
            ran = _during(end.half_full, steps or [], entry.timens_offset_ns or 0)
            entry.reader_ran_during = ran
            if ran and notes is not None:
                inside = [r for r in ran if r.get("step")]
                notes.append(
                    f"kernel capture on {host}: a buffer ({entry.buffer_mb_per_cpu} MiB per CPU) filled to half "
                    f"{len(ran)} time(s) and the reader (SCHED_IDLE) ran then"
                    + (
                        f", {len(inside)} time(s) inside a probe window: "
                        + "; ".join(f"{r['step']} at +{r['at_s']:.2f} s for {r['read_ms']:.1f} ms" for r in inside[:5])
                        if inside
                        else ""
                    )
                    + "; set kernel.buffer_mb higher, or capture fewer events, to keep it out"
                )
        except AgentFailure:
            if not quiet:
                raise
        if entry.data is None and not lab.hosts[host].remote:
            # The agent stopped the reader itself (Ctrl-C reaches it too): what it wrote is still there.
            d = Path(lab.hosts[host].base) / "kernel"
            if (d / "segments.jsonl").exists():
                entry.data = lab.rel(host, str(d))
                entry.log = lab.rel(host, str(d / "reader.log"))
        info.running.remove(host)


def _during(reads: list[HalfFull], steps: list[Step], timens_off: int) -> list[ReadDuring]:
    """Each read the reader made on its own, with the step whose window it fell in, if any."""
    out: list[ReadDuring] = []
    for r in reads:
        t = r["mono_ns"]
        hit, start = None, t
        for s in steps:
            if s.spawn_mono_ns <= t <= s.end_mono_ns:
                hit = f"rep {s.rep} · {s.phase} · {s.probe}"
                start = s.spawn_mono_ns
                break
        out.append({"kernel_ns": t - timens_off, "step": hit, "at_s": (t - start) / 1e9, "read_ms": r["read_ns"] / 1e6})
    return out
