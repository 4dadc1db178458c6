"""`loopscope bench …`: loopscope against its floor and its peers."""

from __future__ import annotations


from pathlib import Path

import click

from loopscope.cli.base import CpuList, Duration, _console, _default_run_dir, cli, kinds, prints  # noqa: F401
from loopscope.cli.show import _ci, _print_timer, _report, _trace_line, _trace_path  # noqa: F401


@cli.group()
def bench() -> None:
    """Benchmarks: loopscope against its floor and its peers, back to back."""


@bench.command("trace")
@click.option("--json", "as_json", is_flag=True, help="Print exactly one JSON object.")
@click.option("--quick", is_flag=True, help="Short runs (seconds, not minutes): for smoke tests, not for figures.")
@click.option("--write-seconds", type=float, default=None, help="Length of the sustained-write test [30, quick: 2].")
@click.option("--dir", "workdir", type=click.Path(file_okay=False), default=None, help="Where to write the benchmark traces [a temporary directory].")
@prints("loopscope.bench.trace:TraceBench")
def bench_trace(as_json: bool, quick: bool, write_seconds: float | None, workdir: str | None) -> int:
    """Cost per event (C, Rust, Python, two threads, disabled) against the raw floor and LTTng-UST.

    \b
    Examples:
      loopscope bench trace
      loopscope bench trace --quick --json > trace-bench.json
    """
    from loopscope.bench import trace as bt

    return _report(bt.run(quick=quick, write_seconds=write_seconds, workdir=workdir, progress=None if as_json else click.echo), as_json, bt.print_human)


@bench.command("timer")
@click.option("--json", "as_json", is_flag=True, help="Print exactly one JSON object.")
@click.option("--interval-us", type=click.IntRange(min=1), default=1000, show_default=True, help="Wake-up period of both tools, in µs.")
@click.option("--duration", type=Duration(), default="10s", show_default=True, help="Length of each run.")
@click.option("--runs", type=click.IntRange(min=1), default=3, show_default=True, help="Runs of each tool, alternating.")
@prints("loopscope.bench.timer:TimerBench")
def bench_timer(as_json: bool, interval_us: int, duration: int, runs: int) -> int:
    """The timer probe against cyclictest -m -i N, alternating runs.

    \b
    Examples:
      loopscope bench timer
      loopscope bench timer --interval-us 500 --duration 30s --runs 5
    """
    from loopscope.bench import timer as bt

    return _report(bt.run(interval_us=interval_us, duration_ns=duration, runs=runs, progress=None if as_json else click.echo), as_json, bt.print_human)


@bench.command("pacing")
@click.option("--json", "as_json", is_flag=True, help="Print exactly one JSON object.")
@click.option("--quick", is_flag=True, help="Short runs: for smoke tests, not for figures.")
@click.option("--seconds", type=float, default=None, help="Length of each rate's run [5, quick: 2].")
@prints("loopscope.bench.pacing:PacingBench")
def bench_pacing(as_json: bool, quick: bool, seconds: float | None) -> int:
    """The UDP sender against iperf3 on loopback: achieved rate, per-second CV, departure error.

    \b
    Examples:
      loopscope bench pacing
      loopscope bench pacing --quick --json
    """
    from loopscope.bench import pacing

    return _report(pacing.run(quick=quick, seconds=seconds, progress=None if as_json else click.echo), as_json, pacing.print_human)


@bench.command("emulator")
@click.option("--json", "as_json", is_flag=True, help="Print exactly one JSON object.")
@click.option("--quick", is_flag=True, help="Short runs: for smoke tests, not for figures.")
@click.option("--runs", type=click.IntRange(min=1), default=None, help="Rounds of every measurement [3, quick: 1].")
@click.option("--seconds", type=float, default=None, help="Length of each stream [5, quick: 1].")
@click.option("--rate-seconds", type=float, default=None, help="Length of each packet-rate trial [5, quick: 1].")
@prints("loopscope.bench.emulatorjson:EmulatorBench")
def bench_emulator(as_json: bool, quick: bool, runs: int | None, seconds: float | None, rate_seconds: float | None) -> int:
    """The link emulator against kernel forwarding: delay error at 10 kpps (sleeping and busy-polling), loss against its binomial
    interval, a lab path that asks for nothing, the highest packet rate against the kernel's, lab up/down.

    \b
    Examples:
      loopscope bench emulator
      loopscope bench emulator --quick --seconds 0.5 --rate-seconds 0.5
    """
    from loopscope.bench import emulator, emulatorjson

    return _report(
        emulator.run(quick=quick, runs=runs, seconds=seconds, rate_seconds=rate_seconds, progress=None if as_json else click.echo),
        as_json,
        emulatorjson.print_human,
    )


