"""The cause zoo through other recorders: ``bench explain --recorder trace-cmd|perf``.

A case's experiment runs with loopscope's own capture off while trace-cmd
or perf records the kernel, as a user records it; the file is imported
(``loopscope import``'s decoder) into the run as its capture, and explain
runs on it like on any run. What the recorder is given:

- ``trace-cmd``: a tracefs instance of its own with the event set enabled
  and the ``mono`` clock (the probes' records are on CLOCK_MONOTONIC; a
  user's ``trace-cmd record -C mono``), read out at the end with
  ``trace-cmd extract`` (``trace-cmd record`` needs
  ``/proc/sys/kernel/ftrace_enabled`` writable, which this kernel refuses);
  256 MiB of buffer a CPU, so nothing is overwritten in a case's minute;
- ``perf``: ``perf record -a -k CLOCK_MONOTONIC -e …`` of every CPU for the
  full set, ``perf sched record -k CLOCK_MONOTONIC`` for the minimal one.

The sets: ``minimal`` is what any scheduler recording has (``sched_switch``,
``sched_wakeup``, ``sched_waking``; perf's ``perf sched record`` adds its
own few), ``full`` is loopscope's capture set (docs/explain.md) with its filters
(the timers of sleeping threads only, the TLB flush only of the cross-CPU
calls, the wake-ups tasks give: unfiltered, 500 re-arming timers alone
fill trace-cmd's buffers within the minute, as they would a user's).
A case whose cause needs events the set lacks is ``invisible``: the JSON
says which instead of scoring a top cause it could not have seen.
"""

from __future__ import annotations

import os
import shutil
import signal
import subprocess
from pathlib import Path

from loopscope.errors import RunError
from loopscope.kernel.capture import EVENTS
from loopscope.kernel.capture import tracefs
from loopscope.kernel.capture import FILTERS
import json
import tempfile
from loopscope.kernel import imported as I
from loopscope.rundir import Capture, KernelRecord, RunDir
from loopscope.bench import foreign

RECORDERS = ("native", "trace-cmd", "perf")
SETS = ("minimal", "full")
MINIMAL = ["sched:sched_switch", "sched:sched_wakeup", "sched:sched_waking"]
#: trace-cmd's buffer per CPU (KiB): a case's minute of the full set at the zoo's rates, with room
BUFFER_KB = 262144

#: the events a cause needs to be seen at all, by the label's family (the rest need only the scheduler's)
NEEDS = {
    "softirq": ["softirq_entry"],
    "timer interrupt": ["local_timer_entry"],
    "IPI": ["call_function_entry", "call_function_single_entry", "csd_function_entry"],
    "irq": ["irq_handler_entry"],
    "timer slack": ["hrtimer_start"],
    "page faults": ["page_fault_user"],
}


def events_of(which: str) -> list[str]:
    """The tracepoints of a set, as ``category:name``."""
    return list(MINIMAL) if which == "minimal" else list(EVENTS)


def missing(recorder: str) -> str | None:
    """Why a recorder cannot run here (None: it can)."""

    if recorder == "trace-cmd":
        if shutil.which("trace-cmd") is None:
            return "trace-cmd is not installed (scripts/install-deps.sh test installs it)"
        if tracefs() is None:
            return "no tracefs mounted"
    if recorder == "perf" and shutil.which("perf") is None:
        return "perf is not installed (linux-perf; scripts/install-deps.sh test installs it)"
    return None


def invisible(expected: str, present: set[str]) -> str | None:
    """What the recording lacks to show the cause ``expected`` (None: it has what it needs)."""
    family = expected.split(":")[0] if expected.startswith(("softirq:", "IPI:", "irq:")) else expected
    need = NEEDS.get(family)
    if need and not present & set(need):
        return f"no {' / '.join(need)} events: {expected} cannot be seen"
    return None


def record(recorder: str, which: str, out: Path, command: list[str]) -> Path:
    """Run ``command`` while ``recorder`` records the kernel's ``which`` set into ``out``."""

    ev = events_of(which)
    if recorder == "trace-cmd":
        return foreign.trace_dat(
            out,
            command,
            [e.replace(":", "/") for e in ev],
            buffer_kb=BUFFER_KB,
            clock="mono",
            overwrite=False,
            filters={e.replace(":", "/"): f for e, f in FILTERS.items()},
        )
    if which == "minimal":
        rec = ["perf", "sched", "record", "-k", "CLOCK_MONOTONIC"]
    else:
        rec = ["perf", "record", "-a", "-k", "CLOCK_MONOTONIC", "-m", "16M"]
        for e in ev:
            rec += ["-e", e, *(["--filter", FILTERS[e]] if e in FILTERS else [])]
    # a session of its own: on a timeout perf and the run under it (its agent, loads, probes) go together
    p = subprocess.Popen([*rec, "-o", str(out), "--", *command], stdout=subprocess.DEVNULL, stderr=subprocess.PIPE, text=True, start_new_session=True)
    try:
        _, err = p.communicate(timeout=1200)
    except subprocess.TimeoutExpired:
        os.killpg(p.pid, signal.SIGKILL)
        p.communicate()
        raise RunError(f"{' '.join(rec[:3])} did not end within 1200 s; it and the run under it were killed", component="bench") from None
    if p.returncode != 0 or not out.exists():
        raise RunError(f"{' '.join(rec[:3])} failed ({p.returncode}): {err.strip()[-400:]}", component="bench")
    return out


def attach(run_dir: Path, recording: Path, host: str = "h1") -> list[str]:
    """Import ``recording`` and make it ``run_dir``'s capture of ``host``; the events it holds."""

    with tempfile.TemporaryDirectory(dir=run_dir.parent, prefix=".import-") as tmp:
        dest = Path(tmp) / "run"
        I.import_file(recording, dest, host)
        src = json.loads((dest / "run.json").read_text())["kernel"]["captures"][0]
        (run_dir / "hosts" / host).mkdir(parents=True, exist_ok=True)
        target = run_dir / "hosts" / host / "kernel"
        if target.exists():
            shutil.rmtree(target)
        shutil.move(str(dest / "hosts" / host / "kernel"), str(target))
    rd = RunDir(run_dir)
    rec = rd.record()
    cap = Capture.model_validate({**src, "covers": [host]})
    rd.write_record(rec.model_copy(update={"kernel": KernelRecord(captures=[cap])}))
    return list(cap.events or [])
