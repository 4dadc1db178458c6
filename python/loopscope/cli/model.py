"""`loopscope calibrate …` and `loopscope model …`: node and app models."""

from __future__ import annotations

import json
from pathlib import Path
from typing import TYPE_CHECKING

import click

from loopscope.errors import InputError
from loopscope.cli.base import CpuList, Duration, _console, _default_run_dir, cli, prints  # noqa: F401
from loopscope.cli.show import _ci, _print_timer, _report, _trace_line, _trace_path  # noqa: F401
from loopscope.model import node
from loopscope.cli.params import build
from loopscope.probes.params import SyscallParams
from loopscope.model import app, predict
import numpy as np

if TYPE_CHECKING:
    from loopscope.model.predict import CheckJson
    from loopscope.model.predict import PredictJson


if TYPE_CHECKING:
    from loopscope.model.app import AppModel
    from loopscope.model.node import Condition, NodeModel


@cli.group()
def calibrate() -> None:
    """Calibrate a node (system-call and execution-environment costs, per load) or an application."""


@calibrate.command("node")
@click.option("--loads", default="", help="Load conditions besides idle, comma-separated: cpu, memory, io, each optionally :PROCESSES (memory:2).")
@click.option(
    "--calls",
    default=None,
    help="System calls to measure, comma-separated, a size for the ones that move data (read:4096) "
    "[every call the syscall probe knows, and read, write, sendto, recvfrom at a few sizes].",
)
@click.option(
    "--sizes",
    default=None,
    help="With the default calls: the sizes (bytes, comma-separated) read, write, sendto and recvfrom are "
    "calibrated at [read/write 64,4096,65536; sendto/recvfrom 256,1400,16384].",
)
@click.option(
    "--max-seconds-per-call", type=click.FloatRange(0.1, 600), default=2.0, show_default=True, help="Cap on the time spent on one call per condition."
)
@click.option("--cpu", "cpus", type=CpuList(), default=None, help="Measure on these CPUs (calibrate apps with the same --cpu).")
@click.option("--load-cpu", "load_cpus", type=CpuList(), default=None, help="Run the load workers on these CPUs.")
@click.option("-o", "--output", type=click.Path(dir_okay=False), required=True, help="Write the node model (JSON) here.")
def calibrate_node(
    loads: str, calls: str | None, sizes: str | None, max_seconds_per_call: float, cpus: list[int] | None, load_cpus: list[int] | None, output: str
) -> int:
    """Measure what this machine charges for each system call and for two execution environments, idle and under each load.

    \b
    Examples:
      loopscope calibrate node -o node.json
      loopscope calibrate node --loads cpu,mem --cpu 1 -o node.json
    """

    for x in [x for x in loads.split(",") if x]:
        node.parse_load(x)
    if calls and sizes:
        raise InputError("--sizes applies to the default calls; with --calls give each size in the call (read:4096)")
    names = [c for c in calls.split(",") if c] if calls else node.default_calls(node.parse_sizes(sizes) if sizes else None)
    build(SyscallParams, {"calls": names})  # refused here, naming the call, before any calibration ran
    m = node.calibrate(
        [x for x in loads.split(",") if x],
        calls=names,
        max_seconds_per_call=max_seconds_per_call,
        say=lambda t: click.echo(t, err=True),
        cpus=cpus,
        load_cpus=load_cpus,
    )
    Path(output).write_text(m.model_dump_json(exclude_unset=True) + "\n")
    for cond, c in m.conditions.items():
        env = ", ".join(f"{k} {v.mean_ns:.2f} ± {v.ci95_half_ns or 0:.2f} ns/op" for k, v in c.environments.items())
        click.echo(f"{cond}: {len(c.syscalls)} calls; {env}")
        for k, ch in (m.changes[cond].syscalls if cond in m.changes else {}).items():
            if ch.significant:
                click.echo(f"  {k}: {ch.ratio:.2f}x [{ch.ci95[0]:.2f}, {ch.ci95[1]:.2f}]")
    click.echo(f"node model: {output}")
    return 0