@bench.command("clocksync")
@click.option("--json", "as_json", is_flag=True, help="Print exactly one JSON object.")
@click.option("--quick", is_flag=True, help="Short runs: for smoke tests, not for figures.")
@click.option("--seconds", type=float, default=None, help="Length of each condition's run [60, quick: 10].")
@click.option("--network", "networks", type=click.Choice(["sync", "experiment"]), multiple=True, help="Which network the probes take (repeat for both) [both].")
@prints("loopscope.bench.clocksync:ClocksyncBench")
def bench_clocksync(as_json: bool, quick: bool, seconds: float | None, networks: tuple[str, ...]) -> int:
    """Clock sync against injected offsets and drifts, idle and loaded, on the sync network and on the experiment's:
    error, bound, drift; NTP's filter on the same probes.

    \b
    Examples:
      loopscope bench clocksync
      loopscope bench clocksync --network sync --json
    """
    from loopscope.bench import clocksync

    return _report(
        clocksync.run(quick=quick, seconds=seconds, networks=networks or clocksync.NETWORKS, progress=None if as_json else click.echo),
        as_json,
        clocksync.print_human,
    )


@bench.command("kcapture")
@click.option("--json", "as_json", is_flag=True, help="Print exactly one JSON object.")
@click.option("--quick", is_flag=True, help="Short runs: for smoke tests, not for figures.")
@click.option(
    "--runs",
    type=click.IntRange(min=1),
    default=None,
    help="Runs with and without capture, alternating [as many as make the noise floor narrower than the target: timer-idle 6 to 24, pipeline-busy 10 to 30; quick: 2].",
)
@click.option("--seconds", type=float, default=None, help="Length of each run [timer-idle 10, pipeline-busy 5; quick: 2].")
@click.option("--scenario", "scenarios", type=click.Choice(["timer-idle", "pipeline-busy"]), multiple=True, help="Scenarios to run [both].")
@click.option(
    "--designs",
    is_flag=True,
    help="pipeline-busy also with the designs the capture was chosen against: a reader reading continuously at SCHED_IDLE, and perf record.",
)
@prints("loopscope.bench.kcapture:KcaptureBench")
def bench_kcapture(as_json: bool, quick: bool, runs: int | None, seconds: float | None, scenarios: tuple[str, ...], designs: bool) -> int:
    """What kernel capture costs the probes: an idle timer and a pipeline under a network flood, with and without capture, alternating.

    \b
    Examples:
      loopscope bench kcapture --json
      loopscope bench kcapture --scenario pipeline-busy --designs
    """
    from loopscope.bench import kcapture

    return _report(
        kcapture.run(quick=quick, runs=runs, seconds=seconds, scenarios=list(scenarios) or None, designs=designs, progress=None if as_json else click.echo),
        as_json,
        kcapture.print_human,
    )


@bench.command("isolate")
@click.option("--json", "as_json", is_flag=True, help="Print exactly one JSON object, on one line.")
@click.option("--quick", is_flag=True, help="Two short repetitions: for smoke tests, not for figures.")
@click.option("--seconds", type=float, default=None, help="Length of each phase [5].")
@click.option("--reps", type=click.IntRange(min=2), default=None, help="Repetitions of the two phases [6; quick: 2].")
@prints("loopscope.bench.isolate:IsolateBench")
def bench_isolate(as_json: bool, quick: bool, seconds: float | None, reps: int | None) -> int:
    """The isolate tuning proven: a timer probe on CPU 1 beside planted intruders (a stray task, a kworker flood, a
    steered IRQ, RCU work), phases without and with isolate alternating; audit before and inside the isolated phase;
    the machine's state read before and after.

    \b
    Examples:
      loopscope bench isolate --json
      loopscope bench isolate --reps 10 --seconds 5
    """
    from loopscope.bench import isolate as bi

    return _report(bi.run(quick=quick, seconds=seconds, reps=reps, progress=None if as_json else click.echo), as_json, bi.print_human)


