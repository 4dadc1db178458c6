"""``provenance.json``: where and how a run ran (the lab's hosts and their
clocks, each machine's CPU, kernel, clock discipline, privileges and
checkout, what the phases' tunings changed), as pydantic models.
"""

from __future__ import annotations


from pydantic import Field


from loopscope.rundir.record import _Open


class VirtualClock(_Open):
    """A test-only skew of a host's clocks (``virtual_clock:`` of a host)."""

    offset_ns: float = 0.0
    drift_ppm: float = 0.0
    epoch_realtime_ns: int | None = None


class LabHost(_Open):
    """How the lab set a host up: its kind, address, and what it did to its clocks."""

    kind: str
    address: str | None = None
    clock_offset_ns: int = 0
    virtual_clock: VirtualClock | None = None
    ssh: str | None = None
    #: exec: the launcher's command the agent was started through
    launcher: list[str] | None = None


class LabProvenance(_Open):
    """The lab's side of provenance.json: hosts, network, links."""

    hosts: dict[str, LabHost] = Field(default_factory=dict)
    network: dict[str, object] | None = None
    links: dict[str, object] | None = None


class MachineCpu(_Open):
    model: str | None = None
    cpus: int | None = None
    usable_cpus: list[int] = Field(default_factory=list)
    isolated: str | None = None
    smt: str | None = None


class MachineKernel(_Open):
    release: str | None = None
    version: str | None = None
    machine: str | None = None
    cmdline: str | None = None


class KernelClock(_Open):
    """The kernel's NTP state (adjtimex, read only)."""

    state: str
    synchronised: bool
    frequency_ppm: float
    offset_ns: int
    max_error_us: int
    est_error_us: int
    tai_offset_s: int


class Chrony(_Open):
    """chrony's tracking report (or why there is none: ``note``)."""

    reference: str | None = None
    stratum: int | None = None
    system_time_offset_s: float | None = None
    last_offset_s: float | None = None
    rms_offset_s: float | None = None
    frequency_ppm: float | None = None
    skew_ppm: float | None = None
    leap: str | None = None
    note: str | None = None


class ClockDiscipline(_Open):
    """What disciplines a host's CLOCK_REALTIME: the kernel, chrony, the time daemons running."""

    kernel: KernelClock | None = None
    chrony: Chrony | None = None
    daemons: list[str] = Field(default_factory=list)


class CpuFreq(_Open):
    governors: dict[str, str] | None = None
    note: str | None = None


class Privileges(_Open):
    euid: int | None = None
    capabilities: dict[str, bool] = Field(default_factory=dict)


class GitInfo(_Open):
    sha: str | None = None
    dirty: bool | None = None
    note: str | None = None


class Machine(_Open):
    """One host's machine as its agent found it (``host/provenance.py``)."""

    host: str | None = None
    time_utc: str | None = None
    kernel: MachineKernel | None = None
    cpu: MachineCpu | None = None
    memory_kib: int | None = None
    clocksource: str | None = None
    #: what disciplines the host's CLOCK_REALTIME (kernel state, chrony, daemons)
    clock_discipline: ClockDiscipline | None = None
    cpufreq: CpuFreq | None = None
    cpuidle_driver: str | None = None
    preempt: str | None = None
    loadavg_at_start: list[float] | None = None
    privileges: Privileges | None = None
    cgroup: str | None = None
    tracefs: str | None = None
    software: dict[str, str | None] = Field(default_factory=dict)
    loopscope_git: GitInfo | None = None
    executable: str | None = None
    #: the kernel's boot id: hosts that share it share one kernel (one kernel capture covers them)
    boot_id: str | None = None
    #: the inode of the agent's PID namespace (hosts of one kernel with the same one see the same process ids)
    pid_ns: int | None = None
    loopscope_version: str | None = None


class Provenance(_Open):
    """What ``provenance.json`` holds: the controller, the lab, each host's machine, and the tunings the phases applied."""

    controller: dict[str, object] = Field(default_factory=dict)
    lab: LabProvenance = Field(default_factory=LabProvenance)
    hosts: dict[str, Machine] = Field(default_factory=dict)
    tunings: list[dict[str, object]] | None = None

    def offsets(self) -> dict[str, int]:
        """Each host's CLOCK_MONOTONIC offset (its time namespace), ns."""
        return {h: v.clock_offset_ns for h, v in self.lab.hosts.items()}
