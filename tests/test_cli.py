"""The command line as a user meets it: help, versions, errors, exit codes."""

from __future__ import annotations

from pathlib import Path

import loopscope.trace as lt
from tests.conftest import Cli
from tests.helpers import assert_clean_error


def test_help_lists_the_subcommands(cli: Cli) -> None:
    r = cli("--help")
    assert r.returncode == 0
    for c in ("probe", "trace", "bench"):
        assert c in r.stdout


def test_version_prints_the_package_version(cli: Cli) -> None:
    from loopscope import __version__

    r = cli("--version")
    assert r.returncode == 0 and __version__ in r.stdout


def test_an_unknown_command_is_a_usage_error(cli: Cli) -> None:
    assert_clean_error(cli("frobnicate"), 2, "No such command", "loopscope --help")


def test_a_missing_argument_is_named(cli: Cli) -> None:
    assert_clean_error(cli("trace", "info"), 2, "Missing argument 'FILE'")


def test_dump_narrates_one_record_per_line_in_time_order(cli: Cli, tmp_path: Path) -> None:
    p = tmp_path / "d.lstrace"
    with lt.open(p):
        e = lt.event("dump", "e", "a test event")
        iv = lt.interval("dump", "iv")
        e(1)
        e.event(2, value=-7)
        e.event(3, payload=b"\xff\x00")
        iv.interval(lt.now(), 4)
    r = cli("trace", "dump", str(p))
    assert r.returncode == 0, r.stderr
    lines = [l for l in r.stdout.splitlines() if not l.startswith("#")]
    assert len(lines) == 4
    assert "dump/e  event  tag=1" in lines[0]
    assert "value=-7" in lines[1]
    assert "payload[2]=ff00" in lines[2]
    assert "dump/iv  interval  tag=4  dur=" in lines[3]


def test_dump_into_a_closed_pipe_is_not_an_error(tmp_path: Path) -> None:
    import subprocess

    from tests.conftest import BIN

    p = tmp_path / "big.lstrace"
    with lt.open(p):
        e = lt.event("pipe", "e")
        for i in range(100_000):
            e(i)
    r = subprocess.run(f"'{BIN}' trace dump '{p}' | head -3", shell=True, capture_output=True, text=True, timeout=60)
    assert "Traceback" not in r.stderr and "error" not in r.stderr.lower(), r.stderr
    assert len(r.stdout.splitlines()) == 3


def test_info_shows_entities_counts_span_and_losses(cli: Cli, tmp_path: Path) -> None:
    p = tmp_path / "i.lstrace"
    with lt.open(p):
        e = lt.event("info", "e", "described here")
        for i in range(10):
            e(i)
    r = cli("trace", "info", str(p))
    assert r.returncode == 0
    assert "info/e" in r.stdout and "described here" in r.stdout and " 10 " in r.stdout
    assert "lost      nothing" in r.stdout
    assert "span" in r.stdout and "clock" in r.stdout


def test_plumbing_commands_are_hidden_from_the_listing_but_keep_working(cli: Cli, beside: None) -> None:
    top = cli("--help").stdout
    assert "netem" not in top and "channel" not in top and "compare" in top and "advise" in top
    probes = cli("probe", "--help").stdout
    for hidden in ("pipe-source", "pipe-node", "pipe-sink", "sync-serve"):
        assert hidden not in probes
    assert "rr" in probes and "echo" in probes
    for args in (("netem", "--help"), ("channel", "hub", "--help"), ("probe", "pipe-sink", "--help"), ("probe", "sync", "--help")):
        assert cli(*args).returncode == 0, args


def test_dump_writes_csv_and_json_lines_with_payloads_as_hex(cli: Cli, tmp_path: Path) -> None:
    import csv
    import io
    import json

    p = tmp_path / "d.lstrace"
    with lt.open(p):
        e = lt.event("dump", "e", "a test event")
        e.event(1, value=-7)
        e.event(2, payload=b"\xff\x00")
    r = cli("trace", "dump", str(p), "--format", "csv")
    assert r.returncode == 0, r.stderr
    rows = list(csv.DictReader(io.StringIO(r.stdout)))
    assert [(x["name"], x["tag"], x["value"], x["payload"]) for x in rows] == [("e", "1", "-7", ""), ("e", "2", "", "ff00")]
    j = [json.loads(l) for l in cli("trace", "dump", str(p), "--format", "jsonl", "--entity", "dump/e").stdout.splitlines()]
    assert j[1]["payload"] == "ff00" and j[0]["value"] == -7 and j[0]["group"] == "dump"


