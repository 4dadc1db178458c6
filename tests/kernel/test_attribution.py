"""Kernel events: perf's text (runs recorded before the tracefs capture)
parsed into columns, and an outlier's window split into causes, first on
hand-made events with a known answer, then on a real run with an injected
disturbance."""

from __future__ import annotations

import json
import subprocess
import sys
import typing
from dataclasses import replace
from pathlib import Path

import numpy as np
import polars as pl
import pytest

from loopscope import _native
from loopscope.analysis import attribution as A
from loopscope.errors import InputError
from loopscope.kernel import perfdata as K
from tests.conftest import BIN

TEXT = """\
    700 [001] 100.000000000:   sched:sched_stat_runtime: comm=ls-burst pid=700 runtime=2000000 [ns]
    700 [001] 100.000100000:         sched:sched_wakeup: comm=ls-timer-0 pid=42 prio=120 target_cpu=001
    700 [001] 100.003000000:   sched:sched_stat_runtime: comm=ls-burst pid=700 runtime=3000000 [ns]
    700 [001] 100.003000000:         sched:sched_switch: prev_comm=ls-burst prev_pid=700 prev_prio=79 prev_state=S ==> next_comm=ls-timer-0 next_pid=42 next_prio=120
    42 [001] 100.003010000:   irq_vectors:local_timer_entry: vector=236
    42 [001] 100.003012000:    irq_vectors:local_timer_exit: vector=236
    42 [001] 100.003050000:   sched:sched_stat_runtime: comm=ls-timer-0 pid=42 runtime=50000 [ns]
    42 [001] 100.003050000:         sched:sched_switch: prev_comm=ls-timer-0 prev_pid=42 prev_prio=120 prev_state=S ==> next_comm=swapper/1 next_pid=0 next_prio=120
    55 [000] 100.001000000:      irq:softirq_entry: vec=3 [action=NET_RX]
    55 [000] 100.001005000:       irq:softirq_exit: vec=3 [action=NET_RX]
"""


def test_perf_text_becomes_typed_columns() -> None:
    df = K.parse(TEXT)
    assert len(df) == 10
    sw = df.filter(pl.col("event") == "sched_switch").row(0, named=True)
    assert (
        sw["t_ns"] == 100_003_000_000
        and sw["cpu"] == 1
        and sw["target"] == 700
        and sw["next_pid"] == 42
        and sw["next_comm"] == "ls-timer-0"
        and sw["prev_state"] == "S"
    )
    rt = df.filter(pl.col("event") == "sched_stat_runtime")["runtime"].to_list()
    assert rt == [2_000_000, 3_000_000, 50_000]
    # task names come from the events themselves; the current task is the tid
    assert df.filter(pl.col("event") == "sched_switch").row(0, named=True)["target_comm"] == "ls-burst"
    assert df.filter(pl.col("event") == "softirq_entry").row(0, named=True)["tid"] == 55
    assert df.filter(pl.col("event") == "softirq_entry")["name"][0] == "NET_RX"
    assert df.filter(pl.col("event") == "sched_wakeup").row(0, named=True)["target"] == 42


def test_a_thread_kept_off_its_cpu_by_another_names_that_thread() -> None:
    k = A.Kernel.of(K.parse(TEXT), 0)
    # the timer was due at 100.000050 and ran at 100.003030
    r = A.attribute(k, 42, 100_000_050_000, 100_003_030_000)
    c = r["causes"]
    assert r["complete"] and r["cpu"] == 1
    assert c["thread: ls-burst"] == 100_003_000_000 - 100_000_050_000
    assert c["timer interrupt"] == 2_000
    assert c["return to user space"] == 28_000
    assert sum(c.values()) == 100_003_030_000 - 100_000_050_000


def test_idle_time_before_the_wake_up_is_the_wake_up_coming_late() -> None:
    text = """\
    42 [001] 100.005000000:   sched:sched_stat_runtime: comm=ls-timer-0 pid=42 runtime=10000 [ns]
    42 [001] 100.005000000:         sched:sched_switch: prev_comm=ls-timer-0 prev_pid=42 prev_prio=120 prev_state=S ==> next_comm=swapper/1 next_pid=0 next_prio=120
    0 [001] 100.000000000:         sched:sched_switch: prev_comm=x prev_pid=9 prev_prio=120 prev_state=S ==> next_comm=swapper/1 next_pid=0 next_prio=120
"""
    k = A.Kernel.of(K.parse(text), 0)
    r = A.attribute(k, 42, 100_004_000_000, 100_004_995_000)
    # It ran from 100.004990 (its runtime says so, though no switch-in was recorded); before, the CPU idled.
    assert r["causes"] == {"CPU idle": 990_000, "return to user space": 5_000}


def test_lost_events_make_every_window_incomplete() -> None:
    k = A.Kernel.of(K.parse(TEXT), 12)
    assert not A.attribute(k, 42, 100_000_050_000, 100_003_030_000)["complete"]


def test_a_window_whose_switch_in_is_unknown_is_marked() -> None:
    k = A.Kernel.of(K.parse(TEXT), 0)
    r = A.attribute(k, 4242, 100_000_050_000, 100_001_000_000)
    assert not r["complete"] and "switch-in" in r["missing"]


LOSSY = (
    TEXT
    + """\
    42 [001] 100.004000000: PERF_RECORD_LOST lost 7
    55 [000] 100.002000000: PERF_RECORD_LOST lost 3
"""
)


