"""``loopscope bench explain``: the cause zoo run for real in its quick
form (a hog, a blocked lock, a CPU limit, and the warm-up anomaly's page faults), its one
JSON line, its refusals, and nothing left behind."""

from __future__ import annotations

import json
import subprocess
from pathlib import Path

import numpy as np
import pytest

from loopscope.bench import zoo, zooanomaly
from loopscope.host import shared, swapfile
from tests.conftest import Cli

CASE_KEYS = {
    "name",
    "expected",
    "top_cause",
    "top_share",
    "expected_share",
    "expected_rank",
    "baseline_expected_share",
    "unexplained_share",
    "outliers",
    "skipped",
    "baseline_top",
    "baseline_ok",
}
ANOMALY_KEYS = {"name", "injected_ns", "detected_ns", "expected", "cause", "ok"}


def _left() -> list[str]:
    ps = subprocess.run(["ps", "-eo", "comm="], capture_output=True, text=True).stdout.split()
    return [c for c in ps if c.startswith(("zoo-", "ls-zoo", "ls-probe", "ls-agent"))] + [str(p) for p in Path("/var/tmp").glob("loopscope-*.swap")]


@pytest.mark.needs_root
@pytest.mark.needs_tool("stress-ng")
def test_the_zoo_names_a_hog_a_lock_holder_and_a_cpu_limit_first_finds_a_cold_start_and_prints_one_json_line(cli: Cli, tmp_path: Path, bench: None) -> None:
    # (the faults case shares its injector and swap file with the warm-up anomaly run here; the full bench runs all eight)
    rps = Path("/sys/class/net/lo/queues/rx-0/rps_cpus").read_text()
    before = set(_left())  # another run's leftovers (a killed bench on this machine) are not this one's
    r = cli(
        "bench",
        "explain",
        "--json",
        "--quick",
        "--case",
        "hog",
        "--case",
        "blocked",
        "--case",
        "throttle",
        "--case",
        "anomaly-warmup",
        "--dir",
        str(tmp_path / "z"),
        timeout=900,
    )
    assert r.returncode == 0, r.stderr
    lines = r.stdout.strip().splitlines()
    assert len(lines) == 1  # progress went to stderr
    assert f"runs are kept in {tmp_path / 'z'}" in r.stderr  # what the bench leaves behind is said
    j = json.loads(lines[0])
    assert [c["name"] for c in j["cases"]] == ["hog", "blocked", "throttle"]
    for c in j["cases"]:
        assert CASE_KEYS <= set(c), c
        assert c["skipped"] is None and c["outliers"] > 0
        assert c["expected_rank"] == 1, c  # the injected cause comes out first
        assert c["expected_share"] >= 0.5 and c["baseline_expected_share"] <= 0.05, c
    assert j["accuracy"] == 1.0
    # rtla's rule on the same outliers: a hog running when the timer fired is what it blames
    assert j["cases"][0]["baseline_top"] == "load: hog" and j["cases"][0]["baseline_ok"] and 0 < j["baseline_accuracy"] <= 1
    # advise on each case's run: the hog's remedy (the probe SCHED_FIFO) lowers p99 in its follow-up
    hog, blocked, throttle = j["cases"]
    # the limit is lifted in the follow-up (the bench's group, given back after)
    # (with the remedies advise offers for the run's other causes, if any stood out)
    assert {"kind": "write", "path": "/sys/fs/cgroup/cpu/ls-zoo-throttle/cpu.cfs_quota_us", "value": "-1"} in throttle["remedy"]["tunings"], throttle["remedy"]
    assert not Path("/sys/fs/cgroup/cpu/ls-zoo-throttle").exists()
    # the program's own p99 lateness and loopscope's, from the kernel alone, agree within 10 %
    own, ours = throttle["self_p99_ns"], throttle["loopscope_p99_ns"]
    assert own and ours and abs(ours - own) <= 0.1 * own, (own, ours)
    assert "SCHED_FIFO" in hog["remedy"]["offered"] and hog["remedy"]["tunings"], hog["remedy"]
    assert hog["remedy"]["against"] == "injected" and hog["remedy"]["ratio_p99"] < 1 and hog["remedy"]["significant"], hog["remedy"]
    assert "lock" in blocked["remedy"]["offered"] and "mlockall" not in blocked["remedy"]["offered"]
    # a change to the program: no follow-up pretends to prove it
    assert blocked["remedy"]["ratio_p99"] is None and "no run-time tuning" in blocked["remedy"]["why"], blocked["remedy"]
    (w,) = j["anomalies"]
    assert ANOMALY_KEYS <= set(w) and w["name"] == "warmup" and w["detected_ns"] and w["cause"] == "page faults" and w["ok"]
    assert set(_left()) <= before and set(swapfile.leftovers()) <= {Path(p) for p in before}
    assert Path("/sys/class/net/lo/queues/rx-0/rps_cpus").read_text() == rps


