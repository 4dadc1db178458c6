"""The tunings a phase applies (``tunings:``): CPU affinity and scheduling
of a probe or a load, a cgroup's CPU limit, IRQ affinity, ``cpu_dma_latency``,
C-states, ``mlockall``, a sysfs/procfs write; each says what it changes.
"""

from __future__ import annotations

from typing import Annotated, Literal, Union

from pydantic import Field, model_validator
from pydantic_core import PydanticCustomError


from loopscope.spec.values import CpuList, Model, Name


class _Tuning(Model):
    """What a tuning changes in how a probe or a load is started (none, for
    those that write a file): the fields of the probe's model it sets, and
    the keys of the load's start-up description."""

    def for_probe(self, name: str) -> dict[str, object]:
        return {}

    def for_load(self, name: str) -> dict[str, object]:
        return {}


class _Target(_Tuning):
    probe: Name | None = Field(None, description="a probe of the experiment")
    load: Name | None = Field(None, description="a load of this phase")

    @model_validator(mode="after")
    def _one(self) -> "_Target":
        if (self.probe is None) == (self.load is None):
            raise PydanticCustomError("tuning_target", "name exactly one of probe or load", {})
        return self


class AffinityTuning(_Target):
    """Run a probe or a load on these CPUs during the phase."""

    kind: Literal["affinity"]
    cpus: CpuList = Field(min_length=1)

    def for_probe(self, name: str) -> dict[str, object]:
        return {"cpu": list(self.cpus)} if self.probe == name else {}

    def for_load(self, name: str) -> dict[str, object]:
        return {"cpus": list(self.cpus)} if self.load == name else {}


class SchedTuning(_Target):
    """A scheduling policy and priority for a probe or a load during the phase."""

    kind: Literal["sched"]
    policy: Literal["fifo", "rr", "other"] = "fifo"
    priority: Annotated[int, Field(ge=1, le=99)] | None = Field(None, description="1..99 for fifo and rr")

    def for_probe(self, name: str) -> dict[str, object]:
        return {"priority": self.priority} if self.probe == name else {}

    def for_load(self, name: str) -> dict[str, object]:
        return {"sched": {"policy": self.policy, "priority": self.priority}} if self.load == name else {}


class LimitTuning(_Tuning):
    """A CPU limit on a load during the phase (cgroup bandwidth): at most
    ``cpus`` CPUs' worth of time in every 100 ms (every second below 0.01),
    for every thread of it."""

    kind: Literal["limit"]
    load: Name = Field(description="a load of this phase")
    cpus: Annotated[float, Field(ge=0.001, le=1024)] = Field(
        description="CPUs' worth of time it may use (0.1: 10 ms of every 100 ms; 0.001: 1 ms a second, stopped in effect)"
    )

    def for_load(self, name: str) -> dict[str, object]:
        return {"limit": {"cpus": self.cpus}} if self.load == name else {}


class IrqTuning(_Tuning):
    """Steer an interrupt to these CPUs (/proc/irq/N/smp_affinity_list)."""

    kind: Literal["irq"]
    irq: Annotated[int, Field(ge=0)]
    cpus: CpuList = Field(min_length=1)


class DmaLatencyTuning(_Tuning):
    """Hold /dev/cpu_dma_latency at this many µs (0: no deep idle states)."""

    kind: Literal["dma_latency"]
    us: Annotated[int, Field(ge=0)] = 0


class CpuidleTuning(_Tuning):
    """Disable (or enable) one idle state, by index or name, on these CPUs (default: all)."""

    kind: Literal["cpuidle"]
    state: int | str
    cpus: CpuList | None = None
    disable: bool = True


class MlockTuning(_Tuning):
    """Lock a probe's memory (mlockall) during the phase: a timer probe's ``mlock``, a program's through loopscope's library."""

    kind: Literal["mlock"]
    probe: Name = Field(description="a probe that takes mlock (timer, program)")

    def for_probe(self, name: str) -> dict[str, object]:
        return {"mlock": True} if self.probe == name else {}


class WriteTuning(_Tuning):
    """Write a value to one file of an allowed list of sysfs and procfs files (docs/experiments.md)."""

    kind: Literal["write"]
    path: str
    value: str | int


class IsolateTuning(_Tuning):
    """Keep these CPUs for the experiment during the phase: every task and
    kthread that may be moved (the lab's own probes and loads apart), those
    started during the phase too, every IRQ that accepts it, the receive
    queues' packet steering and the unbound workqueues go to the other CPUs;
    all given back after (docs/audit.md)."""

    kind: Literal["isolate"]
    cpus: CpuList = Field(min_length=1)
    timer_migration: bool = Field(False, description="also stop timers migrating onto busy CPUs (kernel.timer_migration 0)")


Tuning = Annotated[
    Union[AffinityTuning, SchedTuning, LimitTuning, IrqTuning, DmaLatencyTuning, CpuidleTuning, MlockTuning, WriteTuning, IsolateTuning],
    Field(discriminator="kind"),
]
