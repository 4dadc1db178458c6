"""What ``loopscope bench emulator --json`` prints: its rounds (one-way delay on
the kernel's path and through the emulator, loss, the highest rate within 1 %
loss), the platform's own floor and the lab's times, as declared types; and
its human form (``print_human``)."""

from __future__ import annotations

from typing_extensions import TypedDict

from loopscope.units import format_ns


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


def _ns(x: float | None) -> str:

    return format_ns(x) if x is not None else "n/a"


def _pct(x: float | None, digits: int = 1) -> str:
    return f"{x * 100:.{digits}f} %" if x is not None else "n/a"


def _times(x: float | None) -> str:
    return f"{x:.2f}×" if x is not None else "n/a"


def _pps(x: float | None) -> str:
    return f"{x:,.0f} pps" if x is not None else "n/a"


def print_human(r: EmulatorBench) -> None:

    c = r["context"]
    print(f"link emulator, {r['pps']:,} packets/s of {c['size']} bytes, {c['seconds']:g} s per measurement, median of {c['runs']} rounds")
    print(
        f"  delay {format_ns(r['requested_delay_ns'])}: applied error p50 {_ns(r['p50_err_ns'])}, p99 {_ns(r['p99_err_ns'])}, max {_ns(r['max_err_ns'])} (kernel RX at the router → kernel RX at the receiver, − delay)"
    )
    runs = ", ".join(f"{_ns(p)} ({st:.0f} ms stolen)" for p, st in zip(r["p99_err_ns_runs"], r["steal_ms_runs"]))
    print(f"    p99 per round, with the hypervisor's steal time meanwhile: {runs}")
    print(
        f"    end to end (sender's send call → receiver kernel RX, − delay): p50 {_ns(r['end_to_end_p50_err_ns'])}, p99 {_ns(r['end_to_end_p99_err_ns'])}, max {_ns(r['end_to_end_max_err_ns'])}"
    )
    print(
        f"    the emulator's own view (its departure − its kernel RX − delay): p99 {_ns(r['emulator_own_p99_err_ns'])}; departures late p99 {_ns(r['emulator_late_p99_ns'])}"
    )
    lo, hi = r["loss_interval95"]
    print(
        f"  loss {r['loss_requested'] * 100:g} %: measured {_pct(r['loss_measured'], 3)} (95 % interval {lo * 100:.3f}–{hi * 100:.3f} %; in it: {r['loss_in_interval_runs']})"
    )
    print(
        f"  no delay, one way p50/p99: kernel forwarding {_ns(r['kernel_forward_p50_ns'])} / {_ns(r['kernel_forward_p99_ns'])}, "
        f"emulator {_ns(r['emulator_zero_p50_ns'])} / {_ns(r['emulator_zero_p99_ns'])} "
        f"(ratio {_times(r['ratio_p50_emulator_vs_kernel'])} / {_times(r['ratio_p99_emulator_vs_kernel'])})"
    )
    print(
        f"  a lab path that asks for nothing (kernel forwarding, the emulator's filters on its interfaces), one way p50/p99: "
        f"{_ns(r['kernel_path_p50_ns'])} / {_ns(r['kernel_path_p99_ns'])} (ratio to plain forwarding {_times(r['ratio_p50_kernel_path_vs_forward'])} / {_times(r['ratio_p99_kernel_path_vs_forward'])}); frames the emulator saw: {r['kernel_path_emulator_frames_runs']}"
    )
    print(
        f"  the emulator's CPU over its run (the delayed stream): {_pct(r['emulator_cpu_share'])} of one CPU (spinning ahead of the median wake-up, the default)"
    )
    print(
        f"  spinning ahead of the 99th percentile instead: applied error p99 {_ns(r['spin99_p99_err_ns'])} (per round {', '.join(_ns(x) for x in r['spin99_p99_err_ns_runs'])}), {_pct(r['spin99_cpu_share'])} of one CPU"
    )
    print(
        f"  busy-polling on a CPU of its own, delay {format_ns(r['requested_delay_ns'])}: applied error p99 {_ns(r['poll_p99_err_ns'])}, max {_ns(r['poll_max_err_ns'])} (per round {', '.join(_ns(x) for x in r['poll_p99_err_ns_runs'])}); {_pct(r['poll_cpu_share'])} of that CPU"
    )
    cpus = r["pps_cpus"]
    where = (
        f"sender and receiver on CPU {cpus['sender_and_receiver']}, the emulator on CPU {cpus['emulator']}"
        if cpus["emulator"] is not None
        else "one CPU: nothing pinned"
    )
    print(f"  highest rate of {c['rate_size']}-byte payloads at {format_ns(c['rate_delay_ns'])} with no loss ({c['rate_seconds']:g} s per trial; {where}):")
    print(
        f"    emulator {_pps(r['pps_max'])}, one system call per frame {_pps(r['pps_max_plain'])}, kernel forwarding {_pps(r['pps_kernel_max'])} "
        f"(ratio {_times(r['ratio_pps_max_vs_kernel'])} / {_times(r['ratio_pps_max_plain_vs_kernel'])} of the kernel's; rounds {r['pps_max_runs']} / {r['pps_max_plain_runs']} / {r['pps_kernel_max_runs']})"
    )
    print(
        f"  the platform: a SCHED_FIFO timer every 100 µs on the idle machine is late p99 {_ns(r['platform_fifo_timer_p99_ns'])}, p99.9 {_ns(r['platform_fifo_timer_p999_ns'])}, max {_ns(r['platform_fifo_timer_max_ns'])}; missed {_pct(r['platform_fifo_timer_missed_share'], 2)} of periods"
    )
    print(f"  a four-host lab comes up in {r['lab_up_s']:.2f} s and is gone in {r['lab_down_s']:.2f} s")