def test_check_refuses_what_run_refuses_with_the_same_messages(cli: Cli, tmp_path: Path, beside: None) -> None:
    spec = tmp_path / "c.yaml"
    spec.write_text('name: x\nprobes: [{kind: timer, cpu: [999]}]\nloads: [{kind: command, command: "no-such-program-here --x"}]\nduration: 1s\n')
    c = cli("check", str(spec))
    r = cli("run", str(spec), "--run-dir", str(tmp_path / "r"))
    for x in (c, r):
        assert x.returncode == 2 and "Traceback" not in x.stderr, x.stderr
        assert (
            "c.yaml:2: probes.0.cpu: CPU 999 is not available" in x.stderr and "c.yaml:3: loads.0.command: 'no-such-program-here' is not installed" in x.stderr
        )
    assert c.stderr == r.stderr
    assert not (tmp_path / "r").exists()


def test_check_estimates_the_disk_and_memory_a_run_takes_from_its_length_and_rates(cli: Cli, tmp_path: Path) -> None:
    spec = tmp_path / "f.yaml"
    # 2 threads at 1 kHz for 10 s × 2 repetitions: 40,000 wake-ups of ~25 bytes = 1.0 MB of trace
    spec.write_text("name: f\nprobes: [{kind: timer, threads: 2, interval_us: 1000}]\nduration: 10s\nrepetitions: 2\n")
    r = cli("check", str(spec))
    assert r.returncode == 0, r.stderr
    assert "probe traces 1.0 MB" in r.stdout and "kernel capture 1.0 MB–14 MB" in r.stdout, r.stdout
    assert "kernel ring buffers" in r.stdout and "MiB per CPU" in r.stdout
    spec.write_text(spec.read_text() + "kernel: {capture: off}\n")
    r = cli("check", str(spec))
    assert "kernel capture 0.0 MB–0.0 MB" in r.stdout and "ring buffers" not in r.stdout, r.stdout


def test_a_program_probe_whose_program_does_not_exist_is_refused_before_anything_runs(cli: Cli, tmp_path: Path, beside: None) -> None:
    spec = tmp_path / "p.yaml"
    spec.write_text(
        "name: p\nprobes:\n  - kind: program\n    command: ./build/loop --rate 100\n  - kind: app\n    processes:\n      - {name: a, command: sh -c true}\n"
        "      - {name: b, command: no-such-ctl}\nduration: 1s\n"
    )
    for x in (cli("check", str(spec)), cli("run", str(spec), "--run-dir", str(tmp_path / "r"))):
        assert x.returncode == 2 and "Traceback" not in x.stderr, x.stderr
        assert f"p.yaml:4: probes.0.command: './build/loop' does not exist (relative to {tmp_path})" in x.stderr
        assert "p.yaml:8: probes.1.processes.1.command: 'no-such-ctl' does not exist (on PATH)" in x.stderr
        assert "processes.0" not in x.stderr
    assert not (tmp_path / "r").exists()
    (tmp_path / "build").mkdir()
    (tmp_path / "build" / "loop").write_text("#!/bin/sh\n")
    assert "probes.0.command" not in cli("check", str(spec)).stderr


def test_a_file_nested_thousands_of_levels_deep_is_an_input_error_not_a_traceback(cli: Cli, tmp_path: Path, beside: None) -> None:
    deep = tmp_path / "deep.yaml"
    deep.write_text("name: x\nprobes: " + "[" * 5000 + "]" * 5000 + "\n")
    for cmd in ("check", "run"):
        assert_clean_error(cli(cmd, str(deep)), 2, "nests", "too deeply")


def test_every_option_of_every_command_has_help_text() -> None:
    import click

    from loopscope.cli import cli as root
    from loopscope.cli import load_all

    load_all()

    def walk(cmd: click.Command, path: list[str]):  # type: ignore[no-untyped-def]
        if isinstance(cmd, click.Group):
            for n, c in cmd.commands.items():
                yield from walk(c, path + [n])
        else:
            for p in cmd.params:
                if isinstance(p, click.Option) and not p.hidden and not p.help:
                    yield f"{' '.join(path)} {p.opts[0]}"

    assert list(walk(root, [])) == []