def test_a_lost_record_is_placed_after_the_last_event_its_cpu_recorded() -> None:
    # perf script prints each CPU's lines in time order; the LOST record's events
    # were lost after the previous event that CPU did record.
    lines = pl.Series("line", [l for c in ("[001]", "[000]") for l in LOSSY.splitlines() if c in l])
    w = K.lost_windows(lines).sort("cpu")
    assert w.rows() == [(0, 100_001_005_000, 100_002_000_000, 3), (1, 100_003_050_000, 100_004_000_000, 7)]


def test_only_windows_overlapping_lost_events_are_incomplete() -> None:
    lines = pl.Series("line", [l for c in ("[001]", "[000]") for l in LOSSY.splitlines() if c in l])
    k = A.Kernel.of(K.parse(lines), 10, K.lost_windows(lines))
    # the timer's window 100.000050-100.003030 ends before CPU 1's loss and
    # overlaps CPU 0's (the wake-up could have been recorded there)
    r = A.attribute(k, 42, 100_000_050_000, 100_003_030_000)
    assert not r["complete"] and "3 kernel events lost inside the window (CPU 0)" in r["missing"]
    r = A.attribute(k, 42, 100_002_500_000, 100_003_030_000)
    assert r["complete"], r["missing"]


def test_losses_perf_cannot_place_make_every_window_incomplete() -> None:
    lines = pl.Series("line", [l for l in LOSSY.splitlines() if "[001]" in l])
    # 10 lost, but the records place only 7
    k = A.Kernel.of(K.parse(lines), 10, K.lost_windows(lines))
    r = A.attribute(k, 42, 100_002_500_000, 100_003_030_000)
    assert not r["complete"] and "unknown times" in r["missing"]


def test_thread_families_drop_their_numbers() -> None:
    assert A.cause_family("thread: kworker/u4:1-events") == "thread: kworker"
    assert A.cause_family("thread: ls-burst") == "thread: ls-burst"
    assert A.cause_family("softirq: NET_RX") == "softirq: NET_RX"


BURST = """name: burst
probes:
  - {kind: timer, interval_us: 1000, cpu: [1]}
loads:
  - name: burst
    kind: command
    command: "chrt -f 20 taskset -c 1 python3 -c \\"import ctypes,time; ctypes.CDLL(None).prctl(15, b'ls-burst', 0, 0, 0)\\nwhile True:\\n  t=time.perf_counter()\\n  while time.perf_counter()-t < 0.003: pass\\n  time.sleep(0.017)\\""
phases:
  - {name: idle}
  - {name: burst, loads: [burst]}
duration: 3s
"""


@pytest.mark.needs_root
@pytest.mark.needs_tool("chrt", "taskset")
def test_an_injected_cpu_burst_is_named_as_the_top_cause(tmp_path: Path, lab: None) -> None:
    (tmp_path / "b.yaml").write_text(BURST)
    r = subprocess.run([str(BIN), "run", "b.yaml", "--run-dir", "run"], cwd=tmp_path, capture_output=True, text=True, timeout=240)
    assert r.returncode == 0, r.stderr
    run = tmp_path / "run"
    ex = json.loads((run / "explain.json").read_text())
    cap = ex["captures"][0]
    assert cap["events"] > 1000 and cap["lost_events"] == 0
    burst = next(g for g in ex["groups"] if g["phase"] == "burst")
    assert burst["outliers"] >= 5
    # A load is named by the load it is, whatever its program calls itself.
    assert burst["causes"][0]["cause"] == "load: burst", burst["causes"]
    assert burst["causes"][0]["share"] > 0.25
    assert burst["load_share"] > 0.25 and burst["lab"].get("lab: capture", 0) <= 0.02
    idle = next(g for g in ex["groups"] if g["phase"] == "idle")
    assert all(c["cause"] not in ("load: burst", "thread: ls-burst") for c in idle["causes"])
    html = (run / "report.html").read_text()
    assert 'id="why"' in html and "load: burst" in html and '<details class="outliers">' in html
    # the lab's own share stands apart from the loads' and the system's, and the capture says what it cost
    assert "lab / loads / system" in html and "between the probe windows" in html
    att = pl.read_parquet(run / "tables" / "attribution.parquet")
    assert set(att.columns) >= {"rep", "phase", "probe", "host", "id", "latency_ns", "cause", "ns", "complete"}
    # Every outlier's causes add up to its window.
    sums = att.group_by("id").agg(pl.col("ns").sum(), pl.col("latency_ns").first())
    assert (sums["ns"] == sums["latency_ns"]).all()


SPIN = """\
name: spin
probes:
  - {kind: timer, name: t, interval_us: 1000, cpu: [1], priority: 5}
loads:
  - {name: spin, kind: command, command: [taskset, -c, "1", python3, -c, "while True: pass"]}
duration: 2s
"""


