"""`loopscope compare`: runs against a baseline run, as a table, JSON, a page, or a CI gate."""

from __future__ import annotations

import json
import time
from pathlib import Path

from typing import TYPE_CHECKING

import click

from loopscope.cli.base import cli, Percent, prints
from loopscope.errors import EXIT_CRITERION, EXIT_INCONCLUSIVE, InputError
from loopscope import progress
from loopscope.analysis.runcompare import CompareError, Criterion, CriterionResult, compare, differences, gate_outcome
from loopscope.kinds import KINDS
from loopscope.report import compare as page
from loopscope.report.sections import labels
import yaml
from loopscope.analysis import advise, explain
from loopscope.rundir import RunDir
from loopscope.report import junit as junit_xml
from loopscope.cli.show import advice, comparison

if TYPE_CHECKING:
    from loopscope.analysis.advise import AdviseJson
    from loopscope.analysis.runcompare import CompareJson


@cli.command("compare")
@click.argument("runs", nargs=-1, required=True, type=click.Path())
@click.option("--baseline", "baseline", type=click.Path(), default=None, help="The run the others are divided by [the first one].")
@click.option(
    "--fail-if",
    "fail_if",
    multiple=True,
    metavar="EXPR",
    help="A gate: fails (exit 3) when a row's 95 % interval lies wholly past the bound, passes when wholly on the good side, "
    "else is inconclusive: 'p99 > +10%', 'timer.p99 > +10%', 'mean < -5%'. Repeatable.",
)
@click.option("--strict", is_flag=True, help="Exit 4 when no criterion failed but one was inconclusive (default: exit 0 and say so).")
@click.option(
    "--min-effect",
    "min_effect",
    type=Percent(),
    default="2%",
    show_default=True,
    help="Mark a change significant only when its 95 % interval lies outside 1 ± this.",
)
@click.option(
    "--junit",
    "junit",
    type=click.Path(dir_okay=False),
    default=None,
    help="Write the criteria as JUnit XML (a case per criterion and probe) for Jenkins or GitLab.",
)
@click.option("--json", "as_json", is_flag=True, help="Print one object: runs, rows, criteria, differences.")
@click.option("-o", "--output", type=click.Path(dir_okay=False), default=None, help="Write the comparison page (HTML) here.")
@prints("loopscope.analysis.runcompare:CompareJson")
def compare_cmd(
    runs: tuple[str, ...], baseline: str | None, fail_if: tuple[str, ...], strict: bool, min_effect: float, junit: str | None, as_json: bool, output: str | None
) -> int:
    """Compare runs: every metric (p50, p99, p999, max, mean, missed) of each
    probe, phase and measure, as a ratio to the baseline run with its 95 %
    interval, marked significant when the interval lies outside 1 ± the
    minimum effect (Holm-corrected); what differs between the runs (kernel,
    command line, CPU, isolated CPUs, loopscope, the experiment file).

    A --fail-if criterion passes, fails (exit 3) or is inconclusive (the
    interval straddles the bound: exit 0 and the word, or 4 with --strict).

    \b
    Examples:
      loopscope compare runs/before runs/after
      loopscope compare runs/stock runs/isolcpus --fail-if 'timer.p99 > +10%' -o compare.html
      loopscope compare runs/main runs/branch --fail-if 'p99 > +10%' --strict --junit gate.xml
    """

    t0 = time.perf_counter()
    paths = list(runs)
    if baseline is not None:
        paths = [baseline, *[p for p in paths if Path(p).resolve() != Path(baseline).resolve()]]
    if len(paths) < 2:
        raise InputError("compare needs two runs or more (the first, or --baseline, is the baseline)")
    with progress.shown(not as_json):
        data = []
        for p in paths:
            progress.step(f"compare: reading {p}")
            data.append(page.load(p, KINDS))
        try:
            crit = [Criterion.parse(e, {m.probe for m in data[0].measures}) for e in fail_if]
            progress.step("compare: resampling")
            rows = compare(data, min_effect)
        except CompareError as e:
            raise InputError(str(e)) from None
    diff = differences(data)
    criteria: list[CriterionResult] = [c.judge(rows) for c in crit]
    if output:
        Path(output).write_text(page.render(data, rows, diff, criteria, labels(KINDS), min_effect))
    if junit:
        junit_xml.write(Path(junit), crit, rows, data[0].label, strict, time.perf_counter() - t0)
    if as_json:
        out: CompareJson = {
            "runs": [{"label": d.label, "path": d.path, "reps": d.reps, "baseline": i == 0} for i, d in enumerate(data)],
            "min_effect": min_effect,
            "rows": [r.to_json() for r in rows],
            "criteria": criteria,
            "outcome": gate_outcome(criteria),
            "differences": diff,
        }
        click.echo(json.dumps(out, default=str))
    else:
        # the terminal shows each kind's summary measures (a pipeline's end to end, not every hop); --json and the page have all
        kind_of = {m.probe: KINDS.get(m.kind) for m in data[0].measures}

        def shown(r: object) -> bool:
            k = kind_of.get(r.probe)  # type: ignore[attr-defined]
            return r.metric == "missed" or k is None or k.summary is None or r.measure in k.summary  # type: ignore[attr-defined]

        comparison(data, [r for r in rows if shown(r)], diff, criteria, output, total=rows, min_effect=min_effect, strict=strict)
    outcome = gate_outcome(criteria)
    return EXIT_CRITERION if outcome == "fail" else (EXIT_INCONCLUSIVE if outcome == "inconclusive" and strict else 0)