@bench.command("threads")
@click.option("--json", "as_json", is_flag=True, help="Print exactly one JSON object, on one line.")
@click.option("--quick", is_flag=True, help="One short pair: for smoke tests, not for figures.")
@click.option("--pairs", type=click.IntRange(min=1), default=None, help="Alternating pairs of runs [4, more up to 12 until the noise floor is within 1.05].")
@click.option("--seconds", type=float, default=None, help="Length of each run [10; quick: 2].")
@prints("loopscope.bench.threads:ThreadsBench")
def bench_threads(as_json: bool, quick: bool, pairs: int | None, seconds: float | None) -> int:
    """cyclictest measured by loopscope from the kernel against its own histogram, and what watching costs it (alternating runs).

    \b
    Examples:
      loopscope bench threads --json
      loopscope bench threads --pairs 8 --seconds 20
    """
    from loopscope.bench import threads as bt

    return _report(bt.run(quick=quick, pairs=pairs, seconds=seconds, progress=None if as_json else click.echo), as_json, bt.print_human)


@bench.command("monitor")
@click.option("--json", "as_json", is_flag=True, help="Print exactly one JSON object, on one line, the last of stdout.")
@click.option("--quick", is_flag=True, help="Half a minute, 10 s periods, one short pair: for smoke tests, not for figures.")
@click.option("--minutes", type=click.FloatRange(min=0.2), default=None, help="Length of the long run [10; quick: 0.5]; the busy one runs half as long.")
@click.option(
    "--pairs",
    type=click.IntRange(min=1),
    default=None,
    help="Alternating pairs of 20 s monitors without and with the recorder [4, more up to 10 until the noise floor is within 1.05].",
)
@click.option("--no-busy", is_flag=True, help="Leave out the weakest case (a context-switch storm beside the probe).")
@click.option(
    "--designs",
    is_flag=True,
    help="Run the busy case and the cost for every flight recorder: alternate (two instances), pause (one, blind while read) and drain (one read all the time into memory).",
)
@click.option(
    "--fleet",
    is_flag=True,
    help="Instead: four hosts (netns, exec through ip netns exec and nsenter, ssh), one killed at --kill-at; per host outliers kept and named, RSS, disk, Ctrl-C.",
)
@click.option("--kill-at", type=click.FloatRange(min=0), default=None, help="With --fleet: the minute e2's agent is SIGKILLed [half of --minutes].")
@prints("loopscope.bench.monitor:MonitorBench", "loopscope.bench.fleetmon:FleetMonitorBench")
def bench_monitor(
    as_json: bool, quick: bool, minutes: float | None, pairs: int | None, no_busy: bool, designs: bool, fleet: bool, kill_at: float | None
) -> int:
    """A long monitor of a timer under a periodic burst: memory, disk, outliers kept and explained, and the flight recorder's cost.
    With --fleet: a monitor of four hosts of every kind (targets: ≥ 95 % of every host's outliers named for the burst, controller RSS
    end ≤ 1.1 × minute 2, ≤ 50 MB/h, the killed host marked and the others complete, Ctrl-C ≤ 2 s).

    \b
    Examples:
      loopscope bench monitor --json
      loopscope bench monitor --minutes 60 --pairs 10
      loopscope bench monitor --designs --minutes 4
      loopscope bench monitor --fleet --minutes 10 --kill-at 5
    """
    from loopscope.bench import fleetmon, monitor as bm  # (fleetmon imports no more than monitor does)

    if fleet:
        say = (lambda s: click.echo(s, err=True)) if as_json else click.echo
        return _report(fleetmon.run(minutes=minutes, kill_at=kill_at, quick=quick, progress=say), as_json, fleetmon.print_human)

    return _report(
        bm.run(
            minutes=minutes,
            quick=quick,
            pairs=pairs,
            busy=not no_busy,
            designs=designs,
            progress=(lambda s: click.echo(s, err=True)) if as_json else click.echo,
        ),
        as_json,
        bm.print_human,
    )