def test_an_unknown_case_is_refused_naming_the_cases_and_leaves_no_scratch_directory(cli: Cli, bench: None, tmp_path: Path, beside: None) -> None:
    scratch = tmp_path / "scratch"
    scratch.mkdir()
    r = cli("bench", "explain", "--case", "nosuch", "--json", env={"TMPDIR": str(scratch)})
    assert r.returncode == 2 and "nosuch" in r.stderr and "hog" in r.stderr and "Traceback" not in r.stderr
    assert list(scratch.iterdir()) == []  # the programs were not built for a refused case


def test_a_case_this_machine_cannot_inject_says_why() -> None:
    c = zoo.Case("x", "load: x", "needs a tool nobody has", needs=["no-such-injector-tool"])
    why = zoo.missing(c)
    assert why and ("no-such-injector-tool" in why or "root" in why or "CPU" in why)


def test_every_named_case_declares_its_expected_cause_with_a_defined_label() -> None:
    doc = (Path(__file__).resolve().parents[2] / "docs" / "explain.md").read_text()
    names = [c.name for c in zoo.cases("zoo", "lock", "table")]
    assert names == ["hog", "fifo", "netrx", "timers", "ipi", "slack", "faults", "blocked", "throttle", "rt-throttle", "slowdown", "inversion"]
    for c in zoo.cases("zoo", "lock", "table"):
        family = c.expected.split(":")[0] if c.expected.startswith(("thread:", "load:", "blocked:", "softirq:", "throttled:")) else c.expected
        assert f"`{family}" in doc, c.expected  # every label is defined in docs/explain.md


def test_the_quantization_anomaly_declares_the_slack_it_injects() -> None:
    q = next(a for a in zoo.anomalies("zoo", "poll", "table") if a.name == "quantization")
    assert q.injected_ns == 5_000_000 and q.expected == "timer slack"


def test_the_tick_is_counted_from_the_interrupts_on_its_grid_not_from_the_probes_own_timers() -> None:
    tick, secs = 4_000_000, 10.0
    own = np.arange(1_000, int(secs * 1e9), 5_050_000)  # a slack timer's expiries, drifting over the tick's grid
    grid = np.arange(7_000, int(secs * 1e9), tick) + np.random.default_rng(1).integers(0, 60_000, int(secs * 1e9) // tick)
    assert zooanomaly.tick_rate(own, secs, tick) < 0.5e9 / tick  # under half of HZ: the slack decides
    assert 240 <= zooanomaly.tick_rate(np.sort(np.concatenate([own, grid])), secs, tick) <= 270


def test_a_cause_the_recorded_set_cannot_show_is_invisible_and_says_what_is_missing() -> None:
    from loopscope.bench import recorders

    minimal = {"sched_switch", "sched_wakeup", "sched_waking"}
    assert recorders.invisible("softirq: NET_RX", minimal) == "no softirq_entry events: softirq: NET_RX cannot be seen"
    assert recorders.invisible("timer slack", minimal) is not None
    for thread_caused in ("load: hog", "thread: zoo-fifo", "blocked: zoo-holder", "throttled: /g", "throttled: RT", "slowed: no kernel event"):
        assert recorders.invisible(thread_caused, minimal) is None, thread_caused
    assert recorders.invisible("IPI: function call", {*minimal, "csd_function_entry"}) is None


def test_a_case_recorded_by_another_tool_runs_with_loopscopes_capture_off() -> None:
    hog = next(c for c in zoo.cases("zoo", "lock", "table") if c.name == "hog")
    assert "kernel: {capture: off}" in zoo.spec_text(hog, 2, 1, None, capture=False)
    assert "capture: off" not in zoo.spec_text(hog, 2, 1, None)


def test_cleanup_deletes_a_shared_table_a_killed_bench_left(cli: Cli, lab: None) -> None:
    # the slowdown case's table lives in /dev/shm, named for the bench's pid: one whose owner is gone is a leftover
    dead = max(int(p.name) for p in Path("/proc").iterdir() if p.name.isdigit()) + 100_000
    left = shared.DIR / f"loopscope-{dead}.shared"
    mine = shared.path()
    left.write_bytes(b"\0" * 4096)
    mine.write_bytes(b"\0" * 4096)
    try:
        r = cli("cleanup")
        assert r.returncode == 0, r.stderr
        assert str(left) in r.stdout and not left.exists()
        assert mine.exists()  # its owner (this test) is alive
    finally:
        shared.remove(left)
        shared.remove(mine)