@calibrate.command("app", context_settings={"ignore_unknown_options": True, "allow_interspersed_args": False})
@click.option("--runs", type=click.IntRange(min=2), default=200, show_default=True, help="Timed runs (Carlinet et al. 2000 used 200).")
@click.option("--traced-runs", type=click.IntRange(min=0), default=3, show_default=True, help="Further runs under perf trace, for the system-call structure.")
@click.option("--node", "node_path", type=click.Path(dir_okay=False), default=None, help="The node model of this machine (recorded in the app model).")
@click.option("--condition", default="idle", show_default=True, help="The node model's condition the app runs under now.")
@click.option(
    "--environment", type=click.Choice(["cpython", "compiled"]), default=None, help="Its execution environment [cpython for python commands, else compiled]."
)
@click.option("--cpu", "cpus", type=CpuList(), default=None, help="Run it on these CPUs (as the node was calibrated).")
@click.option("-o", "--output", type=click.Path(dir_okay=False), required=True, help="Write the app model (JSON) here.")
@click.argument("command", nargs=-1, type=click.UNPROCESSED)
def calibrate_app(
    runs: int, traced_runs: int, node_path: str | None, condition: str, environment: str | None, cpus: list[int] | None, output: str, command: tuple[str, ...]
) -> int:
    """Run a program repeatedly: its CPU time (total, user, system) and its system-call structure, as an app model.

    \b
    Examples:
      loopscope calibrate app --node node.json -o app.json -- ./my-app --frames 1000
      loopscope calibrate app --node node.json --runs 20 -o app.json -- python3 app.py
    """

    nm = node.read(node_path) if node_path else None
    if nm is not None:
        node.condition(nm, condition, node_path or "")
    m = app.calibrate(list(command), runs, traced_runs, nm, node_path, condition, env_kind=environment, say=lambda t: click.echo(t, err=True), cpus=cpus)
    Path(output).write_text(m.model_dump_json(exclude_unset=True) + "\n")
    assert m.cpu is not None  # calibrate always measures it
    t = m.cpu.total
    click.echo(
        f"{m.command[0]}: CPU {t.mean_ns / 1e6:.2f} ms mean, p95 {t.p95_ns / 1e6:.2f}, p99 {t.p99_ns / 1e6:.2f} "
        f"(user {m.cpu.user.mean_ns / 1e6:.2f}, system {m.cpu.system.mean_ns / 1e6:.2f}) over {runs} runs; "
        f"{m.syscalls.calls_per_run or 0:.0f} system calls per run, {len(m.syscalls.states)} kinds"
    )
    click.echo(f"app model: {output}")
    return 0


@cli.group("model")
def model_group() -> None:
    """Carry an app model from one node or condition to another."""


def _node_ref(text: str) -> tuple[NodeModel, Condition, str]:

    path, _, cond = text.partition(":")
    m = node.read(path)
    return m, node.condition(m, cond or None, path), f"{path}:{cond or 'idle'}"


def _from_of(a: AppModel, src: str | None, app_model: str) -> str:
    """--from, or the node the app model was calibrated against."""

    if src:
        return src
    if not a.node.path:
        raise InputError(f"{app_model}: calibrated without --node, so give --from NODE_MODEL[:CONDITION]")
    return f"{a.node.path}:{a.node.condition or 'idle'}"