@bench.command("import")
@click.option("--json", "as_json", is_flag=True, help="Print exactly one JSON object, on one line.")
@click.option("--quick", is_flag=True, help="A small recording, once: for smoke tests, not for figures.")
@click.option("--seconds", type=float, default=None, help="How long the busy load is recorded, whole seconds [4; quick: 1].")
@click.option("--repeat", type=click.IntRange(min=1), default=None, help="Repetitions per file [3; quick: 1].")
@click.option(
    "--large",
    is_flag=True,
    help="Add a large trace.dat (version 6, stress-ng --switch for 36 s into 1.4 GB a CPU: about 30 M events, 2 GB on disk), read once: rates at scale and peak memory.",
)
@prints("loopscope.bench.imports:ImportBench")
def bench_import(as_json: bool, quick: bool, seconds: float | None, repeat: int | None, large: bool) -> int:
    """Reading trace-cmd's and perf's recordings of a busy machine: import and threads rates against trace-cmd report / perf script.

    \b
    Examples:
      loopscope bench import --json
      loopscope bench import --seconds 20 --repeat 5
      loopscope bench import --large --json
    """
    from loopscope.bench import imports as bi

    return _report(bi.run(quick=quick, seconds=seconds, repeat=repeat, large=large, progress=None if as_json else click.echo), as_json, bi.print_human)


@bench.command("explain")
@click.option("--json", "as_json", is_flag=True, help="Print exactly one JSON object on one line, the last of stdout (progress goes to stderr).")
@click.option("--case", "only", multiple=True, help="Run only this case (repeatable) [every case].")
@click.option("--quick", is_flag=True, help="Short runs (2 s, one repetition; the warm-up anomaly's cold start 2 s in 8): for smoke tests, not for figures.")
@click.option("--seconds", type=click.FloatRange(min=0.5), default=None, help="Each phase's length [5, quick: 2].")
@click.option("--repetitions", type=click.IntRange(min=1, max=50), default=None, help="Alternating baseline/injected repetitions [3, quick: 1].")
@click.option("--dir", "workdir", type=click.Path(file_okay=False), default=None, help="Where the cases' experiments and runs go [a temporary directory].")
@click.option("--no-remedies", is_flag=True, help="Skip advise and the follow-up run of each case (they prove the remedy; about half the time).")
@click.option(
    "--recorder",
    type=click.Choice(["native", "trace-cmd", "perf"]),
    default="native",
    show_default=True,
    help="Who records the kernel: loopscope's capture, or trace-cmd / perf as a user records it (imported, then explained; no remedies, no anomalies).",
)
@click.option(
    "--events",
    type=click.Choice(["minimal", "full"]),
    default="full",
    show_default=True,
    help="The other recorder's events: minimal (sched_switch, sched_wakeup, sched_waking; perf: perf sched record) or full (loopscope's capture set).",
)
@prints("loopscope.bench.zoo:ZooBench")
def bench_explain(
    as_json: bool,
    only: tuple[str, ...],
    quick: bool,
    seconds: float | None,
    repetitions: int | None,
    workdir: str | None,
    no_remedies: bool,
    recorder: str,
    events: str,
) -> int:
    """The cause zoo: inject known causes of lateness, explain the runs, score what explain names first.

    Each case is a probe on CPU 1 with a baseline phase and an injected phase
    (a CPU hog, a SCHED_FIFO process, a UDP flood, timers, IPIs, timer slack,
    page faults, a lock held by another thread, a cgroup's CPU limit, RT
    throttling, a priority inversion); accuracy is the share of the
    cases whose injected cause explain ranks first. Then advise on each case's
    run and its follow-up: did the remedy lower p99. The study's anomalies
    (periodic, quantization, warm-up) are injected and must be detected and
    named. Needs root, two CPUs and tracefs; a case this machine cannot inject
    is skipped with the reason and counts as a miss.

    \b
    Examples:
      loopscope bench explain
      loopscope bench explain --case hog --case slack --quick
      loopscope bench explain --case anomalies --no-remedies
      loopscope bench explain --json > zoo.json
      loopscope bench explain --recorder trace-cmd --events minimal --no-remedies
    """
    import sys

    from loopscope.bench import zoo
    from loopscope.selfname import set_comm

    # it drives the cases' runs as their controller does, and is named as one among the lab's own
    set_comm("ls-ctl")
    say = (lambda m: click.echo(m, err=True)) if as_json else click.echo
    return (
        _report(
            zoo.run(
                only=list(only) or None,
                quick=quick,
                duration_s=seconds,
                reps=repetitions,
                workdir=workdir,
                progress=say,
                remedies=not no_remedies,
                recorder=recorder,
                events=events,
            ),
            as_json,
            zoo.print_human,
        )
        if not sys.stdout.closed
        else 1
    )


