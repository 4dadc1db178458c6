"""Node calibration, app models and predictions between them (Carlinet et al. 2000)."""

from __future__ import annotations

import json
import sys
from pathlib import Path
from typing import Any

from loopscope.model.app import AppModel

import numpy as np
import pytest

from tests.conftest import Cli

BUSY = "import os\ns = 0\nfor i in range(400000):\n    s += i * i\n    if i % 1000 == 0:\n        os.getpid(); os.stat('/')\n"


@pytest.fixture(scope="module")
def node_model(tmp_path_factory: pytest.TempPathFactory) -> Path:
    from loopscope.model import node

    m = node.calibrate(["cpu"], calls=["getpid", "read", "read:4096", "stat"], max_seconds_per_call=0.5, env_seconds=0.5)
    p = tmp_path_factory.mktemp("node") / "node.json"
    p.write_text(m.model_dump_json(exclude_unset=True))
    return p


def test_a_node_model_gives_every_cost_an_interval_and_every_load_its_change(node_model: Path) -> None:
    m = json.loads(node_model.read_text())
    assert m["format"] == "loopscope-node-model" and m["version"] == 1
    assert set(m["conditions"]) == {"idle", "cpu-1"}
    for cond in m["conditions"].values():
        assert set(cond["syscalls"]) == {"getpid", "read", "read:4096", "stat"}
        # (whether a page costs more than a byte is a timing, measured by bench model,
        # not asserted: on this VM the two medians came out 566 and 595 ns in one CI run)
        for c in [*cond["syscalls"].values(), *cond["environments"].values()]:
            assert c["mean_ns"] > 0 and 0 <= c["ci95_half_ns"] < c["mean_ns"] and len(c["batch_ns"]) == c["batches"]
        assert set(cond["environments"]) == {"cpython", "compiled"}
        # interpreted code costs more per operation than compiled code
        assert cond["environments"]["cpython"]["mean_ns"] > 3 * cond["environments"]["compiled"]["mean_ns"]
    ch = m["changes"]["cpu-1"]["syscalls"]["getpid"]
    assert ch["ci95"][0] <= ch["ratio"] <= ch["ci95"][1] and isinstance(ch["significant"], bool)


@pytest.mark.needs_root
def test_an_app_model_holds_each_runs_cpu_time_and_the_calls_seen_by_the_kernel(cli: Cli, tmp_path: Path, node_model: Path, lab: None) -> None:
    (tmp_path / "busy.py").write_text(BUSY)
    r = cli("calibrate", "app", "--runs", "4", "--traced-runs", "1", "--node", str(node_model), "-o", "app.json", "--", sys.executable, "busy.py", timeout=300)
    assert r.returncode == 0, r.stderr
    m = json.loads((tmp_path / "app.json").read_text())
    assert m["environment"] == "cpython" and len(m["runs"]["user_ns"]) == 4
    assert m["cpu"]["total"]["mean_ns"] >= m["cpu"]["user"]["mean_ns"] > 0
    st = m["syscalls"]["states"]
    # 400 getpid and 400 stat calls of its loop, seen by the tracer
    assert st["getpid"]["per_run"] >= 400 and any(k in st for k in ("newfstatat", "stat", "statx"))
    for s in st.values():
        if s["next"]:
            assert abs(sum(s["next"].values()) - 1) < 1e-9
    # carried to the same node and condition, the prediction is what was measured
    r = cli("model", "predict", "app.json", "--from", str(node_model), "--to", str(node_model), "--json")
    assert r.returncode == 0, r.stderr
    p = json.loads(r.stdout)
    assert p["pred_mean_ns"] == pytest.approx(m["cpu"]["total"]["mean_ns"], rel=1e-9)
    # to the loaded condition: the ratios used are stated with intervals, and what the model cannot see
    r = cli("model", "predict", "app.json", "--from", str(node_model), "--to", f"{node_model}:cpu-1")
    assert r.returncode == 0 and "user (" in r.stdout and "not seen:" in r.stdout
    # both files print as tables: the app's calls, the node's costs per condition
    r = cli("model", "show", "app.json")
    assert r.returncode == 0 and "calls per run" in r.stdout and "getpid" in r.stdout
    r = cli("model", "show", str(node_model))
    assert r.returncode == 0 and "env cpython" in r.stdout and "cpu-1" in r.stdout
    (tmp_path / "x.json").write_text("{}")
    r = cli("model", "show", "x.json")
    assert r.returncode == 2 and "not a node or app model" in r.stderr