@model_group.command("predict")
@click.argument("app_model", type=click.Path(dir_okay=False))
@click.option("--from", "src", default=None, help="NODE_MODEL[:CONDITION] the app was calibrated on [the one its model names].")
@click.option("--to", "dst", required=True, help="NODE_MODEL[:CONDITION] to predict for.")
@click.option("--json", "as_json", is_flag=True, help="Print exactly one JSON object.")
@prints("loopscope.model.predict:PredictJson")
def model_predict(app_model: str, src: str | None, dst: str, as_json: bool) -> int:
    """Predict the app's CPU time distribution on another node or under another condition.

    \b
    Examples:
      loopscope model predict app.json --from idle --to cpu
      loopscope model predict app.json --from idle --to cpu --json
    """

    a = app.read(app_model)
    _, ca, na = _node_ref(_from_of(a, src, app_model))
    _, cb, nb = _node_ref(dst)
    p = predict.predict(a, ca, cb)
    if as_json:
        pj: PredictJson = {"from": na, "to": nb, **p}
        click.echo(json.dumps(pj))
        return 0
    click.echo(f"{' '.join(a.command)}: {na} → {nb}")
    click.echo(
        f"  CPU mean {p['from_mean_ns'] / 1e6:.2f} ms → {p['pred_mean_ns'] / 1e6:.2f} ms [{p['pred_mean_ci95_ns'][0] / 1e6:.2f}, {p['pred_mean_ci95_ns'][1] / 1e6:.2f}], "
        f"p95 {p['pred_p95_ns'] / 1e6:.2f} ms, p99 {p['pred_p99_ns'] / 1e6:.2f} ms"
    )
    u, s = p["user_ratio"], p["sys_ratio"]
    click.echo(
        f"  user ({p['user_share'] * 100:.0f} % of it, {p['environment']}) × {u['ratio']:.3f} [{u['ci95'][0]:.3f}, {u['ci95'][1]:.3f}]; "
        f"system × {s['ratio']:.3f} [{s['ci95'][0]:.3f}, {s['ci95'][1]:.3f}] from {len(s['calls_used'])} calls"
        + (f", {by_size * 100:.0f} % of its calls priced at the sizes they moved" if (by_size := s["priced_by_size_share"]) else "")
        + (f", {unmodelled * 100:.0f} % of its calls have no counterpart in the node model" if (unmodelled := s["unmodelled_share"]) else "")
    )
    for lim in p["limits"]:
        click.echo(f"  not seen: {lim}")
    return 0


@model_group.command("show")
@click.argument("model_file", type=click.Path(dir_okay=False))
@click.option("--top", type=click.IntRange(min=1), default=12, show_default=True, help="States (calls) to list.")
def model_show(model_file: str, top: int) -> int:
    """Print a node or app model: costs per condition, or an app's CPU time and call structure.

    \b
    Examples:
      loopscope model show app.json
      loopscope model show node.json --top 5
    """

    try:
        kind = json.loads(Path(model_file).read_text()).get("format")
    except (OSError, ValueError, AttributeError):
        kind = None
    if kind == "loopscope-node-model":
        m = node.read(model_file)
        click.echo(f"node model of {m.machine.host} ({m.machine.cpu.model if m.machine.cpu else None}), {m.created}")
        conds = list(m.conditions)
        click.echo(f"  {'cost (typical batch)':<22}" + "".join(f"{c:>14}" for c in conds))

        def cost(part: str, c: str, k: str) -> float:
            x = getattr(m.conditions[c], part).get(k)
            v = (x.typical_ns if x.typical_ns is not None else x.median_ns) if x else None
            return float(v) if v is not None else float("nan")

        idle = m.conditions["idle"]
        rows = [("env " + k, [cost("environments", c, k) for c in conds]) for k in idle.environments]
        rows += [(k, [cost("syscalls", c, k) for c in conds]) for k in idle.syscalls]
        for name, vals in rows:
            marks = []
            for c, v in zip(conds, vals):
                ch = m.changes.get(c)
                part = (ch.environments if name.startswith("env ") else ch.syscalls).get(name.removeprefix("env ")) if ch else None
                marks.append(f"{v:>12.1f}{'*' if part and part.significant else ' '} ")
            click.echo(f"  {name:<22}" + "".join(marks))
        click.echo("  (ns per call or per operation; * = significantly different from idle)")
        return 0
    if kind == "loopscope-app-model":
        a = app.read(model_file)
        click.echo(f"{' '.join(a.command)} ({a.environment}), {len(a.runs.user_ns)} runs, node {a.node.path}:{a.node.condition}")
        if a.cpu is not None:
            t = a.cpu.total
            click.echo(
                f"  CPU mean {t.mean_ns / 1e6:.2f} ms, p95 {t.p95_ns / 1e6:.2f}, p99 {t.p99_ns / 1e6:.2f}, min {t.min_ns / 1e6:.2f}, max {t.max_ns / 1e6:.2f}; "
                f"user {a.cpu.user.mean_ns / 1e6:.2f} ms, system {a.cpu.system.mean_ns / 1e6:.2f} ms"
            )
        sc = a.syscalls
        if not sc.states:
            click.echo(f"  no call structure: {sc.note or 'not traced'}")
            return 0
        click.echo(
            f"  {sc.calls_per_run or 0:.0f} calls per run on {sc.threads_per_run or 0:.1f} threads; between calls p50 {(sc.gap_p50_ns or 0) / 1e3:.1f} µs, p99 {(sc.gap_p99_ns or 0) / 1e3:.1f} µs"
            + (f"; {sc.lost_events} events lost by the tracer" if sc.lost_events else "")
        )
        click.echo(f"  {'call':<18}{'per run':>9}{'p50':>10}{'p99':>10}{'bytes':>10}  next")
        for name, st in list(sc.states.items())[:top]:
            nxt = ", ".join(f"{k} {v * 100:.0f}%" for k, v in list(st.next.items())[:3])
            nb = f"{st.bytes_mean:>10.0f}" if st.bytes_mean is not None else f"{'':>10}"
            click.echo(f"  {name:<18}{st.per_run:>9.1f}{(st.dur_p50_ns or 0) / 1e3:>8.1f}µs{(st.dur_p99_ns or 0) / 1e3:>8.1f}µs{nb}  {nxt}")
        if len(sc.states) > top:
            click.echo(f"  … {len(sc.states) - top} more kinds of call (--top)")
        return 0
    raise InputError(f"{model_file}: not a node or app model (they are written by `loopscope calibrate node|app`)")


