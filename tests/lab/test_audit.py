"""`loopscope audit`: the set-up read, the CPUs watched, every finding with
its evidence and remedy; a planted intruder found, audit's own never."""

from __future__ import annotations

import json
import os
import re
import subprocess
import threading
import time
from pathlib import Path

import pytest

from loopscope.lab.audit import audit
from tests.conftest import Cli
from tests.helpers import assert_clean_error

KEYS = {"check", "cpus", "what", "why", "evidence", "remedy", "remedy_kind", "reboot"}
RAN = {"cpu", "tid", "comm", "ns", "what"}


def _cpu1() -> None:
    if (os.cpu_count() or 1) < 2:
        pytest.skip("needs two CPUs: one to audit, one for audit itself")


@pytest.mark.needs_root
def test_a_task_planted_on_the_audited_cpu_is_found_with_its_run_time_and_audits_own_threads_are_not(cli: Cli, tmp_path: Path, lab: None) -> None:
    _cpu1()
    # a busy task pinned to CPU 1, already running when the watch starts (it may never switch out)
    spin = subprocess.Popen(["taskset", "-c", "1", "python3", "-c", "import time\nt = time.time() + 20\nwhile time.time() < t: pass"])
    try:
        time.sleep(0.3)
        r = cli("audit", "--cpus", "1", "--for", "1s", "--json", timeout=60)
    finally:
        spin.kill()
        spin.wait()
    assert r.returncode == 0, r.stderr
    j = json.loads(r.stdout)
    assert j["cpus"] == [1] and j["watched_s"] == 1.0 and all(set(f) == KEYS and f["remedy_kind"] in ("runtime", "boot", "none") for f in j["findings"])
    assert all(f["reboot"] == (f["remedy_kind"] == "boot") for f in j["findings"])
    # an IRQ that fired there is one finding, named by number and name
    assert all(re.match(r"IRQ \d+ \(.*\) fired on CPU 1", f["what"]) for f in j["findings"] if f["check"] == "irq"), j["findings"]
    if j["capture_refused"]:
        pytest.skip(f"no kernel capture here: {j['capture_refused']}")
    ran = next(f for f in j["findings"] if f["check"] == "tasks")
    # the spinner had the CPU for much of the second (467.6 ms of it once, beside a busy host), and is named with its pid
    assert f"({spin.pid})" in ran["evidence"] and ran["remedy_kind"] == "runtime", ran
    ms = float(ran["evidence"].split(f"({spin.pid}) ")[1].split(" ms")[0])
    assert 250 < ms <= 1_050, ran
    # and in the structured list, the longest first
    assert all(set(x) == RAN for x in j["ran"]) and j["ran"][0]["tid"] == spin.pid and j["ran"][0]["what"] == "task", j["ran"][:3]
    # audit's own process and its capture's reader ran on the other CPU
    assert "ls-kcapture" not in r.stdout and "loopscope" not in ran["evidence"], ran
    # the set-up is read: the command line's isolation, and the machine's own figures as evidence
    checks = {f["check"] for f in j["findings"]}
    if "isolcpus=" not in Path("/proc/cmdline").read_text():
        assert "isolcpus" in checks
    assert "affinity" in checks  # at least the spinner may run there
    rt = Path("/proc/sys/kernel/sched_rt_runtime_us").read_text().strip()
    assert ("sched_rt_runtime_us" in checks) == (rt != "-1")


def test_a_cpu_the_machine_lacks_or_a_list_that_is_none_is_a_clear_error(cli: Cli, beside: None) -> None:
    n = os.cpu_count() or 1
    assert_clean_error(cli("audit", "--cpus", str(n + 5)), 2, f"no CPU {n + 5}")
    assert_clean_error(cli("audit", "--cpus", "one"), 2, "not a CPU list")
    assert_clean_error(cli("audit", "--cpus", "1", "--for", "1ms"), 2, "--for")


def test_check_lists_the_set_up_findings_of_the_cpus_the_probes_are_pinned_to(cli: Cli, tmp_path: Path) -> None:
    _cpu1()
    spec = tmp_path / "c.yaml"
    spec.write_text("name: c\nprobes: [{kind: timer, interval_us: 1000, cpu: [1]}]\nduration: 1s\n")
    r = cli("check", str(spec))
    assert r.returncode == 0, r.stderr
    assert "the probes' CPU 1:" in r.stdout and "loopscope audit --cpus 1" in r.stdout, r.stdout
    # what the machine says of CPU 1 is among them: the workqueue mask, when it includes CPU 1
    wq = int(Path("/sys/devices/virtual/workqueue/cpumask").read_text().strip().replace(",", ""), 16)
    assert ("    workqueue: unbound workqueues may run on CPU 1" in r.stdout) == bool(wq >> 1 & 1), r.stdout


@pytest.mark.needs_root
def test_audit_gives_its_thread_back_its_cpus_unless_someone_changed_them_during_the_watch(lab: None) -> None:
    _cpu1()
    after: dict[bool, set[int]] = {}

    def watch(meddle: bool) -> None:
        os.sched_setaffinity(0, {0, 1})
        if meddle:
            # an isolation that ends during the watch gives the thread its own CPUs back (here: another set)
            tid = threading.get_native_id()
            threading.Timer(0.4, lambda: os.sched_setaffinity(tid, {1})).start()
        audit([1], 1.0)
        after[meddle] = os.sched_getaffinity(0)

    for meddle in (False, True):
        t = threading.Thread(target=watch, args=(meddle,))
        t.start()
        t.join()
    # left alone, audit gives back what it found; changed meanwhile, it keeps the change rather than undo it
    assert after == {False: {0, 1}, True: {1}}, after