def test_a_failing_program_is_a_failed_calibration_naming_the_run(cli: Cli, lab: None) -> None:
    r = cli("calibrate", "app", "--runs", "3", "--traced-runs", "0", "-o", "a.json", "--", "sh", "-c", "echo broken >&2; exit 3")
    assert r.returncode == 1 and "run 1 of 3" in r.stderr and "exit code 3" in r.stderr and "broken" in r.stderr and "Traceback" not in r.stderr


def test_a_program_too_short_to_measure_is_bad_input(cli: Cli, beside: None) -> None:
    r = cli("calibrate", "app", "--runs", "3", "--traced-runs", "0", "-o", "a.json", "--", "true")
    assert r.returncode == 2 and "too little to measure" in r.stderr


MINIMAL_APP = {"format": "loopscope-app-model", "version": 1, "environment": "compiled", "runs": {"user_ns": [1e6, 1e6], "sys_ns": [1e5, 1e5]}}


def test_an_app_model_missing_a_part_is_an_input_error_naming_it(cli: Cli, tmp_path: Path, node_model: Path) -> None:
    (tmp_path / "app.json").write_text(json.dumps({"format": "loopscope-app-model", "version": 1}))
    r = cli("model", "predict", "app.json", "--from", str(node_model), "--to", str(node_model))
    assert r.returncode == 2 and "app.json: environment" in r.stderr and "calibrate app" in r.stderr and "Traceback" not in r.stderr


def test_a_node_model_of_another_version_is_refused(cli: Cli, tmp_path: Path, node_model: Path) -> None:
    m = json.loads(node_model.read_text())
    m["version"] = 99
    (tmp_path / "old.json").write_text(json.dumps(m))
    (tmp_path / "app.json").write_text(json.dumps(MINIMAL_APP))
    r = cli("model", "predict", "app.json", "--from", "old.json", "--to", str(node_model))
    assert r.returncode == 2 and "old.json" in r.stderr and "version 99" in r.stderr and "calibrate the node again" in r.stderr


def test_an_unknown_condition_names_the_ones_the_model_has(cli: Cli, tmp_path: Path, node_model: Path) -> None:
    (tmp_path / "app.json").write_text(json.dumps(MINIMAL_APP))
    r = cli("model", "predict", "app.json", "--from", str(node_model), "--to", f"{node_model}:memory-3")
    assert r.returncode == 2 and "memory-3" in r.stderr and "idle, cpu-1" in r.stderr


def _cond(read: float, getpid: float, env: float, compiled: float) -> Any:
    from loopscope.model.node import Condition

    b = lambda v: {"mean_ns": v, "batch_ns": [v * 0.99, v, v * 1.01]}  # noqa: E731
    return Condition.model_validate({"syscalls": {"read": b(read), "getpid": b(getpid)}, "environments": {"cpython": b(env), "compiled": b(compiled)}})


def test_system_time_scales_the_minimal_calls_by_the_node_and_their_argument_work_like_memory() -> None:
    from loopscope.model.predict import predict

    # per run: 900 reads of 3 µs (the node's minimal read: 1 µs), 100 getpids,
    # 10 futex calls the node model does not measure; half the system time
    # is outside any call (exec, page faults)
    app = {
        "environment": "cpython",
        "runs": {"user_ns": [60e6, 62e6], "sys_ns": [5.33e6, 5.53e6]},
        "syscalls": {
            "states": {
                "pread64": {"per_run": 900.0, "dur_mean_ns": 3000.0},
                "getpid": {"per_run": 100.0, "dur_mean_ns": 100.0},
                "futex": {"per_run": 10.0, "dur_mean_ns": 500.0},
            }
        },
    }
    p = predict(AppModel.model_validate(app), _cond(1000, 100, 20, 2), _cond(2000, 100, 30, 3))
    fixed_a, fixed_b, extra, unmod = 900 * 1000 + 100 * 100, 900 * 2000 + 100 * 100, 900 * 2000, 10 * 500
    traced = fixed_a + extra + unmod
    share = traced / 5.43e6
    calls_b = fixed_b + extra * 1.5 + unmod * fixed_b / fixed_a
    assert p["sys_ratio"]["ratio"] == pytest.approx(share * calls_b / traced + (1 - share) * 1.5)
    assert p["sys_ratio"]["unmodelled_share"] == pytest.approx(10 / 1010)
    assert p["sys_ratio"]["ci95"][0] <= p["sys_ratio"]["ratio"] <= p["sys_ratio"]["ci95"][1]
    assert p["user_ratio"]["ratio"] == pytest.approx(1.5)
    want = np.mean([60e6 * 1.5 + 5.33e6 * p["sys_ratio"]["ratio"], 62e6 * 1.5 + 5.43e6 * 0 + 5.53e6 * p["sys_ratio"]["ratio"]])
    assert p["pred_mean_ns"] == pytest.approx(want)