@model_group.command("check")
@click.argument("app_model", type=click.Path(dir_okay=False))
@click.option("--from", "src", default=None, help="NODE_MODEL[:CONDITION] the app was calibrated on [the one its model names].")
@click.option("--to", "dst", required=True, help="NODE_MODEL[:CONDITION] of this machine as it is now.")
@click.option("--runs", type=click.IntRange(min=2), default=50, show_default=True, help="Runs of the program here, to compare with the prediction.")
@click.option("--json", "as_json", is_flag=True, help="Print exactly one JSON object.")
@prints("loopscope.model.predict:CheckJson")
def model_check(app_model: str, src: str | None, dst: str, runs: int, as_json: bool) -> int:
    """Run the app here now and compare its CPU time with the prediction.

    \b
    Examples:
      loopscope model check app.json --from idle --to cpu
      loopscope model check app.json --from idle --to mem --runs 10 --json
    """

    a = app.read(app_model)
    _, ca, na = _node_ref(_from_of(a, src, app_model))
    _, cb, nb = _node_ref(dst)
    p = predict.predict(a, ca, cb)
    r = app.run_many(a.command, runs, cpus=a.cpus)
    cpu = np.asarray(r["user_ns"], dtype=float) + np.asarray(r["sys_ns"], dtype=float)
    meas = {"meas_mean_ns": float(cpu.mean()), "meas_p95_ns": float(np.percentile(cpu, 95)), "meas_p99_ns": float(np.percentile(cpu, 99))}
    err = {"err_mean_pct": 100 * (p["pred_mean_ns"] / meas["meas_mean_ns"] - 1), "err_p99_pct": 100 * (p["pred_p99_ns"] / meas["meas_p99_ns"] - 1)}
    if as_json:
        cj: CheckJson = {
            "from": na,
            "to": nb,
            **p,
            "meas_mean_ns": meas["meas_mean_ns"],
            "meas_p95_ns": meas["meas_p95_ns"],
            "meas_p99_ns": meas["meas_p99_ns"],
            "err_mean_pct": err["err_mean_pct"],
            "err_p99_pct": err["err_p99_pct"],
        }
        click.echo(json.dumps(cj))
        return 0
    click.echo(f"{' '.join(a.command)}: {na} → {nb}, {runs} runs now")
    click.echo(f"  mean: predicted {p['pred_mean_ns'] / 1e6:.2f} ms, measured {meas['meas_mean_ns'] / 1e6:.2f} ms ({err['err_mean_pct']:+.1f} %)")
    click.echo(f"  p99:  predicted {p['pred_p99_ns'] / 1e6:.2f} ms, measured {meas['meas_p99_ns'] / 1e6:.2f} ms ({err['err_p99_pct']:+.1f} %)")
    return 0