@pytest.mark.needs_root
@pytest.mark.needs_tool("taskset")
def test_a_user_space_spinner_beside_a_real_time_timer_never_holds_its_wake_up(tmp_path: Path, lab: None) -> None:
    # a SCHED_OTHER task in user space cannot keep the timer's interrupt off: whatever it ran before the
    # interrupt that woke the probe came is that interrupt's lateness (in a VM, 0.3-1 ms seen), not the spinner's
    (tmp_path / "s.yaml").write_text(SPIN)
    r = subprocess.run([str(BIN), "run", "s.yaml", "--run-dir", "run", "--no-report"], cwd=tmp_path, capture_output=True, text=True, timeout=240)
    assert r.returncode == 0, r.stderr
    r = subprocess.run([str(BIN), "explain", "run", "--json"], cwd=tmp_path, capture_output=True, text=True, timeout=240)
    assert r.returncode == 0, r.stderr
    att = pl.read_parquet(tmp_path / "run" / "tables" / "attribution.parquet").filter(pl.col("phase") == "spin", pl.col("complete"))
    assert att["id"].n_unique() >= 10, att
    spin = att.filter(pl.col("cause") == "load: spin")
    assert spin["before_ns"].sum() == 0, spin
    # what ran before the wake-up is the interrupt's lateness or the handlers themselves, never a task
    before = att.filter(pl.col("before_ns") > 0)["cause"].unique().to_list()
    assert not [c for c in before if c.startswith(("load:", "thread:", "lab:"))], before


@pytest.mark.needs_root
def test_a_kernel_without_the_events_is_said_and_the_run_goes_on(tmp_path: Path, lab: None) -> None:
    (tmp_path / "n.yaml").write_text("name: n\nkernel: {events: ['nosuch:event']}\nprobes: [{kind: timer, interval_us: 1000}]\nduration: 300ms\n")
    r = subprocess.run([str(BIN), "run", "n.yaml", "--run-dir", "run", "--no-report"], cwd=tmp_path, capture_output=True, text=True, timeout=120)
    assert r.returncode == 0, r.stderr
    run = json.loads((tmp_path / "run" / "run.json").read_text())
    assert any("kernel capture" in n and "none of the kernel events" in n for n in run["notes"])
    (tmp_path / "o.yaml").write_text(
        "name: o\nkernel: {capture: 'on', events: ['nosuch:event']}\nprobes: [{kind: timer, interval_us: 1000}]\nduration: 300ms\n"
    )
    r = subprocess.run([str(BIN), "run", "o.yaml", "--run-dir", "run2", "--no-report"], cwd=tmp_path, capture_output=True, text=True, timeout=120)
    assert r.returncode == 1
    assert "kernel capture" in r.stderr


def test_capture_is_possible_or_the_reason_is_given() -> None:
    from loopscope.kernel import capture

    have, lack, refused = capture.available(["sched:sched_switch"])
    if capture.tracefs() is None:
        assert refused and "tracefs" in refused
    else:
        assert refused is None or "root" in refused


SPAN = """\
    0 [000] 199.999000000:   sched:sched_stat_runtime: comm=x pid=5 runtime=1000 [ns]
    42 [001] 200.001000000:   sched:sched_stat_runtime: comm=app pid=42 runtime=1000000 [ns]
    42 [001] 200.001000000:         sched:sched_switch: prev_comm=app prev_pid=42 prev_prio=120 prev_state=S ==> next_comm=swapper/1 next_pid=0 next_prio=120
    9 [000] 200.003000000:         sched:sched_wakeup: comm=app pid=42 prio=120 target_cpu=001
    77 [001] 200.004000000:   sched:sched_stat_runtime: comm=hog pid=77 runtime=1000000 [ns]
    77 [001] 200.004000000:         sched:sched_switch: prev_comm=hog prev_pid=77 prev_prio=120 prev_state=R ==> next_comm=app next_pid=42 next_prio=120
    42 [001] 200.004500000:   irq:softirq_entry: vec=1 [action=TIMER]
    42 [001] 200.004600000:   irq:softirq_exit: vec=1 [action=TIMER]
    42 [001] 200.006000000:   sched:sched_stat_runtime: comm=app pid=42 runtime=2000000 [ns]
    42 [001] 200.006000000:         sched:sched_switch: prev_comm=app prev_pid=42 prev_prio=120 prev_state=R ==> next_comm=hog next_pid=77 next_prio=120
    77 [001] 200.007000000:   sched:sched_stat_runtime: comm=hog pid=77 runtime=1000000 [ns]
    77 [001] 200.007000000:         sched:sched_switch: prev_comm=hog prev_pid=77 prev_prio=120 prev_state=R ==> next_comm=app next_pid=42 next_prio=120
    42 [001] 200.008000000:   sched:sched_stat_runtime: comm=app pid=42 runtime=1000000 [ns]
    0 [000] 200.009000000:   sched:sched_stat_runtime: comm=x pid=5 runtime=1000 [ns]
"""


def test_an_interval_splits_into_running_blocked_and_what_ran_while_it_waited() -> None:
    # app runs 0-1 ms, sleeps until woken at 3 ms, waits for hog until 4 ms,
    # runs 4-6 ms with a 0.1 ms softirq inside, is preempted by hog 6-7 ms,
    # runs 7-8 ms.
    k = A.Kernel.of(K.parse(SPAN), 0)
    r = A.attribute_span(k, 42, 200_000_000_000, 200_008_000_000)
    assert r["complete"], r["missing"]
    assert r["causes"] == {"running": 1_000_000 + 1_900_000 + 1_000_000, "blocked: sleeping": 2_000_000, "thread: hog": 2_000_000, "softirq: TIMER": 100_000}
    assert sum(r["causes"].values()) == 8_000_000


