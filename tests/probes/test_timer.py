"""The timer-latency probe, run for real."""

from __future__ import annotations

import json
import os
import signal
import subprocess
import time
from pathlib import Path

import polars as pl
import pytest

import loopscope.trace as lt
from loopscope.probes import timer
from loopscope.probes.params import TimerParams
from tests.conftest import BIN, Cli
from tests.helpers import assert_clean_error

KEYS = ["samples", "missed", "min_ns", "avg_ns", "p50_ns", "p99_ns", "p999_ns", "max_ns", "trace"]


def test_json_output_is_one_object_with_the_documented_keys(cli: Cli, tmp_path: Path, lab: None) -> None:
    r = cli("probe", "timer", "--interval-us", "1000", "--duration", "1s", "--json", "--trace", "t.lstrace")
    assert r.returncode == 0, r.stderr
    j = json.loads(r.stdout)
    assert list(j)[: len(KEYS)] == KEYS
    assert j["samples"] + j["missed"] in range(995, 1002)
    assert 0 <= j["min_ns"] <= j["p50_ns"] <= j["p99_ns"] <= j["p999_ns"] <= j["max_ns"]
    assert j["min_ns"] <= j["avg_ns"] <= j["max_ns"]
    lo, hi = j["ci95_ns"]["p50"]
    assert lo <= j["p50_ns"] <= hi
    assert j["overhead_ns"] > 0
    assert j["trace"] == "t.lstrace"


def test_every_wake_up_is_an_interval_in_the_trace(tmp_path: Path) -> None:
    p = tmp_path / "t.lstrace"
    res = timer.run(TimerParams(interval_us=500), 500_000_000, p)
    df = lt.read(p)
    wk = df.filter(pl.col("name") == "wakeup")
    assert len(wk) == res.samples
    # Each record starts at its deadline and lasts as long as the wake-up was late.
    assert sorted(wk["dur_ns"].to_list()) == sorted(max(0, int(x)) for x in res.latencies)
    starts = wk["t_ns"].to_numpy()
    gaps = (starts[1:] - starts[:-1]) % 500_000
    assert (gaps == 0).all()
    missed = df.filter(pl.col("name") == "missed")["value"].sum() or 0
    assert missed == res.missed