@bench.command("channels")
@click.option("--json", "as_json", is_flag=True, help="Print exactly one JSON object.")
@click.option("--quick", is_flag=True, help="Short runs, three sizes: for smoke tests, not for figures.")
@click.option("--blocks", type=click.IntRange(min=1), default=None, help="Block pairs per size, raw and channel alternating [20, quick: 4].")
@click.option("--transport", "transports", type=click.Choice(["tcp", "udp"]), multiple=True, help="Transports to measure [tcp and udp].")
@click.option(
    "--placement",
    type=click.Choice(["split", "same"]),
    default="split",
    show_default=True,
    help="split: client on CPU 0, server on CPU 1 (each hop wakes a CPU); same: both on CPU 0.",
)
@prints("loopscope.bench.channels:ChannelsBench")
def bench_channels(as_json: bool, quick: bool, blocks: int | None, transports: tuple[str, ...], placement: str) -> int:
    """What a channel costs: put → get ping-pong between two netns hosts against raw TCP and UDP, 1 KiB to 1 MiB.

    \b
    Examples:
      loopscope bench channels
      loopscope bench channels --quick --transport udp
    """
    from loopscope.bench import channels

    return _report(
        channels.run(quick=quick, blocks=blocks, transports=list(transports) or None, placement=placement, progress=None if as_json else click.echo),
        as_json,
        channels.print_human,
    )


@bench.command("lab")
@click.option("--json", "as_json", is_flag=True, help="Print exactly one JSON object.")
@click.option("--quick", is_flag=True, help="Short runs: for smoke tests, not for figures.")
@click.option("--runs", type=click.IntRange(min=1), default=None, help="Runs of each measurement [5, quick: 2].")
@click.option("--demo", default=None, help="Experiment whose report is timed [examples/demo.yaml].")
@prints("loopscope.bench.lab:LabBench")
def bench_lab(as_json: bool, quick: bool, runs: int | None, demo: str | None) -> int:
    """What the lab costs: agent start to probe start, report time, timer through the lab vs alone.

    \b
    Examples:
      loopscope bench lab
      loopscope bench lab --quick --json
    """
    from loopscope.bench import lab

    return _report(lab.run(quick=quick, runs=runs, demo=demo, progress=None if as_json else click.echo), as_json, lab.print_human)


@bench.command("model")
@click.option("--json", "as_json", is_flag=True, help="Print exactly one JSON object.")
@click.option("--quick", is_flag=True, help="Few runs: for smoke tests, not for figures.")
@click.option(
    "--runs", type=click.IntRange(min=2), default=None, help="Runs of each program per condition, the conditions taking turns run by run [100, quick: 4]."
)
@prints("loopscope.bench.model:ModelBench")
def bench_model(as_json: bool, quick: bool, runs: int | None) -> int:
    """Portable CPU-time models: predict three programs idle → memory load and idle → I/O load, then measure them there.

    \b
    Examples:
      loopscope bench model
      loopscope bench model --quick
    """
    from loopscope.bench import model

    return _report(model.run(quick=quick, runs=runs, progress=None if as_json else click.echo), as_json, model.print_human)


# ---- calibrate / model ----------------------------------------------------------------


@bench.command("report")
@click.argument("run_dir", type=click.Path())
@click.option("--runs", type=int, default=3, show_default=True, help="Builds of each way, alternating.")
@click.option("--json", "as_json", is_flag=True, help="Print exactly one JSON object.")
@prints("loopscope.bench.report:ReportBench")
def bench_report(run_dir: str, runs: int, as_json: bool) -> int:
    """`loopscope report` on RUN_DIR with its derived files removed: each trace read once, against every part reading its own.

    \b
    Examples:
      loopscope bench report runs/20261124-101500-control-loop
      loopscope bench report runs/20261124-101500-control-loop --runs 5 --json
    """
    from loopscope.bench import report

    res = report.bench(Path(run_dir), kinds(), runs, say=None if as_json else lambda t: click.echo(t, err=True))

    def human(r: report.ReportBench) -> None:
        s = r["seconds"]
        click.echo(f"report of {r['run']} ({r['traces']} traces), medians of {r['runs']}:")
        click.echo(f"  each part reading its own: {s['each_part']['median']} s {s['each_part']['range']}, {r['traces_read']['each_part']:.0f} trace files read")
        click.echo(f"  each trace read once:      {s['once']['median']} s {s['once']['range']}, {r['traces_read']['once']:.0f} trace files read")
        click.echo(f"  {r['speedup']}x faster")
        pg = r["page"]
        click.echo(f"  the page: {pg['bytes'] / 1e6:.2f} MB, {pg['charts']} charts, the largest {pg['largest_chart_bytes'] / 1e3:.0f} kB")

    return _report(res, as_json, human)


