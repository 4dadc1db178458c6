"""What ``loopscope bench emulator --json`` prints: its rounds (one-way delay on
the kernel's path and through the emulator, loss, the highest rate within 1 %
loss), the platform's own floor and the lab's times, as declared types."""

from __future__ import annotations

from typing_extensions import TypedDict


class Owd(TypedDict):
    """One-way delays of a stream (ns)."""

    p50_ns: float
    p99_ns: float
    max_ns: float | None
    n: int


class KernelPath(Owd):
    emulator_frames_seen: int


class EndToEnd(TypedDict):
    """Send call → receiver kernel RX, minus the requested delay (ns)."""

    p50_err_ns: float
    p99_err_ns: float
    max_err_ns: float | None
    min_err_ns: float | None
    n: int


class Applied(TypedDict, total=False):
    """The delay the emulator applied, from kernel stamps, minus the one asked (ns)."""

    own_p50_err_ns: float
    own_p99_err_ns: float
    own_max_err_ns: float
    late_p99_ns: float
    matched: bool
    emulator_cpu_share: float | None
    p50_err_ns: float
    p99_err_ns: float
    max_err_ns: float
    min_err_ns: float
    n: int
    steal_ms: float


class Loss(TypedDict):
    sent: int
    received: int
    measured: float | None
    interval95: list[float]
    in_interval: bool


class Trial(TypedDict, total=False):
    """One rate tried: sent, received, whether the sender kept its schedule."""

    pps: int
    sent: int
    received: int
    kept_up: bool
    ok: bool
    emulator: dict[str, int | None]  # the emulator's counts for the link, and its sockets' drops


class Rates(TypedDict, total=False):
    seconds: float
    size: int
    delay_ns: int
    app_cpu: int | None
    emulator_cpu: int | None
    kernel_max: int
    kernel_trials: list[Trial]
    emulator_max: int
    emulator_trials: list[Trial]
    emulator_plain_max: int
    emulator_plain_trials: list[Trial]


class Platform(TypedDict):
    p50_ns: float
    p99_ns: float
    p999_ns: float
    max_ns: float
    missed_share: float
    sched: str


class Round(TypedDict, total=False):
    """Everything measured in one round."""

    emulator_zero: Owd
    delay_end_to_end: EndToEnd
    delay: Applied
    delay_spin99: Applied
    delay_poll: Applied
    loss: Loss
    kernel: Owd
    kernel_path: KernelPath
    rates: Rates
    platform: Platform


class LabTimes(TypedDict):
    up_s: float
    down_s: float
    netns_up_s: float
    emulator_ready_s: float


class EmulatorBench(TypedDict, total=False):
    """What ``loopscope bench emulator --json`` prints: medians over the rounds
    (``*_runs``: the value of each round), the ratios, and every round."""

    requested_delay_ns: int
    pps: int
    p50_err_ns: float | None
    p99_err_ns: float | None
    max_err_ns: float | None
    min_err_ns: float | None
    steal_ms_runs: list[float | None]
    p99_err_ns_runs: list[float | None]
    end_to_end_p50_err_ns: float | None
    end_to_end_p99_err_ns: float | None
    end_to_end_max_err_ns: float | None
    emulator_own_p99_err_ns: float | None
    emulator_late_p99_ns: float | None
    loss_requested: float
    loss_measured: float | None
    loss_measured_runs: list[float | None]
    loss_in_interval_runs: list[bool]
    loss_interval95: list[float]
    kernel_forward_p50_ns: float | None
    kernel_forward_p99_ns: float | None
    kernel_path_p50_ns: float | None
    kernel_path_p99_ns: float | None
    kernel_path_emulator_frames_runs: list[int]
    emulator_cpu_share: float | None
    spin99_p99_err_ns: float | None
    spin99_p99_err_ns_runs: list[float | None]
    spin99_cpu_share: float | None
    poll_cpu_share: float | None
    poll_p99_err_ns: float | None
    poll_max_err_ns: float | None
    poll_p99_err_ns_runs: list[float | None]
    pps_max: float | None
    pps_max_plain: float | None
    pps_kernel_max: float | None
    pps_max_runs: list[int]
    pps_max_plain_runs: list[int]
    pps_kernel_max_runs: list[int]
    pps_cpus: dict[str, int | None]
    emulator_zero_p50_ns: float | None
    emulator_zero_p99_ns: float | None
    platform_fifo_timer_p99_ns: float | None
    platform_fifo_timer_p999_ns: float | None
    platform_fifo_timer_max_ns: float | None
    platform_fifo_timer_missed_share: float | None
    lab_up_s: float
    lab_down_s: float
    lab_runs: list[LabTimes]
    rounds: list[Round]
    context: dict[str, int | float]
    ratio_p50_emulator_vs_kernel: float | None
    ratio_p99_emulator_vs_kernel: float | None
    ratio_p50_kernel_path_vs_forward: float | None
    ratio_p99_kernel_path_vs_forward: float | None
    ratio_pps_max_vs_kernel: float | None
    ratio_pps_max_plain_vs_kernel: float | None