def test_nested_interrupts_are_split_by_the_innermost_handler() -> None:
    steps = zip(
        [5, 100, 110, 120, 130, 140, 150],
        ["softirq_exit", "irq_handler_entry", "softirq_entry", "local_timer_entry", "local_timer_exit", "softirq_exit", "irq_handler_exit"],
        [None, "virtio0", "NET_RX", None, None, "NET_RX", None],
    )
    v = A.cpu_views(_events([{"t_ns": t, "cpu": 0, "pid": 0, "tid": 0, "event": e, "name": n} for t, e, n in steps]))[0]
    # the exit of a handler that began before the window is passed over
    assert list(zip(v.irq_s.tolist(), v.irq_e.tolist(), v.irq_label)) == [
        (100, 110, "irq: virtio0"),
        (110, 120, "softirq: NET_RX"),
        (120, 130, "timer interrupt"),
        (130, 140, "softirq: NET_RX"),
        (140, 150, "irq: virtio0"),
    ]


def _events(rows: list[dict]) -> pl.DataFrame:
    """Hand-made capture rows in the store's columns (absent fields null)."""
    from loopscope.kernel import store as S

    return pl.DataFrame([{c: r.get(c) for c in S.SCHEMA} for r in rows], schema=S.SCHEMA).sort("t_ns")


