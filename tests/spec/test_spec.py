"""Experiment files: every shipped example loads, and bad files get located errors."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from loopscope.kinds import KINDS
from loopscope.spec import SpecError, json_schema, load, parse
from loopscope.spec.plan import phase_runs
from tests.conftest import ROOT, Cli

EXAMPLES = sorted((ROOT / "examples").glob("*.yaml"))

MINIMAL = """name: timer-under-cpu
probes:
  - kind: timer
    interval_us: 1000
loads:
  - kind: cpu
    level: 2
duration: 30s
"""


@pytest.mark.parametrize("path", EXAMPLES, ids=[p.name for p in EXAMPLES])
def test_every_shipped_example_is_valid(path: Path) -> None:
    exp = load(path, KINDS)
    assert exp.phases and exp.probes
    assert len(phase_runs(exp)) == len(exp.phases) * exp.repetitions


@pytest.mark.parametrize("path", EXAMPLES, ids=[p.name for p in EXAMPLES])
def test_every_example_validates_against_the_published_schema(path: Path) -> None:
    import jsonschema
    import yaml

    jsonschema.validate(yaml.safe_load(path.read_text()), json_schema(KINDS))


def test_the_smallest_file_gets_a_baseline_and_one_phase_per_load() -> None:
    exp = parse(MINIMAL, "m.yaml", KINDS)
    assert [p.name for p in exp.phases or []] == ["baseline", "cpu-2"]
    assert exp.duration == 30_000_000_000 and exp.loads[0].level.processes == 2


def test_a_sweep_expands_kind_by_level() -> None:
    exp = parse(MINIMAL.replace("loads:\n  - kind: cpu\n    level: 2\n", "sweep:\n  kind: [cpu, io]\n  level: [1, '50%']\n"), "s.yaml", KINDS)
    assert [ld.name for ld in exp.loads] == ["cpu-1", "cpu-50pct", "io-1", "io-50pct"]
    assert len(exp.phases or []) == 5


def test_shuffled_order_is_reproducible() -> None:
    text = MINIMAL + "repetitions: 3\norder: shuffled\nseed: 4\nsweep:\n  kind: [cpu, io, memory]\n  level: [1]\n"
    a = [(r.rep, r.phase.name) for r in phase_runs(parse(text, "a.yaml", KINDS))]
    b = [(r.rep, r.phase.name) for r in phase_runs(parse(text, "b.yaml", KINDS))]
    assert a == b and len(set(n for _, n in a)) == 5


BAD = [
    ("name: x\nprobes: [\n", "x.yaml:3: invalid YAML"),
    ("- just\n- a list\n", "x.yaml:1: the file must be a mapping"),
    (
        MINIMAL.replace("level: 2", "level: 0"),
        "x.yaml:7: loads.0.level: must be a number of processes (1..512, e.g. 2) or a duty cycle on every CPU (1..100 %, e.g. '50%') [got 0]",
    ),
    (
        MINIMAL.replace("level: 2", "level: '150%'"),
        "x.yaml:7: loads.0.level: must be a number of processes (1..512, e.g. 2) or a duty cycle on every CPU (1..100 %, e.g. '50%') [got 150%]",
    ),
    (MINIMAL.replace("kind: timer", "kind: jitter"), "x.yaml:3: probes.0.kind: unknown kind 'jitter'; use one of 'timer', 'sched', 'syscall'"),
    (MINIMAL.replace("kind: cpu", "kind: gpu"), "x.yaml:6: loads.0.kind: unknown kind 'gpu'"),
    (
        MINIMAL.replace("kind: timer\n    interval_us: 1000", "kind: syscall\n    calls: [read:4096, getpid:8]"),
        'x.yaml:4: probes.0.calls.1: "getpid:8": getpid takes no size; sized calls: read, write, sendto, recvfrom',
    ),
    (MINIMAL.replace("duration: 30s", "duration: 30"), "x.yaml:8: duration: needs a unit, e.g. 30s or 30ms [got 30]"),
    (MINIMAL.replace("duration: 30s", ""), "x.yaml:1: duration: is required"),
    (MINIMAL.replace("interval_us: 1000", "interval_us: 1000\n    zzz: 5"), "x.yaml:5: probes.0.zzz: unknown field; allowed here: kind, name, interval_us"),
    (MINIMAL.replace("interval_us: 1000", "interval_us: 0"), "x.yaml:4: probes.0.interval_us: must be at least 1 [got 0]"),
    (MINIMAL.replace("name: timer-under-cpu", "name: timer under cpu"), "x.yaml:1: name: must be 1-64 letters"),
    (MINIMAL + "phases:\n  - name: p\n    loads: [cpu-3]\n", "x.yaml:11: phases.0.loads.0: no load named 'cpu-3'; the loads are cpu-2"),
    (MINIMAL + "repetitions: 0\n", "x.yaml:9: repetitions: must be at least 1 [got 0]"),
    (MINIMAL.replace("probes:\n  - kind: timer\n    interval_us: 1000\n", "probes: []\n"), "x.yaml:2: probes: needs at least 1 item(s)"),
    (MINIMAL.replace("kind: cpu\n    level: 2", "kind: command\n    command: ''"), "x.yaml:7: loads.0.command: must not be empty"),
    (MINIMAL + "warmup: soon\n", "x.yaml:9: warmup: 'soon' is not a duration"),
    (MINIMAL.replace("kind: cpu\n    level: 2", "kind: net\n    rate: 10 mbit"), "x.yaml:7: loads.0.rate: '10 mbit': 'm' would mean milli"),
    (MINIMAL.replace("kind: cpu\n    level: 2", "kind: net\n    protocol: sctp"), "x.yaml:7: loads.0.protocol: must be one of 'udp' or 'tcp' [got 'sctp']"),
    (MINIMAL.replace("interval_us: 1000", "intervl_us: 1000"), "x.yaml:4: probes.0.intervl_us: unknown field (did you mean 'interval_us'?); allowed here:"),
    (MINIMAL.replace("duration: 30s", "duraton: 30s"), "x.yaml:8: duraton: unknown field (did you mean 'duration'?); allowed here:"),
    (MINIMAL.replace("kind: timer", "kind: timr"), "x.yaml:3: probes.0.kind: unknown kind 'timr' (did you mean 'timer'?); use one of"),
    (
        MINIMAL.replace("kind: cpu\n    level: 2", "kind: net\n    protocol: upd"),
        "x.yaml:7: loads.0.protocol: must be one of 'udp' or 'tcp' [got 'upd']; did you mean 'udp'?",
    ),
    (MINIMAL.replace("    interval_us: 1000", "     interval_us: 1000"), "x.yaml:4: invalid YAML: a `key: value` where this line's indentation"),
    (MINIMAL.replace("  - kind: cpu", "  - kind: cpu\n - kind: io"), "x.yaml:7: invalid YAML: this line's indentation does not match"),
    (MINIMAL.replace("duration: 30s", "duration: 30s\n  warmup: 1s"), "x.yaml:9: invalid YAML: a `key: value` where this line's indentation"),
    (MINIMAL.replace("    level: 2", "\tlevel: 2"), "x.yaml:7: invalid YAML: a tab in the indentation"),
    (
        MINIMAL.replace("kind: timer\n    interval_us: 1000", "kind: syscall\n    name: s") + "phases:\n  - name: p\n    tunings: [{kind: mlock, probe: s}]\n",
        "x.yaml:11: phases.0.tunings.0.probe: a syscall probe takes no mlock (timer and program probes do)",
    ),
    (
        MINIMAL + "phases:\n  - name: p\n    tunings: [{kind: limit, load: cpu-2, cpus: 0.1}]\n",
        "x.yaml:11: phases.0.tunings.0.load: no load 'cpu-2' in phase 'p'; its loads are (none)",
    ),
    (
        MINIMAL + "phases:\n  - name: p\n    loads: [cpu-2]\n    tunings: [{kind: limit, load: cpu-2, cpus: 0}]\n",
        "x.yaml:12: phases.0.tunings.0.cpus: must be at least 0.001 [got 0]",
    ),
    (
        MINIMAL + "phases:\n  - name: p\n    loads: [cpu-2]\n    tunings: [{kind: isolate, cpus: [1]}, {kind: affinity, load: cpu-2, cpus: [0, 1]}]\n",
        "x.yaml:12: phases.0.tunings.1.cpus: load 'cpu-2' is pinned to CPU 1, which the phase isolates for its probes; pin it to the other CPUs or isolate fewer",
    ),
]


@pytest.mark.parametrize("text, message", BAD, ids=[m.split(": ", 1)[1][:40] for _, m in BAD])
def test_a_bad_file_is_refused_with_file_line_field_and_value(text: str, message: str) -> None:
    with pytest.raises(SpecError) as e:
        parse(text, "x.yaml", KINDS)
    assert any(p.render("x.yaml").startswith(message) for p in e.value.problems), str(e.value)


def test_all_problems_are_reported_at_once() -> None:
    text = MINIMAL.replace("level: 2", "level: 0").replace("interval_us: 1000", "interval_us: -1").replace("duration: 30s", "duration: 5")
    with pytest.raises(SpecError) as e:
        parse(text, "x.yaml", KINDS)
    assert len(e.value.problems) == 3
    assert str(e.value).startswith("x.yaml: 3 problems, nothing was run:")


def test_the_cli_refuses_a_bad_file_with_exit_2_and_runs_nothing(cli: Cli, tmp_path: Path, beside: None) -> None:
    f = tmp_path / "bad.yaml"
    f.write_text(MINIMAL.replace("level: 2", "level: 0"))
    r = cli("run", str(f), "--results", str(tmp_path / "runs"))
    assert r.returncode == 2, r.stderr
    assert "bad.yaml:7: loads.0.level: must be a number of processes (1..512, e.g. 2) or a duty cycle on every CPU (1..100 %, e.g. '50%') [got 0]" in r.stderr
    assert "Traceback" not in r.stderr
    assert not (tmp_path / "runs").exists()
    assert cli("check", str(f)).returncode == 2


def test_a_missing_file_is_named(cli: Cli, beside: None) -> None:
    r = cli("run", "nope.yaml")
    assert r.returncode == 2 and "nope.yaml: no such experiment file" in r.stderr


def test_schema_prints_valid_json_with_every_probe_and_load_kind(cli: Cli) -> None:
    r = cli("schema")
    assert r.returncode == 0
    s = json.loads(r.stdout)
    text = json.dumps(s)
    for kind in ("timer", "sched", "syscall", "cpu", "memory", "io", "net", "mix", "command"):
        assert f'"{kind}"' in text


def test_a_phase_compared_with_a_phase_that_does_not_exist_is_refused() -> None:
    text = MINIMAL + "phases:\n  - {name: cpu-2, loads: [cpu-2]}\n  - {name: remedy, loads: [cpu-2], compare_with: nosuch}\n"
    with pytest.raises(SpecError) as e:
        parse(text, "x.yaml", KINDS)
    assert any("phases.1.compare_with" in p.render("x.yaml") and "nosuch" in p.render("x.yaml") for p in e.value.problems), str(e.value)


def test_a_remedy_phase_is_compared_with_the_phase_it_names() -> None:
    import numpy as np
    import polars as pl

    from loopscope.analysis.phases import Measure, compare_phases

    rng = np.random.default_rng(1)
    rows = [(rep, ph, v) for rep in (1, 2, 3) for ph, scale in (("baseline", 1.0), ("hog", 5.0), ("remedy", 1.0)) for v in rng.exponential(scale, 400)]
    df = pl.DataFrame(rows, schema=["rep", "phase", "value"], orient="row").with_columns(pl.lit("").alias("loads"))
    m = Measure("t", "timer", "latency", df, ("p50", "p99", "mean"), 32)
    c = compare_phases([m], ["baseline", "hog", "remedy"], None, {"remedy": "hog"})
    r = c.filter((pl.col("phase") == "remedy") & (pl.col("metric") == "p99")).row(0, named=True)
    assert r["baseline_phase"] == "hog" and r["ratio"] < 0.5 and r["significant"]
    h = c.filter((pl.col("phase") == "hog") & (pl.col("metric") == "p99")).row(0, named=True)
    assert h["baseline_phase"] == "baseline"