@bench.command("compare")
@click.option("--pairs", type=int, default=20, show_default=True, help="Rounds of three runs: A, A' (the same again) and B (a hog on the probe's CPU).")
@click.option("--duration", default="1s", show_default=True, help="Each phase's duration.")
@click.option("--json", "as_json", is_flag=True, help="Print exactly one JSON object.")
@prints("loopscope.bench.compare:CompareBench")
def bench_compare(pairs: int, duration: str, as_json: bool) -> int:
    """`loopscope compare` against nothing changed (A/A pairs: at most 5 % of rows significant, the gate `p99 > +10%` fails none)
    and a CPU hog at nice -20 on the probe's CPU (A/B pairs: the gate fails every one).

    \b
    Examples:
      loopscope bench compare
      loopscope bench compare --pairs 3 --duration 2s --json
    """
    from loopscope.bench import compare

    res = compare.bench(kinds(), pairs, duration, say=None if as_json else lambda t: click.echo(t, err=True))

    def human(r: compare.CompareBench) -> None:
        click.echo(
            f"A/A: {r['aa_significant']} of {r['aa_rows']} rows significant over {r['pairs']} pairs ({(r['aa_share'] or 0) * 100:.1f} %; target at most 5 %)"
        )
        click.echo(f"A/A gate {r['gate']!r}: {r['aa_gate']} (target: fail in none)")
        click.echo(f"A/B gate {r['gate']!r}: {r['ab_gate']} (target: fail in every pair)")
        click.echo(
            f"weak case, one repetition each: A/A {r['one_rep_aa_significant']} of {r['one_rep_aa_rows']} rows significant, gate {r['one_rep_aa_gate']}; "
            f"A/B gate {r['one_rep_ab_gate']}"
        )

    return _report(res, as_json, human)