def test_calls_that_move_data_are_priced_on_the_nodes_cost_by_size_curve() -> None:
    from loopscope.model.predict import sys_ratio

    def node(scale: float) -> Any:
        from loopscope.model.node import Cost

        c = _cond(300 * scale, 100, 20, 2)
        b = lambda v: Cost(mean_ns=v, batch_ns=[v, v, v])  # noqa: E731
        c.syscalls.update({"read:4096": b(1300 * scale), "read:65536": b(16300 * scale)})
        return c

    # half the reads 4 KiB, half 128 KiB (beyond the largest size: the last slope);
    # their traced on-CPU time is exactly what the node's curve says, so there is no argument work left
    at_4k, at_128k = 1300.0, 16300.0 + (131072 - 65536) * (15000 / 61440)
    per_read = 0.5 * at_4k + 0.5 * at_128k
    app = {
        "environment": "compiled",
        "runs": {"user_ns": [1e6, 1e6], "sys_ns": [100 * per_read] * 2},
        "syscalls": {"states": {"read": {"per_run": 100.0, "dur_mean_ns": per_read, "bytes_classes": [[4096.0, 0.5], [131072.0, 0.5]]}}},
    }
    r = sys_ratio(AppModel.model_validate(app), node(1.0), node(2.0))
    assert r["ratio"] == pytest.approx(2.0) and r["priced_by_size_share"] == 1.0
    assert r["fixed_share_of_calls"] == pytest.approx(1.0) and r["argument_share_of_calls"] == pytest.approx(0.0)
    # a node without sizes prices the same reads at its minimal read and scales the rest like memory-bound work
    bare = sys_ratio(AppModel.model_validate(app), _cond(300, 100, 20, 2), _cond(600, 100, 20, 2))
    assert bare["priced_by_size_share"] == 0.0 and bare["ratio"] < 1.1


def test_the_bytes_each_data_call_moved_come_from_its_return_value() -> None:
    from loopscope.model.app import parse_ftrace, structure

    lines = "".join(
        f"  dd-7 [001] ..... 100.{t:06d}: sys_enter: NR 0 (0, 1, 4096, 0, 0, 0)\n  dd-7 [001] ..... 100.{t + 2:06d}: sys_exit: NR 0 = {ret}\n"
        for t, ret in ((10, 4096), (20, 4096), (30, 4096), (40, 100), (50, -11))
    )
    st = structure([parse_ftrace(lines, {0: "read"})])["states"]["read"]
    assert st["bytes_mean"] == pytest.approx((3 * 4096 + 100) / 5)
    # a failed call moved nothing; classes are powers of two with their mean size
    assert st["bytes_classes"] == [[0.0, 0.2], [100.0, 0.2], [4096.0, 0.6]]


def test_a_size_where_a_call_takes_none_is_refused_before_anything_runs(cli: Cli, beside: None) -> None:
    r = cli("calibrate", "node", "--calls", "getpid:64", "-o", "n.json")
    assert r.returncode == 2 and "getpid takes no size" in r.stderr and "Traceback" not in r.stderr
    r = cli("calibrate", "node", "--sizes", "4KiB,lots", "-o", "n.json")
    assert r.returncode == 2 and "'lots' is not a size" in r.stderr


def test_batches_of_one_slice_count_as_one_sample_of_the_machine() -> None:
    from loopscope.model.node import ratio_ci, summ_slices

    # ten slices of twenty batches each: the batches of a slice agree, the slices do not
    rng = np.random.default_rng(3)
    levels = rng.normal(100.0, 10.0, 10)
    sliced = summ_slices([[float(v)] * 20 for v in levels])
    assert sliced.slices == [20] * 10 and sliced.batches == 200
    pooled = sliced.model_copy(update={"slices": None})  # the same batches taken as independent
    _, lo_s, hi_s = ratio_ci(sliced, sliced)
    _, lo_p, hi_p = ratio_ci(pooled, pooled)
    # resampling whole slices shows the slices' spread; resampling batches hides most of it
    assert hi_s - lo_s > 2 * (hi_p - lo_p)


def test_without_a_call_structure_system_time_scales_like_all_the_calls_alike() -> None:
    from loopscope.model.predict import predict

    app = {"environment": "compiled", "runs": {"user_ns": [1e6, 1e6], "sys_ns": [30e6, 30e6]}, "syscalls": {"states": {}}}
    p = predict(AppModel.model_validate(app), _cond(1000, 100, 20, 2), _cond(2000, 100, 30, 2))
    assert p["sys_ratio"]["ratio"] == pytest.approx(2100 / 1100)
    assert p["user_ratio"]["ratio"] == pytest.approx(1.0)


