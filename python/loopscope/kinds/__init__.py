"""Probe kinds: one module per kind, one registration line each.

A kind module holds everything about its kind (``kinds/base.py`` says
what): its experiment-file model, the command line an agent starts, how the
controller runs a step, its tables, its measures and its report section.
The agent, the controller, the spec and the report look kinds up here.
Adding a kind (docs/kinds.md): write ``kinds/<name>.py`` (and its native
loop, if any, under ``crates/probes``), then add one line below.
"""

from __future__ import annotations

from loopscope.kinds import app, pipeline, program, rr, sched, sync, syscall, threads, timer
from loopscope.analysis.registry import Registry
from loopscope.kinds.base import Kinds, ProbeKind, Series, StepContext, StepRows

KINDS = Kinds()
KINDS.add(timer.KIND)
KINDS.add(sched.KIND)
KINDS.add(syscall.KIND)
KINDS.add(pipeline.KIND)
KINDS.add(program.KIND)
KINDS.add(app.KIND)
KINDS.add(rr.KIND)
KINDS.add(sync.KIND)
KINDS.add(threads.KIND)

#: the registry as analysis and the report read it: the type checker holds KINDS to that contract here
REGISTRY: Registry = KINDS

__all__ = ["KINDS", "Kinds", "ProbeKind", "Series", "StepContext", "StepRows"]