def test_missed_periods_are_counted_not_hidden() -> None:
    # A 2 µs period cannot be kept here (a wake-up costs tens of µs), so most
    # deadlines pass while the thread is still late for an earlier one.
    res = timer.run(TimerParams(interval_us=2), 200_000_000)
    assert res.missed > 0
    # Every deadline of the run is accounted for: measured or missed.
    assert abs((res.samples + res.missed) - 200_000_000 // 2_000) <= 2


def test_several_threads_pinned_to_cpus_are_reported_per_thread(tmp_path: Path) -> None:
    cpus = sorted(os.sched_getaffinity(0))
    res = timer.run(TimerParams(threads=2, cpu=cpus[:2]), 300_000_000, tmp_path / "t.lstrace")
    assert len(res.threads) == 2
    assert [t.cpu for t in res.threads] == [cpus[0], cpus[1 % len(cpus)]]
    assert all(t.affinity_ok for t in res.threads)
    assert res.samples == sum(t.wakeups for t in res.threads)
    df = lt.read(tmp_path / "t.lstrace").filter(pl.col("name") == "wakeup")
    assert sorted(df["tag"].unique().to_list()) == [0, 1]


@pytest.mark.needs_root
def test_sched_fifo_applies_when_privileged() -> None:
    res = timer.run(TimerParams(priority=50), 100_000_000)
    assert res.threads[0].sched_ok and res.threads[0].sched == "SCHED_FIFO 50"


@pytest.mark.parametrize(
    "args, needle",
    [
        (["--duration", "10"], "needs a unit"),
        (["--duration", "3 parsecs"], "unknown unit"),
        (["--duration", "soon"], "not a duration"),
        (["--interval-us", "0"], "--interval-us"),
        (["--threads", "0"], "1<=x<=1024"),
        (["--cpu", "4096"], "cpu: CPU 4096 is not available"),
        (["--cpu", "x"], "not a CPU list"),
        (["--priority", "150"], "1<=x<=99"),
        (["--bogus"], "No such option"),
    ],
)
def test_bad_options_get_one_line_and_exit_2(cli: Cli, args: list[str], needle: str, beside: None) -> None:
    assert_clean_error(cli("probe", "timer", *args), 2, needle)


def test_a_refused_probe_leaves_no_run_directory(cli: Cli, tmp_path: Path, beside: None) -> None:
    assert_clean_error(cli("probe", "timer", "--cpu", "4096", "--duration", "100ms"), 2, "cpu: CPU 4096 is not available")
    assert not (tmp_path / "runs").exists()
    r = cli("probe", "timer", "--duration", "50ms")
    assert r.returncode == 0, r.stderr
    assert [p.name for p in (tmp_path / "runs").glob("*/*")] == ["timer.lstrace"]


def test_an_unwritable_trace_path_is_an_input_error(cli: Cli, beside: None) -> None:
    r = cli("probe", "timer", "--duration", "100ms", "--trace", "/nonexistent/dir/t.lstrace")
    assert_clean_error(r, 2, "/nonexistent/dir/t.lstrace: cannot create the trace file")


def test_ctrl_c_stops_the_probe_keeps_what_was_measured_and_leaves_nothing_running(tmp_path: Path, lab: None) -> None:
    with subprocess.Popen(
        [str(BIN), "probe", "timer", "--duration", "60s", "--json", "--trace", "t.lstrace"],
        cwd=tmp_path,
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
    ) as p:
        time.sleep(2.0)
        p.send_signal(signal.SIGINT)
        out, err = p.communicate(timeout=30)
    assert p.returncode == 130, err
    j = json.loads(out)
    assert j["interrupted"] is True and 500 < j["samples"] < 10_000
    assert lt.info(tmp_path / "t.lstrace").stats["closed"]
    # No thread of the probe survives: the process is gone with all its threads.
    assert not Path(f"/proc/{p.pid}").exists()


def test_the_human_summary_ends_with_the_trace_path(cli: Cli, tmp_path: Path, beside: None) -> None:
    r = cli("probe", "timer", "--interval-us", "2000", "--duration", "300ms")
    assert r.returncode == 0, r.stderr
    last = r.stdout.strip().splitlines()[-1]
    assert last.startswith("runs/") and last.endswith("/timer.lstrace")
    assert (tmp_path / last).exists()
    for word in ("samples", "missed", "p99.9", "95% CI", "probe overhead"):
        assert word in r.stdout


@pytest.mark.needs_root
def test_dma_latency_is_held_for_the_run_and_released_after(tmp_path: Path) -> None:
    res = timer.run(TimerParams(dma_latency_us=0), 200_000_000)
    assert res.dma_latency_ok and "held at 0" in res.dma_latency
    # The request ends with the run: this process no longer holds the device open.
    held = [f for f in os.listdir("/proc/self/fd") if _target(f"/proc/self/fd/{f}") == "/dev/cpu_dma_latency"]
    assert held == []


def _target(p: str) -> str:
    try:
        return os.readlink(p)
    except OSError:
        return ""


def test_a_lab_probes_trace_writer_runs_at_sched_idle_so_any_woken_thread_takes_its_cpu(tmp_path: Path, lab: None) -> None:
    p = subprocess.Popen(
        [str(BIN), "probe", "timer", "--duration", "5s", "--trace", str(tmp_path / "t.lstrace")], stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL
    )
    try:
        writer = None
        for _ in range(100):
            tasks = Path(f"/proc/{p.pid}/task")
            writer = next((int(t.name) for t in tasks.iterdir() if (t / "comm").read_text().strip() == "loopscope-wr"), None) if tasks.exists() else None
            if writer:
                break
            time.sleep(0.05)
        assert writer is not None, "no trace writer thread appeared"
        assert os.sched_getscheduler(writer) == os.SCHED_IDLE
    finally:
        p.send_signal(signal.SIGINT)
        p.wait(timeout=10)


def _tasks_by_name(pid: int, names: set[str], timeout_s: float = 5.0) -> dict[str, int]:
    """The probe's threads named ``names``, by name, once they all exist."""
    deadline = time.monotonic() + timeout_s
    found: dict[str, int] = {}
    while time.monotonic() < deadline and set(found) != names:
        tasks = Path(f"/proc/{pid}/task")
        for t in tasks.iterdir() if tasks.exists() else []:
            try:
                name = (t / "comm").read_text().strip()
            except OSError:
                continue
            if name in names:
                found[name] = int(t.name)
        time.sleep(0.05)
    return found


@pytest.mark.skipif((os.cpu_count() or 1) < 2, reason="needs 2 CPUs: one measured, one for the writer")
def test_only_the_trace_writer_keeps_off_the_measured_cpu_so_set_up_and_results_are_never_left_to_a_hog(tmp_path: Path, lab: None) -> None:
    # (a 0.5 s probe beside a nice -20 hog on the other CPU took 4 s while its main thread was kept there too)
    p = subprocess.Popen(
        [str(BIN), "probe", "timer", "--duration", "5s", "--cpu", "1", "--trace", str(tmp_path / "t.lstrace")],
        stdout=subprocess.DEVNULL,
        stderr=subprocess.DEVNULL,
    )
    try:
        t = _tasks_by_name(p.pid, {"loopscope-wr", "ls-timer-main", "ls-timer-0"})
        assert set(t) == {"loopscope-wr", "ls-timer-main", "ls-timer-0"}, t
        every = os.sched_getaffinity(0)
        assert 1 not in os.sched_getaffinity(t["loopscope-wr"])
        assert os.sched_getaffinity(p.pid) == every and os.sched_getaffinity(t["ls-timer-main"]) == every
        assert os.sched_getaffinity(t["ls-timer-0"]) == {1}
    finally:
        p.send_signal(signal.SIGINT)
        p.wait(timeout=10)