def test_a_program_that_leaves_children_running_is_refused_and_they_are_killed(cli: Cli, tmp_path: Path, lab: None) -> None:
    import time

    r = cli("calibrate", "app", "--runs", "2", "--traced-runs", "0", "-o", "a.json", "--", "sh", "-c", "sleep 300 & echo $! > child.pid; exit 0")
    assert r.returncode == 2 and "left 1 process" in r.stderr and "wait4" in r.stderr
    pid = int((tmp_path / "child.pid").read_text())
    deadline = time.monotonic() + 5
    while Path(f"/proc/{pid}").exists() and b"sleep" in Path(f"/proc/{pid}/cmdline").read_bytes() and time.monotonic() < deadline:
        time.sleep(0.05)
    assert not (Path(f"/proc/{pid}").exists() and b"sleep" in Path(f"/proc/{pid}/cmdline").read_bytes())


@pytest.mark.needs_root
def test_the_commands_calibrate_a_node_and_an_app_then_check_the_prediction_here(cli: Cli, tmp_path: Path, lab: None) -> None:
    r = cli("calibrate", "node", "--calls", "getpid,stat", "--loads", "cpu", "--max-seconds-per-call", "0.2", "--cpu", "0", "-o", "node.json", timeout=300)
    assert r.returncode == 0, r.stderr
    assert "idle: 2 calls" in r.stdout and "cpu-1: 2 calls" in r.stdout and "node model: node.json" in r.stdout
    m = json.loads((tmp_path / "node.json").read_text())
    assert m["placement"] == {"cpus": [0], "load_cpus": None}
    (tmp_path / "busy.py").write_text(BUSY)
    r = cli(
        "calibrate",
        "app",
        "--runs",
        "3",
        "--traced-runs",
        "1",
        "--node",
        "node.json",
        "--cpu",
        "0",
        "-o",
        "app.json",
        "--",
        sys.executable,
        "busy.py",
        timeout=300,
    )
    assert r.returncode == 0, r.stderr
    # --from defaults to the node the app model names; check runs it again and compares
    r = cli("model", "check", "app.json", "--to", "node.json", "--runs", "3", "--json", timeout=300)
    assert r.returncode == 0, r.stderr
    c = json.loads(r.stdout)
    assert c["from"].endswith("node.json:idle") and c["meas_mean_ns"] > 0
    assert c["err_mean_pct"] == pytest.approx(100 * (c["pred_mean_ns"] / c["meas_mean_ns"] - 1))


def test_bad_load_names_are_refused_before_anything_runs(cli: Cli, beside: None) -> None:
    r = cli("calibrate", "node", "--loads", "disk", "-o", "n.json")
    assert r.returncode == 2 and "unknown load kind 'disk'" in r.stderr and "cpu, memory, io" in r.stderr


def test_a_call_switched_out_counts_only_its_time_on_the_cpu() -> None:
    from loopscope.model.app import parse_ftrace

    sys_lines = (
        "  python-42 [001] ..... 100.000010: sys_enter: NR 230 (1, 1, 0, 0, 0, 0)\n"
        "  python-42 [001] d..2. 100.000015: sched_switch: prev_comm=python prev_pid=42 prev_prio=120 prev_state=S ==> next_comm=swapper/1 next_pid=0 next_prio=120\n"
        "  python-42 [001] ..... 100.002025: sys_exit: NR 230 = 0\n"
        "  python-42 [001] ..... 100.002030: sys_enter: NR 39 (0, 0, 0, 0, 0, 0)\n"
        "  python-42 [001] ..... 100.002031: sys_exit: NR 39 = 42\n"
    )
    # the switch back in is only in the unfiltered instance
    sched = (
        "  python-42 [001] d..2. 100.000015: sched_switch: prev_comm=python prev_pid=42 prev_prio=120 prev_state=S ==> next_comm=swapper/1 next_pid=0 next_prio=120\n"
        "  <idle>-0 [001] d..2. 100.002020: sched_switch: prev_comm=swapper/1 prev_pid=0 prev_prio=120 prev_state=R ==> next_comm=python next_pid=42 next_prio=120\n"
    )
    got = parse_ftrace(sys_lines, {230: "clock_nanosleep", 39: "getpid"}, sched)
    calls = got["threads"][42]
    assert [c[0] for c in calls] == ["clock_nanosleep", "getpid"]
    # 2015 µs in the call, 2005 µs of it switched out: 10 µs on the CPU
    assert calls[0][2] == pytest.approx(0.010, abs=1e-9) and calls[1][2] == pytest.approx(0.001, abs=1e-9)
    assert got["calls_switched_out"] == 1
