"""A probe's parameters are declared once: the model in probes/params.py is
what the experiment file, the standalone command, the agent's launch and the
native binding all take, and these tests tie them together."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import pytest

from loopscope import _native
from loopscope.kinds import KINDS
from loopscope.probes.params import SYSCALLS, Launch, Params, ProgramParams, RrParams, SchedParams, SyscallParams, TimerParams
from tests.conftest import Cli
from tests.helpers import assert_clean_error

NATIVE = [
    (TimerParams(interval_us=250, threads=2, cpu=[0, 1], priority=7, dma_latency_us=3, mlock=False), _native.timer_params),
    (SchedParams(busy_threads=3, sleep_us=1500, work_us=700, cpu=[1]), _native.sched_params),
    (SyscallParams(calls=["getpid", "read:4096"], batch=50, target_pct=2.5, max_batches=30, max_seconds_per_call=0.5, dir="/tmp"), _native.syscall_params),
]


@pytest.mark.parametrize("params, read", NATIVE, ids=lambda v: type(v).__name__ if isinstance(v, Params) else "")
def test_the_binding_reads_every_field_of_a_native_probes_parameter_model(params: Params, read: object) -> None:
    assert read(params) == params.model_dump()  # type: ignore[operator]


def test_the_calls_the_syscall_model_offers_are_the_ones_the_native_probe_times() -> None:
    assert SYSCALLS == list(_native.syscall_names())


@pytest.mark.parametrize("kind", ["timer", "sched", "syscall"])
def test_a_kinds_experiment_model_takes_its_probes_parameters_with_the_same_bounds(kind: str) -> None:
    k = KINDS[kind]
    assert k.params is not None and issubclass(k.model, k.params)
    assert k.model.model_json_schema()["properties"].items() >= {n: v for n, v in k.params.model_json_schema()["properties"].items()}.items()


def test_the_timer_commands_options_are_its_models_fields_with_their_help(cli: Cli, beside: None) -> None:
    out = cli("probe", "timer", "--help").stdout
    for name, f in TimerParams.model_fields.items():
        assert "--" + name.replace("_", "-") in out, name
    assert "--dma-latency-us" in out and "cyclictest" in out  # the default that changes the number against the peer is said


def test_a_bound_declared_in_the_model_refuses_the_option_naming_it(cli: Cli, beside: None) -> None:
    assert_clean_error(cli("probe", "timer", "--priority", "100"), 2, "--priority")
    assert_clean_error(cli("probe", "sched", "--busy-threads", "65"), 2, "--busy-threads")


def test_an_agent_starts_a_probe_from_its_typed_parameters_as_one_launch(cli: Cli, tmp_path: Path, lab: None) -> None:
    spec = {"kind": "timer", "name": "t", "interval_us": 500, "dma_latency_us": 0, "cpu": [0], "duration": None, "host": None}
    argv = KINDS["timer"].argv(spec, 200_000_000, tmp_path / "t.lstrace", tmp_path)
    assert argv[:3] == [sys.executable, "-m", "loopscope.probes.launch"] and len(argv) == 4
    lc = Launch.model_validate_json(argv[-1])
    assert TimerParams.model_validate(lc.params) == TimerParams(interval_us=500, dma_latency_us=0, cpu=[0])
    assert lc.duration_ns == 200_000_000 and lc.trace == str(tmp_path / "t.lstrace")
    r = subprocess.run(argv, capture_output=True, text=True, timeout=60)
    assert r.returncode == 0, r.stderr
    j = json.loads(r.stdout)
    assert j["samples"] >= 300 and j["interval_ns"] == 500_000 and "held at 0" in j["dma_latency"]
    assert (tmp_path / "t.lstrace").exists()
    # `loopscope probe launch` is the same, through the command line
    r = cli("probe", "launch", argv[-1])
    assert r.returncode == 0 and json.loads(r.stdout)["samples"] >= 300, r.stderr


def test_the_sched_calibration_travels_apart_from_its_parameters(tmp_path: Path) -> None:
    spec = {"kind": "sched", "name": "s", "busy_threads": 1, "work_iters": 1234, "alone_ns": 5678}
    lc = Launch.model_validate_json(KINDS["sched"].argv(spec, 10**9, tmp_path / "s.lstrace", tmp_path)[-1])
    assert lc.params == SchedParams(busy_threads=1).model_dump() and lc.calibration == {"work_iters": 1234, "alone_ns": 5678}


def test_a_launch_out_of_its_models_bounds_is_refused_naming_the_field(cli: Cli, tmp_path: Path, beside: None) -> None:
    bad = Launch(kind="timer", params={"interval_us": 0}, duration_ns=10**8, scratch=str(tmp_path)).model_dump_json()
    assert_clean_error(cli("probe", "launch", bad), 2, "timer.interval_us")


@pytest.mark.parametrize("model", [TimerParams, SchedParams, SyscallParams, RrParams, ProgramParams], ids=lambda m: m.__name__)
def test_every_parameter_is_documented_with_the_experiment_files_fields(model: type[Params]) -> None:
    doc = (Path(__file__).resolve().parents[2] / "docs" / "experiments.md").read_text()
    for name in model.model_fields:
        assert f"| `{name}` |" in doc, name


def test_an_rr_probe_naming_a_host_launches_its_client_with_the_servers_address(tmp_path: Path) -> None:
    spec = {"kind": "rr", "name": "r", "dest": "10.0.0.2:47300", "rate": "500pps", "transport": "tcp", "size": 100, "port": 47300, "host": "a"}
    lc = Launch.model_validate_json(KINDS["rr"].argv(spec, 10**9, tmp_path / "r.lstrace", tmp_path)[-1])
    assert RrParams.model_validate(lc.params) == RrParams(dest="10.0.0.2:47300", rate="500pps", transport="tcp", size=100)


def test_the_rr_experiment_field_dest_takes_a_host_name_the_launch_does_not() -> None:
    from loopscope.kinds.rr import RrProbe

    assert RrProbe(kind="rr", dest="server").server_host == "server"
    with pytest.raises(ValueError, match="HOST:PORT"):
        RrParams(dest="server")


def test_a_program_probe_is_launched_with_its_command_as_a_list_and_runs(cli: Cli, tmp_path: Path, lab: None) -> None:
    prog = "from loopscope.trace import api\ns = api.open()\napi.interval('work', 'step').interval(api.now(), 7)\ns.close()\n"
    spec = {
        "kind": "program",
        "name": "p",
        "command": ["python3", "-c", prog],
        "until": "exit",
        "env": {"A_B": "1 2"},
        "cwd": str(tmp_path),
        "timeout": "30s",
        "attribute": ["*"],
        "wakeup": [],
        "duration": None,
        "host": None,
    }
    argv = KINDS["program"].argv(spec, 30 * 10**9, tmp_path / "p.lstrace", tmp_path)
    lc = Launch.model_validate_json(argv[-1])
    assert ProgramParams.model_validate(lc.params) == ProgramParams(command=["python3", "-c", prog], until="exit", env={"A_B": "1 2"}, cwd=str(tmp_path))
    r = cli("probe", "launch", argv[-1])
    assert r.returncode == 0, r.stderr
    j = json.loads(r.stdout)
    assert [iv["entity"] for iv in j["intervals"]] == ["work/step"]