@cli.command("advise")
@click.argument("run_dir", type=click.Path())
@click.option("--json", "as_json", is_flag=True, help="Print one object: advice, follow_up.")
@click.option("-o", "--output", type=click.Path(dir_okay=False), default=None, help="Where the follow-up experiment goes [RUN/follow-up.yaml].")
@prints("loopscope.analysis.advise:AdviseJson")
def advise_cmd(run_dir: str, as_json: bool, output: str | None) -> int:
    """For each probe and phase, the top causes of the outliers (from the run's
    kernel capture, as `explain` names them), each with a remedy: what to do,
    the knob, the exact command, whether it needs a reboot. Writes a follow-up
    experiment: the same experiment, then a remedy phase that applies the
    remedies a phase can apply at run time (`tunings:`); run it to see whether
    they helped.

    \b
    Examples:
      loopscope advise runs/20261124-101500-demo
      loopscope advise runs/20261124-101500-demo -o follow-up.yaml && loopscope run follow-up.yaml
    """

    rd = RunDir.open(run_dir)
    if not any(c.data for c in rd.record().captures):
        raise InputError(
            f"{run_dir}: the run has no kernel capture, so there are no causes to advise on; run it with `kernel: {{capture: on}}` (root and tracefs)"
        )
    with progress.shown(not as_json):
        progress.step("advise: explaining the outliers")
        explained = explain.cached(rd.path, KINDS)
    if explained is None:
        raise InputError(f"{run_dir}: no kernel capture of the run holds data, so there are no causes to advise on")
    rows, tunings = advise.advise(rd.path, explained, {k.name: k.model for k in KINDS if k.model is not None}, {k.name: k.threads for k in KINDS})
    follow = None
    if tunings:
        follow = Path(output) if output else rd.path / "follow-up.yaml"
        spec = advise.follow_up(rd.path, tunings)
        follow.write_text(
            "# loopscope advise: the experiment of "
            + str(rd.path)
            + " as written, then its remedy phases (compare_with: the phase each remedies)\n"
            + yaml.safe_dump(spec, sort_keys=False, allow_unicode=True, default_flow_style=None, width=120)
        )
    if as_json:
        adv: AdviseJson = {"advice": rows, "follow_up": str(follow) if follow else None}
        click.echo(json.dumps(adv))
    else:
        advice(rows, follow)
    return 0