def test_idle_time_inside_a_timers_slack_is_timer_slack_and_after_it_cpu_idle() -> None:
    # thread 42 armed its timer for 1.000 ms with 0.5 ms of slack; the CPU idled;
    # it was woken at 1.600 ms (0.1 ms past the slack) and ran at 1.610 ms.
    ms = 1_000_000
    k = A.Kernel.of(
        _events(
            [
                {"t_ns": 0, "cpu": 1, "pid": 7, "tid": 7, "event": "sched_stat_runtime", "target": 7, "target_comm": "other", "runtime": 1000},
                {"t_ns": 900_000, "cpu": 1, "pid": 42, "tid": 42, "event": "hrtimer_start", "expires": ms + ms // 2, "softexpires": ms},
                {"t_ns": 1_600_000, "cpu": 1, "pid": 0, "tid": 0, "event": "sched_wakeup", "target": 42, "target_comm": "t", "dest_cpu": 1},
                {"t_ns": 1_700_000, "cpu": 1, "pid": 42, "tid": 42, "event": "sched_stat_runtime", "target": 42, "target_comm": "t", "runtime": 90_000},
                {"t_ns": 3 * ms, "cpu": 0, "pid": 7, "tid": 7, "event": "sched_stat_runtime", "target": 7, "target_comm": "other", "runtime": 1000},
            ]
        ),
        0,
    )
    r = A.attribute(k, 42, ms, 1_620_000)
    assert r["causes"] == {"timer slack": 500_000, "CPU idle": 100_000, "scheduling latency": 10_000, "return to user space": 10_000}


def test_a_timer_armed_for_another_deadline_gives_no_slack() -> None:
    k = A.Kernel.of(
        _events(
            [
                {"t_ns": 0, "cpu": 1, "pid": 42, "tid": 42, "event": "hrtimer_start", "expires": 5_000_000, "softexpires": 4_000_000},
                {"t_ns": 1_500_000, "cpu": 1, "pid": 0, "tid": 0, "event": "sched_wakeup", "target": 42, "target_comm": "t", "dest_cpu": 1},
                {"t_ns": 1_600_000, "cpu": 1, "pid": 42, "tid": 42, "event": "sched_stat_runtime", "target": 42, "target_comm": "t", "runtime": 100_000},
                {"t_ns": 9_000_000, "cpu": 1, "pid": 42, "tid": 42, "event": "sched_stat_runtime", "target": 42, "target_comm": "t", "runtime": 1},
            ]
        ),
        0,
    )
    assert "timer slack" not in A.attribute(k, 42, 1_000_000, 1_500_000)["causes"]


def test_an_ipi_whose_handler_flushed_the_tlb_is_a_tlb_shootdown() -> None:
    # thread 42 was due at 0 and ran at 300; CPU 1 handled two IPIs meanwhile,
    # the first running the TLB flush
    k = A.Kernel.of(
        _events(
            [
                {"t_ns": 100, "cpu": 1, "pid": 0, "tid": 0, "event": "call_function_single_entry"},
                {"t_ns": 105, "cpu": 1, "pid": 0, "tid": 0, "event": "csd_function_entry"},
                {"t_ns": 120, "cpu": 1, "pid": 0, "tid": 0, "event": "call_function_single_exit"},
                {"t_ns": 200, "cpu": 1, "pid": 0, "tid": 0, "event": "call_function_entry"},
                {"t_ns": 230, "cpu": 1, "pid": 0, "tid": 0, "event": "call_function_exit"},
                {"t_ns": 400, "cpu": 1, "pid": 42, "tid": 42, "event": "sched_stat_runtime", "target": 42, "target_comm": "t", "runtime": 100},
            ]
        ),
        0,
    )
    c = A.attribute(k, 42, 0, 300)["causes"]
    assert c["IPI: TLB shootdown"] == 20 and c["IPI: function call"] == 30
    views = A.cpu_views(
        _events(
            [
                {"t_ns": 100, "cpu": 1, "pid": 0, "tid": 0, "event": "call_function_single_entry"},
                {"t_ns": 105, "cpu": 1, "pid": 0, "tid": 0, "event": "csd_function_entry"},
                {"t_ns": 120, "cpu": 1, "pid": 0, "tid": 0, "event": "call_function_single_exit"},
            ]
        )
    )
    assert views[1].irq_label == ["IPI: TLB shootdown"]  # the Perfetto export's tracks say so too


def test_the_cpu_tracks_draw_a_run_accounted_from_before_its_wake_up_from_the_wake_up() -> None:
    # thread 42 woken at 1,000 on CPU 1; its runtime event at 2,000 says it ran 1,500 (from 500)
    views = A.cpu_views(
        _events(
            [
                {"t_ns": 1000, "cpu": 0, "pid": 7, "tid": 7, "event": "sched_wakeup", "target": 42, "target_comm": "t", "dest_cpu": 1},
                {"t_ns": 2000, "cpu": 1, "pid": 42, "tid": 42, "event": "sched_stat_runtime", "target": 42, "target_comm": "t", "runtime": 1500},
            ]
        )
    )
    v = views[1]
    assert (list(v.run_s), list(v.run_e), list(v.run_pid), v.run_label) == ([1000], [2000], [42], ["thread: t"])


def test_the_cpu_tracks_draw_runs_runtime_accounting_overlaps_one_after_the_other() -> None:
    # hog accounted 0..900 on CPU 1, spin 800..1500: spin's clock was read before hog's last update
    rt = {"cpu": 1, "event": "sched_stat_runtime"}
    views = A.cpu_views(
        _events(
            [
                {**rt, "t_ns": 900, "pid": 7, "tid": 7, "target": 7, "target_comm": "ld:hog", "runtime": 900},
                {**rt, "t_ns": 1500, "pid": 8, "tid": 8, "target": 8, "target_comm": "spin", "runtime": 700},
            ]
        )
    )
    v = views[1]
    assert list(zip(v.run_s, v.run_e, v.run_pid)) == [(0, 900, 7), (900, 1500, 8)]


def test_the_cpu_tracks_of_a_recording_with_switches_only_show_its_runs() -> None:
    sw = {"cpu": 0, "event": "sched_switch", "prev_state": "S"}
    views = A.cpu_views(
        _events(
            [
                {**sw, "t_ns": 100, "pid": 0, "tid": 0, "target": 0, "target_comm": "swapper/0", "next_pid": 42, "next_comm": "app"},
                {**sw, "t_ns": 400, "pid": 42, "tid": 42, "target": 42, "target_comm": "app", "next_pid": 9, "next_comm": "ld:hog"},
                {**sw, "t_ns": 900, "pid": 9, "tid": 9, "target": 9, "target_comm": "ld:hog", "next_pid": 0, "next_comm": "swapper/0"},
            ]
        )
    )
    v = views[0]
    assert list(zip(v.run_s, v.run_e, v.run_pid, v.run_label)) == [(100, 400, 42, "thread: app"), (400, 900, 9, "load: hog")]


def _blocked() -> A.Kernel:
    """Thread 42 (cpu 1) sleeps in a lock at 1 ms; zoo-holder (tid 9, cpu 0)
    releases it and wakes it at 4 ms (recorded by the waker); 42 runs at 4.1 ms."""
    ms = 1_000_000
    return A.Kernel.of(
        _events(
            [
                {"t_ns": 1 * ms, "cpu": 1, "pid": 42, "tid": 42, "event": "sched_stat_runtime", "target": 42, "target_comm": "app", "runtime": ms},
                {
                    "t_ns": 1 * ms,
                    "cpu": 1,
                    "pid": 42,
                    "tid": 42,
                    "event": "sched_switch",
                    "target": 42,
                    "target_comm": "app",
                    "prev_state": "S",
                    "next_pid": 0,
                    "next_comm": "swapper/1",
                },
                {"t_ns": 4 * ms, "cpu": 0, "pid": 9, "tid": 9, "event": "sched_stat_runtime", "target": 9, "target_comm": "zoo-holder", "runtime": 3 * ms},
                {"t_ns": 4 * ms, "cpu": 0, "pid": 9, "tid": 9, "event": "sched_waking", "target": 42, "target_comm": "app", "dest_cpu": 1},
                {"t_ns": 5 * ms, "cpu": 1, "pid": 42, "tid": 42, "event": "sched_stat_runtime", "target": 42, "target_comm": "app", "runtime": 900_000},
            ]
        ),
        0,
    )


def test_a_sleep_ended_by_another_thread_is_blocked_on_that_thread() -> None:
    ms = 1_000_000
    r = A.attribute_span(_blocked(), 42, 0, 5 * ms)
    assert r["causes"] == {"running": 1 * ms + 900_000, "blocked: zoo-holder": 3 * ms, "scheduling latency": 100_000}
    assert A.cause_family("blocked: kworker/1:2") == "blocked: kworker" and A.cause_family("blocked: sleeping") == "blocked: sleeping"


def test_a_sleep_held_past_its_deadline_by_timer_slack_is_split_at_the_deadline() -> None:
    # thread 42 runs 0-1 ms, arms a 1 ms sleep (deadline 2 ms) with 5 ms of slack,
    # is woken by the timer at 6 ms and runs until 7 ms.
    ms = 1_000_000
    k = A.Kernel.of(
        _events(
            [
                {"t_ns": 1 * ms - 500, "cpu": 1, "pid": 42, "tid": 42, "event": "hrtimer_start", "expires": 7 * ms, "softexpires": 2 * ms},
                {"t_ns": 1 * ms, "cpu": 1, "pid": 42, "tid": 42, "event": "sched_stat_runtime", "target": 42, "target_comm": "poll", "runtime": ms},
                {
                    "t_ns": 1 * ms,
                    "cpu": 1,
                    "pid": 42,
                    "tid": 42,
                    "event": "sched_switch",
                    "target": 42,
                    "target_comm": "poll",
                    "prev_state": "S",
                    "next_pid": 0,
                    "next_comm": "swapper/1",
                },
                {"t_ns": 6 * ms, "cpu": 1, "pid": 0, "tid": 0, "event": "sched_wakeup", "target": 42, "target_comm": "poll", "dest_cpu": 1},
                {"t_ns": 7 * ms, "cpu": 1, "pid": 42, "tid": 42, "event": "sched_stat_runtime", "target": 42, "target_comm": "poll", "runtime": ms},
            ]
        ),
        0,
    )
    r = A.attribute_span(k, 42, 0, 7 * ms)
    assert r["causes"] == {"running": 2 * ms, "blocked: sleeping": 1 * ms, "timer slack": 4 * ms}


def _ipis(cpu: int, start: int, every: int, length: int, n: int) -> list[dict]:
    rows = []
    for i in range(n):
        t = start + i * every
        rows += [
            {"t_ns": t, "cpu": cpu, "pid": 0, "tid": 0, "event": "call_function_single_entry"},
            {"t_ns": t + length, "cpu": cpu, "pid": 0, "tid": 0, "event": "call_function_single_exit"},
        ]
    return rows


def test_idle_between_ipis_a_few_microseconds_apart_is_the_ipis_not_the_cpu_idling() -> None:
    # deadline 0; an IPI every 28 µs (10 µs each) on the idle CPU until its timer fires at 1 ms
    us = 1_000
    rows = [
        *_ipis(1, 50 * us, 28 * us, 10 * us, 30),
        {"t_ns": 1_000 * us, "cpu": 1, "pid": 0, "tid": 0, "event": "sched_wakeup", "target": 42, "target_comm": "t", "dest_cpu": 1},
        {"t_ns": 1_050 * us, "cpu": 1, "pid": 42, "tid": 42, "event": "sched_stat_runtime", "target": 42, "target_comm": "t", "runtime": 40 * us},
        {"t_ns": 3_000 * us, "cpu": 0, "pid": 7, "tid": 7, "event": "sched_stat_runtime", "target": 7, "target_comm": "other", "runtime": 1_000},
    ]
    r = A.attribute(A.Kernel.of(_events(rows), 0), 42, 0, 1_020 * us)
    c = r["causes"]
    first, last_end = 50 * us, 50 * us + 29 * 28 * us + 10 * us
    # the handlers, and the 29 gaps of 18 µs between them
    assert c["IPI: function call"] == 30 * 10 * us + 29 * 18 * us
    # before the storm and after its last IPI the CPU idled
    assert c["CPU idle"] == first + (1_000 * us - last_end)
    assert sum(c.values()) == 1_020 * us


def test_idle_between_interrupts_far_apart_stays_cpu_idle() -> None:
    us = 1_000
    rows = [
        *_ipis(1, 100 * us, 300 * us, 10 * us, 3),
        {"t_ns": 1_000 * us, "cpu": 1, "pid": 0, "tid": 0, "event": "sched_wakeup", "target": 42, "target_comm": "t", "dest_cpu": 1},
        {"t_ns": 1_050 * us, "cpu": 1, "pid": 42, "tid": 42, "event": "sched_stat_runtime", "target": 42, "target_comm": "t", "runtime": 40 * us},
        {"t_ns": 3_000 * us, "cpu": 0, "pid": 7, "tid": 7, "event": "sched_stat_runtime", "target": 7, "target_comm": "other", "runtime": 1_000},
    ]
    c = A.attribute(A.Kernel.of(_events(rows), 0), 42, 0, 1_020 * us)["causes"]
    assert c["IPI: function call"] == 30 * us and c["CPU idle"] == 1_000 * us - 30 * us


def test_a_run_after_a_wake_up_starts_at_the_wake_up_even_when_runtime_says_earlier() -> None:
    # a poller sleeps on 5 ms of slack three times in one wait; each runtime
    # event carries a few µs from before the thread slept, so the runs it
    # gives start before the wake-ups; the sleeps are still seen as slept on slack
    us = 1_000
    rows = []
    t = 0
    for k in range(3):
        rows += [
            {"t_ns": t + 80 * us, "cpu": 1, "pid": 42, "tid": 42, "event": "hrtimer_start", "expires": t + 5_130 * us, "softexpires": t + 130 * us},
            {"t_ns": t + 82 * us, "cpu": 1, "pid": 42, "tid": 42, "event": "sched_stat_runtime", "target": 42, "target_comm": "poll", "runtime": 60 * us},
            {
                "t_ns": t + 87 * us,
                "cpu": 1,
                "pid": 42,
                "tid": 42,
                "event": "sched_switch",
                "target": 42,
                "target_comm": "poll",
                "prev_state": "S",
                "next_pid": 0,
                "next_comm": "swapper/1",
            },
            {"t_ns": t + 5_150 * us, "cpu": 1, "pid": 0, "tid": 0, "event": "sched_wakeup", "target": 42, "target_comm": "poll", "dest_cpu": 1},
        ]
        t += 5_150 * us
    rows += [
        {"t_ns": t + 80 * us, "cpu": 1, "pid": 42, "tid": 42, "event": "sched_stat_runtime", "target": 42, "target_comm": "poll", "runtime": 95 * us},
        {"t_ns": 30_000 * us, "cpu": 0, "pid": 7, "tid": 7, "event": "sched_stat_runtime", "target": 7, "target_comm": "other", "runtime": 1_000},
    ]
    r = A.attribute_span(A.Kernel.of(_events(rows), 0), 42, 20 * us, t + 80 * us)
    c = r["causes"]
    assert not any("not recorded" in k for k in c), c
    # slept on its slack to the hard expiry, then 20 µs late each time
    assert c["timer slack"] == 3 * 5_000 * us and c["CPU idle"] == 3 * 20 * us


def test_a_slack_timer_that_fires_late_is_slack_to_its_hard_expiry_then_cpu_idle() -> None:
    # asleep from 97 µs (its last accounted run) on a timer due at 200 µs with
    # 5 ms of slack (hard 5.2 ms); the idle CPU woke 90 µs after the hard expiry
    us = 1_000
    rows = [
        {"t_ns": 95 * us, "cpu": 1, "pid": 42, "tid": 42, "event": "hrtimer_start", "expires": 5_200 * us, "softexpires": 200 * us},
        {"t_ns": 97 * us, "cpu": 1, "pid": 42, "tid": 42, "event": "sched_stat_runtime", "target": 42, "target_comm": "poll", "runtime": 90 * us},
        {
            "t_ns": 100 * us,
            "cpu": 1,
            "pid": 42,
            "tid": 42,
            "event": "sched_switch",
            "target": 42,
            "target_comm": "poll",
            "prev_state": "S",
            "next_pid": 0,
            "next_comm": "swapper/1",
        },
        {"t_ns": 5_290 * us, "cpu": 1, "pid": 0, "tid": 0, "event": "sched_wakeup", "target": 42, "target_comm": "poll", "dest_cpu": 1},
        {"t_ns": 5_400 * us, "cpu": 1, "pid": 42, "tid": 42, "event": "sched_stat_runtime", "target": 42, "target_comm": "poll", "runtime": 100 * us},
        {"t_ns": 30_000 * us, "cpu": 0, "pid": 7, "tid": 7, "event": "sched_stat_runtime", "target": 7, "target_comm": "other", "runtime": 1_000},
    ]
    c = A.attribute_span(A.Kernel.of(_events(rows), 0), 42, 50 * us, 5_400 * us)["causes"]
    assert c["timer slack"] == 5_000 * us and c["CPU idle"] == 90 * us and c["blocked: sleeping"] == 103 * us, c


def test_a_thread_still_waiting_for_a_page_at_its_deadline_waits_on_page_faults_until_woken() -> None:
    # the thread faulted at -150 µs and slept in D from -100 µs; its deadline is
    # 0; the swap-in completed at 8 ms (a block softirq woke it) and it ran
    us = 1_000
    rows = [
        {"t_ns": -300 * us, "cpu": 1, "pid": 42, "tid": 42, "event": "sched_stat_runtime", "target": 42, "target_comm": "t", "runtime": 100 * us},
        {"t_ns": -150 * us, "cpu": 1, "pid": 42, "tid": 42, "event": "page_fault_user"},
        {"t_ns": -102 * us, "cpu": 1, "pid": 42, "tid": 42, "event": "sched_stat_runtime", "target": 42, "target_comm": "t", "runtime": 190 * us},
        {
            "t_ns": -100 * us,
            "cpu": 1,
            "pid": 42,
            "tid": 42,
            "event": "sched_switch",
            "target": 42,
            "target_comm": "t",
            "prev_state": "D",
            "next_pid": 0,
            "next_comm": "swapper/1",
        },
        {"t_ns": 8_000 * us, "cpu": 1, "pid": 0, "tid": 0, "event": "softirq_entry", "name": "BLOCK"},
        {"t_ns": 8_004 * us, "cpu": 1, "pid": 0, "tid": 0, "event": "sched_wakeup", "target": 42, "target_comm": "t", "dest_cpu": 1},
        {"t_ns": 8_006 * us, "cpu": 1, "pid": 0, "tid": 0, "event": "softirq_exit", "name": "BLOCK"},
        {"t_ns": 8_100 * us, "cpu": 1, "pid": 42, "tid": 42, "event": "sched_stat_runtime", "target": 42, "target_comm": "t", "runtime": 90 * us},
        {"t_ns": 30_000 * us, "cpu": 0, "pid": 7, "tid": 7, "event": "sched_stat_runtime", "target": 7, "target_comm": "other", "runtime": 1_000},
    ]
    c = A.attribute(A.Kernel.of(_events(rows), 0), 42, 0, 8_100 * us)["causes"]
    assert c["page faults"] >= 8_000 * us - 6 * us and "CPU idle" not in c, c


def test_a_native_string_table_splits_a_window_as_the_lists_it_was_made_of_do() -> None:
    k = A.Kernel.of(K.parse(TEXT), 0)
    assert isinstance(k.comms, list) and isinstance(k.states, list) and isinstance(k.names, list)
    native = replace(k, comms=_native.StringTable(k.comms), states=_native.StringTable(k.states), names=_native.StringTable(k.names))
    assert len(native.comms) == len(k.comms)
    assert A.attribute(native, 42, 100_000_050_000, 100_003_030_000) == A.attribute(k, 42, 100_000_050_000, 100_003_030_000)
    assert A.attribute(native, 42, 100_000_050_000, 100_003_030_000)["causes"]["thread: ls-burst"] == 100_003_000_000 - 100_000_050_000


def test_columns_given_as_chunks_of_int32_and_int64_split_as_whole_columns_do() -> None:
    k = A.Kernel.of(K.parse(TEXT), 0)
    whole = A.attribute(k, 42, 100_000_050_000, 100_003_030_000)

    def chunked(name: str, v: np.ndarray) -> list[np.ndarray]:
        # as a capture's row groups hand them over: int32 where stored so, cut anywhere, one strided
        parts = [v[:3], v[3:7], v[7:]]
        if name in ("t_ns", "runtime"):
            return parts
        return [parts[0].astype(np.int32), np.repeat(parts[1], 2)[::2].astype(np.int32), parts[2].astype(np.int32)]

    chunks = replace(k, cols={c: chunked(c, np.asarray(v)) for c, v in k.cols.items()})
    assert A.attribute(chunks, 42, 100_000_050_000, 100_003_030_000) == whole
    assert whole["causes"]["thread: ls-burst"] == 100_003_000_000 - 100_000_050_000


def _cut(k: A.Kernel, at: list[int]) -> A.Kernel:
    """``k`` with its events handed over as batches cut at ``at``, read once (``Kernel.arrays``)."""
    cols = {c: np.asarray(v) for c, v in typing.cast("dict[str, np.ndarray]", k.cols).items()}
    edges = [0, *at, len(cols["t_ns"])]
    return replace(k, cols=iter([{c: v[x:y] for c, v in cols.items()} for x, y in zip(edges, edges[1:])]))


def test_events_fed_in_batches_as_they_are_read_split_as_all_at_once_wherever_they_are_cut() -> None:
    # a long window's events reach the split a row group at a time (Store.iter_arrays), and none is kept
    k = A.Kernel.of(K.parse(TEXT), 0)
    n = len(k.cols["t_ns"])
    whole = A.attribute(k, 42, 100_000_050_000, 100_003_030_000)
    assert whole["causes"]["thread: ls-burst"] == 100_003_000_000 - 100_000_050_000
    for at in [[i] for i in range(1, n)] + [list(range(1, n))]:
        assert A.attribute(_cut(k, at), 42, 100_000_050_000, 100_003_030_000) == whole, at
    # the waker is named from its own events, in a batch before the one that ends the wait
    b = _blocked()
    whole = A.attribute_span(b, 42, 0, 5_000_000)
    assert "blocked: zoo-holder" in whole["causes"]
    for i in range(1, len(b.cols["t_ns"])):
        assert A.attribute_span(_cut(b, [i]), 42, 0, 5_000_000) == whole, i


def test_chunks_that_overlap_in_time_split_as_the_sorted_whole_and_batches_out_of_order_are_refused() -> None:
    k = A.Kernel.of(K.parse(TEXT), 0)
    whole = A.attribute(k, 42, 100_000_050_000, 100_003_030_000)
    cols = {c: np.asarray(v) for c, v in typing.cast("dict[str, np.ndarray]", k.cols).items()}
    n = len(cols["t_ns"])
    # one dict whose chunks come in the wrong order (each sorted): joined and sorted, as one array would be
    swapped = {c: [v[n // 2 :], v[: n // 2]] for c, v in cols.items()}
    assert A.attribute(replace(k, cols=swapped), 42, 100_000_050_000, 100_003_030_000) == whole
    # batches of an iterable in the wrong order: a pass cannot go back in time
    late_first = iter([{c: v[n // 2 :] for c, v in cols.items()}, {c: v[: n // 2] for c, v in cols.items()}])
    with pytest.raises(InputError, match="batches must come in time order"):
        A.attribute(replace(k, cols=late_first), 42, 100_000_050_000, 100_003_030_000)


def test_columns_of_different_lengths_are_refused_by_name() -> None:
    k = A.Kernel.of(K.parse(TEXT), 0)
    short = replace(k, cols={**k.cols, "cpu": [np.asarray(k.cols["cpu"])[:4].astype(np.int32)]})
    with pytest.raises(InputError, match="differ in length"):
        A.attribute(short, 42, 100_000_050_000, 100_003_030_000)


FAULTS = """
import resource, sys
import numpy as np
from loopscope import _native

def faults():
    return resource.getrusage(resource.RUSAGE_SELF).ru_minflt

def rss_kb():
    return int(next(l for l in open("/proc/self/status") if l.startswith("VmRSS")).split()[1])

def rounds(n):
    out = []
    for _ in range(n):
        f = faults()
        blocks = [np.ones(1 << 20) for _ in range(20)]  # 20 blocks of 8 MB, each page written
        del blocks
        out.append(faults() - f)
    return out

if sys.argv[1] == "kept":
    with _native.FreedKept():
        got = rounds(3)
        before = rss_kb()
    print(got[-1], before - rss_kb())
else:
    print(rounds(3)[-1], 0)
"""


def test_memory_freed_while_freed_kept_is_held_is_reused_without_faults_and_handed_back_after() -> None:
    def run(mode: str) -> tuple[int, int]:
        out = subprocess.run([sys.executable, "-c", FAULTS, mode], capture_output=True, text=True, check=True).stdout.split()
        return int(out[0]), int(out[1])

    plain, _ = run("plain")
    kept, handed_back_kb = run("kept")
    # glibc alone hands 160 MB freed at once back to the kernel, and faults it in again at the next round
    # (fewer faults than its 40,960 pages where numpy's large blocks get huge pages)
    assert plain > 1000, plain
    assert kept * 10 < plain, (kept, plain)
    # on the last exit the kept memory goes back (malloc_trim)
    assert handed_back_kb > 100_000, handed_back_kb
