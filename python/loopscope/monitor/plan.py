"""What a monitor asks of the machine before it starts: whether it can
watch the spec's hosts and probes (``check``), and what it will write and
hold (``footprint``, ``loopscope check``'s lines for a monitor).
"""

from __future__ import annotations

import os

from loopscope.errors import InputError
from loopscope.kernel.capture import WATCH_BUFFER_MB
from loopscope.kinds import KINDS
from loopscope.monitor.keeper import DRAIN_KERNEL_NS, buffer_mb
from loopscope.spec import Experiment


# What a monitor writes, measured (docs/benchmarks.md "Monitoring"): a
# period's histogram in the interval log, its periods.jsonl line, an
# outlier's outliers.jsonl line, a kept window on disk once packed (blocks
# included: 2 kB at the demo's noise, 12 kB beside a context-switch storm).
HLOG_BYTES_PER_PERIOD = 1600
PERIOD_LINE_BYTES = 420
OUTLIER_LINE_BYTES = 450
WINDOW_BYTES = (2_000, 13_000)


def footprint(exp: Experiment) -> list[str]:
    """``loopscope check``'s lines for a monitor: per hour, and at most."""

    s = exp.monitor
    assert s is not None
    per_h = 3600e9 / s.period
    n = len(exp.probes)
    fixed = n * per_h * (HLOG_BYTES_PER_PERIOD + PERIOD_LINE_BYTES) / 1e6
    out_max = s.keep_per_minute * 60
    win = (out_max * WINDOW_BYTES[0] / 1e6, out_max * WINDOW_BYTES[1] / 1e6)
    ncpu = os.cpu_count() or 1
    drain = s.recorder == "drain"
    mb = buffer_mb(DRAIN_KERNEL_NS if drain else s.reach)
    sets = 2 if s.recorder == "alternate" else 1 if s.recorder in ("pause", "drain") else 0
    return [
        f"a monitor: {n} probes, periods of {s.period / 1e9:g} s under {', '.join(exp.phases[0].loads) if exp.phases and exp.phases[0].loads else 'no load'}; threshold {s.threshold}",
        f"  disk per hour: histograms and periods {fixed:.2f} MB; outliers {OUTLIER_LINE_BYTES / 1e3:.2f} kB each; kept windows {WINDOW_BYTES[0] // 1000}-{WINDOW_BYTES[1] // 1000} kB each,"
        f" at most {win[0]:.0f}-{win[1]:.0f} MB an hour ({s.keep_per_minute} a minute), never more than monitor.retain ({s.retain / 1e9:g} GB) in all",
        f"  memory: kernel ring buffers {sets * mb * ncpu} MiB ({sets} × {mb} MiB per CPU × {ncpu} CPUs, sized for {(DRAIN_KERNEL_NS if drain else s.reach) / 1e9:g} s at 50 k events/s per CPU)"
        + (f"; the recorder's memory holds {s.reach / 1e9:g} s of events, up to {buffer_mb(s.reach) * ncpu} MiB at that rate" if drain else "")
        + "; the monitor's processes ~300 MB",
        *(
            [
                f"  a threads probe's period: a capture of the program's threads only, {WATCH_BUFFER_MB} MiB per CPU of kernel buffers and ~0.05 MB a second"
                f" on disk (1 kHz), removed with the period"
            ]
            if any(KINDS[p.kind].live_capture for p in exp.probes)
            else []
        ),
    ]


def check(exp: Experiment, file: str) -> None:
    """What a monitor can watch: this machine's kernel (local and namespace
    hosts), probes whose windows come from their own traces."""
    for h in exp.hosts:
        if h.remote:
            raise InputError(
                f"{file}: host {h.name} is a {h.kind} host; a monitor's flight recorder reads this machine's kernel, so its hosts are local or netns"
            )
    for p in exp.probes:
        if KINDS[p.kind].windows_need_capture and not KINDS[p.kind].live_capture:
            raise InputError(
                f"{file}: probe {p.name} is a {p.kind} probe, whose windows come from a whole kernel capture; a monitor keeps only the windows around outliers"
            )