@bench.command("dataset")
@click.option("--runs", "n_runs", type=int, default=200, show_default=True, help="Short real runs to record (each on one of --hosts namespace hosts in turn).")
@click.option("--hosts", type=int, default=4, show_default=True, help="Network namespace hosts the runs take turns on (h1, h2, …).")
@click.option("--duration", default="300ms", show_default=True, help="Each run's timer duration.")
@click.option("--repeat", type=int, default=5, show_default=True, help="Times each command and its floor are run, alternating.")
@click.option("--dataset", "dataset", type=click.Path(file_okay=False), default=None, help="Time over this directory of runs instead of recording one.")
@click.option("--keep", type=click.Path(file_okay=False), default=None, help="Record the runs here and keep them.")
@click.option("--monitors", type=click.IntRange(min=1), default=None, help="Instead: a fleet of this many hosts' monitors, synthesised from one real monitor.")
@click.option("--days", type=click.FloatRange(min=0.01), default=7.0, show_default=True, help="With --monitors: how long the fleet watched.")
@click.option(
    "--outliers", "n_outliers", type=click.IntRange(min=1), default=500_000, show_default=True, help="With --monitors: outliers in the fleet, in all."
)
@click.option("--from", "source", type=click.Path(file_okay=False), default=None, help="With --monitors: the real monitor to draw from [record one first].")
@click.option("--record-seconds", type=float, default=180.0, show_default=True, help="With --monitors and no --from: how long the source monitor records.")
@click.option("--json", "as_json", is_flag=True, help="Print exactly one JSON object.")
@prints("loopscope.bench.dataset:DatasetBench", "loopscope.bench.fleetdata:FleetDataBench")
def bench_dataset(
    n_runs: int,
    hosts: int,
    duration: str,
    repeat: int,
    dataset: str | None,
    keep: str | None,
    monitors: int | None,
    days: float,
    n_outliers: int,
    source: str | None,
    record_seconds: float,
    as_json: bool,
) -> int:
    """`runs`, `query` and `trend` over many real runs (targets over 200: runs and query ≤ 2 s, trend ≤ 3 s), each against the same
    answer read straight from the files; and the weak case, a query over every sample (`records`). With --monitors: a fleet of
    monitors (targets for 100 hosts × 7 days, 500,000 outliers: the top causes by host and hour ≤ 2 s, runs ≤ 3 s, the fleet page
    ≤ 10 s and ≤ 2 MB, each command ≤ 1 GB).

    \b
    Examples:
      loopscope bench dataset
      loopscope bench dataset --runs 20 --repeat 3 --json
      loopscope bench dataset --monitors 100 --days 7
      loopscope bench dataset --monitors 4 --days 1 --outliers 2000 --from overnight/ --json
    """
    from loopscope.bench import dataset as ds, fleetdata

    if monitors is not None:
        say = None if as_json else (lambda t: click.echo(t, err=True))
        fleet = fleetdata.bench(monitors, days, n_outliers, source=source, record_s=record_seconds, keep=keep, say=say)

        def fleet_human(r: fleetdata.FleetDataBench) -> None:
            click.echo(
                f"{r['hosts']} hosts × {r['days']:g} days: {r['outliers']:,} outliers, {r['periods']:,} periods, {r['dataset_mb']} MB (synthesised in {r['synthesised_s']} s from {r['source']})"
            )
            for name, target in (("query_top_causes", 2.0), ("runs", 3.0), ("trend", None), ("page", 10.0)):
                c = r["commands"][name]
                click.echo(f"  {name}: {c['seconds']} s{f' (target ≤ {target:g} s)' if target else ''}, peak RSS {c['peak_rss_mb']} MB")
            click.echo(f"  the same question of DuckDB over the files (floor): {r['query_floor_s']} s; loopscope's query x{r['query_ratio']}")
            click.echo(f"  page: {r['page_bytes'] / 1e6:.2f} MB (target ≤ 2 MB); largest RSS {r['peak_rss_mb']} MB (target ≤ 1024)")

        return _report(fleet, as_json, fleet_human)

    res = ds.bench(n_runs, hosts, duration, repeat, dataset, keep, say=None if as_json else lambda t: click.echo(t, err=True))

    def human(r: ds.DatasetBench) -> None:
        click.echo(f"{r['runs']} runs on {r['hosts']} hosts, {r['dataset_mb']} MB" + (f", recorded in {r['recorded_s']} s" if r["recorded_s"] else ""))
        for name, c in r["cases"].items():
            target = f" (target ≤ {c['target_s']:g} s)" if c["target_s"] else ""
            click.echo(f"  {name}: loopscope {c['loopscope']['median']} s {c['loopscope']['range']}, floor {c['floor']['median']} s, x{c['ratio']}{target}")

    return _report(res, as_json, human)


@bench.command("fleet")
@click.option("--hosts", type=int, default=16, show_default=True, help="Namespaces in the fleet (each an exec host).")
@click.option("--repeat", type=int, default=5, show_default=True, help="Runs per launcher, alternating between launchers.")
@click.option(
    "--launcher",
    "launchers",
    multiple=True,
    type=click.Choice(["netns", "nsenter", "slurm", "lab"]),
    help="Launchers to measure (default: all; slurm when Slurm is installed; lab: loopscope's own netns hosts).",
)
@click.option("--no-weak", is_flag=True, help="Leave out the weak case (every host measures and brings files home).")
@click.option("--no-kill", is_flag=True, help="Leave out the host killed mid-run under on_host_failure: continue.")
@click.option("--json", "as_json", is_flag=True, help="Print exactly one JSON object.")
@prints("loopscope.bench.fleetbench:FleetBench")
def bench_fleet(hosts: int, repeat: int, launchers: tuple[str, ...], no_weak: bool, no_kill: bool, as_json: bool) -> int:
    """A fleet's lab up and down through launchers (ip netns exec, nsenter, srun to a real Slurm cluster), against bare agents
    through the same launcher and loopscope's own netns hosts (targets for 16 hosts: up ≤ 5 s, down ≤ 3 s, nothing left).

    \b
    Examples:
      loopscope bench fleet
      loopscope bench fleet --hosts 4 --repeat 2 --launcher netns --json
    """
    from loopscope.bench import fleetbench as fb

    res = fb.bench(hosts, repeat, launchers or fb.LAUNCHERS, weak=not no_weak, kill=not no_kill, say=None if as_json else lambda t: click.echo(t, err=True))
    return _report(res, as_json, fb.print_human)