def test_every_listed_command_s_help_ends_with_examples_that_parse() -> None:
    import shlex

    import click

    from loopscope.cli import cli as root
    from loopscope.cli import load_all

    load_all()

    def walk(cmd: click.Command, path: list[str], hidden: bool):  # type: ignore[no-untyped-def]
        if isinstance(cmd, click.Group):
            for n, c in cmd.commands.items():
                yield from walk(c, path + [n], hidden or cmd.hidden)
        elif not (hidden or cmd.hidden):
            yield path, cmd

    missing, broken = [], []
    for path, cmd in walk(root, [], False):
        text = cmd.help or ""
        if "Examples:" not in text:
            missing.append(" ".join(path))
            continue
        examples = [ln.strip() for ln in text.split("Examples:", 1)[1].splitlines() if ln.strip().startswith("loopscope ")]
        if not examples:
            missing.append(" ".join(path))
        for ex in examples:
            args = shlex.split(ex)[1:]
            cut = [i for i, a in enumerate(args) if a in (">", ">>", "&&", "|", ";")]
            args = args[: cut[0]] if cut else args  # the shell's part of the line
            try:
                # parse only (options, arguments, choices, types): nothing runs
                ctx = root.make_context("loopscope", list(args))
                sub: click.Command = root
                rest = list(args)
                while isinstance(sub, click.Group):
                    name, sub, rest = sub.resolve_command(ctx, rest)  # type: ignore[assignment]
                    assert sub is not None
                    ctx = sub.make_context(name or "", rest, parent=ctx)
            except (click.UsageError, click.BadParameter) as e:
                broken.append(f"{ex}: {e.format_message()}")
    assert missing == [] and broken == [], (missing, broken)


def test_the_timer_probe_takes_cyclictests_short_flags(cli: Cli, tmp_path: Path, beside: None) -> None:
    import json

    r = cli("probe", "timer", "-i", "500", "-d", "300ms", "-t", "2", "--json", "--trace", str(tmp_path / "t.lstrace"))
    assert r.returncode == 0, r.stderr
    j = json.loads(r.stdout)
    assert j["interval_ns"] == 500_000 and len(j["threads"]) == 2


def test_export_perfetto_takes_a_lone_trace_file(cli: Cli, tmp_path: Path) -> None:
    from perfetto.protos.perfetto.trace import perfetto_trace_pb2 as pb

    p = tmp_path / "app.lstrace"
    with lt.open(p):
        e = lt.event("app", "frame", "a frame arrived")
        iv = lt.interval("app", "work")
        for i in range(5):
            e(i)
            iv.interval(lt.now(), i)
    r = cli("export", "perfetto", str(p))
    assert r.returncode == 0, r.stderr
    assert "5 slices, 5 instants" in r.stdout
    t = pb.Trace.FromString((tmp_path / "app.perfetto-trace").read_bytes())
    names = {pk.track_event.name for pk in t.packet if pk.HasField("track_event")}
    assert {"app/work", "app/frame"} <= names
    assert_clean_error(cli("export", "perfetto", str(tmp_path / "app.perfetto-trace")), 2, "not a loopscope trace")


def test_each_command_is_registered_by_the_module_the_root_imports_for_it() -> None:
    import click

    from loopscope.cli import cli as root
    from loopscope.cli import load_all
    from loopscope.cli.base import COMMANDS, PROBE_COMMANDS

    load_all()

    def home(cmd: click.Command) -> str:
        f = cmd.callback
        assert f is not None
        return f.__module__

    assert {n: home(c) for n, c in root.commands.items()} == COMMANDS
    probe = root.commands["probe"]
    assert isinstance(probe, click.Group)
    assert {n: home(c) for n, c in probe.commands.items() if home(c) != "loopscope.cli.probe"} == PROBE_COMMANDS


def test_a_probe_command_imports_neither_the_report_nor_the_benches() -> None:
    import subprocess
    import sys

    code = (
        "import sys\nfrom loopscope.cli import main\ntry:\n    main(['probe', 'timer', '--help'])\nexcept SystemExit:\n    pass\n"
        "print(sorted(m for m in sys.modules if m.startswith(('loopscope.report', 'loopscope.bench', 'loopscope.cli.'))))"
    )
    r = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=60)
    loaded = r.stdout.strip().splitlines()[-1]
    assert "loopscope.report" not in loaded and "loopscope.bench" not in loaded, loaded
    assert "loopscope.cli.probe" in loaded and "loopscope.cli.lab" not in loaded, loaded
