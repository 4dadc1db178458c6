"""Run a probe from a ``Launch``: what an agent's probe process does.

The agent starts ``python -m loopscope.probes.launch LAUNCH_JSON`` (the same
as ``loopscope probe launch LAUNCH_JSON``, without the command line's
imports); this module finds
the kind's parameter model and runner, validates the parameters with the
model (the one the experiment file was checked with, so nothing is parsed
back from text), and runs it. A runner takes the typed parameters and the
launch and returns the probe's result: an object with ``to_json()``, or
the JSON object itself. Modules are imported only when their kind runs.
"""

from __future__ import annotations

import importlib
from collections.abc import Mapping

from pydantic import ValidationError

from loopscope.errors import InputError
from loopscope.probes.params import (
    EchoParams,
    Launch,
    Params,
    PipeNodeParams,
    PipeSinkParams,
    PipeSourceParams,
    ProgramParams,
    RrParams,
    SchedParams,
    SyncParams,
    SyncServeParams,
    SyscallParams,
    ThreadsParams,
    TimerParams,
)

#: kind → (its parameter model, the module and function that run it from a Launch)
LAUNCHED: dict[str, tuple[type[Params], str, str]] = {
    "timer": (TimerParams, "loopscope.probes.timer", "launched"),
    "sched": (SchedParams, "loopscope.probes.sched", "launched"),
    "syscall": (SyscallParams, "loopscope.probes.syscall", "launched"),
    "rr": (RrParams, "loopscope.probes.net", "rr_launched"),
    "program": (ProgramParams, "loopscope.probes.program", "launched"),
    "threads": (ThreadsParams, "loopscope.probes.threads", "launched"),
    # the lab's helpers
    "rr-echo": (EchoParams, "loopscope.probes.net", "echo_launched"),
    "pipe-source": (PipeSourceParams, "loopscope.probes.pipeline", "source_launched"),
    "pipe-node": (PipeNodeParams, "loopscope.probes.pipeline", "node_launched"),
    "pipe-sink": (PipeSinkParams, "loopscope.probes.pipeline", "sink_launched"),
    "sync-serve": (SyncServeParams, "loopscope.probes.clocksync", "serve_launched"),
    "sync": (SyncParams, "loopscope.probes.clocksync", "probe_launched"),
}


def run(launch: Launch) -> tuple[Mapping[str, object], bool]:
    """Validate the parameters with the kind's model and run the probe: its
    JSON object (each probe's own TypedDict: ``TimerJson``, ``RrJson``, …;
    here only printed), and whether Ctrl-C cut it short."""
    if launch.kind not in LAUNCHED:
        raise InputError(f"launch: unknown probe kind {launch.kind!r}; known: {', '.join(sorted(LAUNCHED))}")
    model, module, function = LAUNCHED[launch.kind]
    try:
        p = model.model_validate(launch.params)
    except ValidationError as e:
        err = e.errors()[0]
        raise InputError(f"launch: {launch.kind}.{'.'.join(str(x) for x in err['loc'])}: {err['msg']}") from None
    res = getattr(importlib.import_module(module), function)(p, launch)
    out: Mapping[str, object] = res.to_json() if hasattr(res, "to_json") else res
    return out, bool(out.get("interrupted"))


def main(argv: list[str] | None = None) -> int:
    """``python -m loopscope.probes.launch LAUNCH_JSON``: what an agent starts.

    The same as ``loopscope probe launch`` without the command-line package
    (its imports are a fifth of a second a step, spent inside the lab's
    own processes before every window): the process set-up the command line
    makes (dying with the agent, SIGTERM as Ctrl-C) and its exit codes."""
    import json
    import os
    import signal
    import sys

    from loopscope.errors import EXIT_FAILED, EXIT_INPUT, EXIT_INTERRUPTED, LoopscopeError

    if os.environ.get("LOOPSCOPE_PDEATHSIG"):
        from loopscope.lineage import die_with_parent

        if not die_with_parent():
            return EXIT_FAILED

    def terminate(signum: int, frame: object) -> None:
        raise KeyboardInterrupt

    signal.signal(signal.SIGTERM, terminate)
    signal.signal(signal.SIGINT, signal.default_int_handler)
    args = sys.argv[1:] if argv is None else argv
    try:
        if len(args) != 1:
            raise InputError("launch: one argument, the Launch as JSON")
        try:
            lc = Launch.model_validate_json(args[0])
        except ValidationError as e:
            raise InputError(f"launch: {e.errors()[0]['msg']} at {'.'.join(str(x) for x in e.errors()[0]['loc'])}") from None
        out, interrupted = run(lc)
        print(json.dumps(out), flush=True)
        return EXIT_INTERRUPTED if interrupted else 0
    except KeyboardInterrupt:
        sys.stderr.write("loopscope: interrupted\n")
        return EXIT_INTERRUPTED
    except LoopscopeError as e:
        sys.stderr.write(f"loopscope: error: {e}\n")
        return e.exit_code if e.exit_code else EXIT_INPUT
    except OSError as e:
        sys.stderr.write(f"loopscope: error: {f'{e.filename}: {e.strerror}' if e.filename else e}\n")
        return EXIT_FAILED


if __name__ == "__main__":
    raise SystemExit(main())
