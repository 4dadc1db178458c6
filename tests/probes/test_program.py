"""The program probe: any instrumented program run with LOOPSCOPE_TRACE set,
standalone and as a probe of a run, its intervals compared and explained."""

from __future__ import annotations

import json
import os
from pathlib import Path

import polars as pl
import pytest

from tests.conftest import ROOT

PERIODIC = ROOT / "examples" / "programs" / "periodic.py"


def test_a_c_program_writes_the_trace_named_by_loopscope_trace(cli, build_c, tmp_path: Path, lab: None) -> None:
    exe = build_c("program_loop.c")
    r = cli("probe", "program", "--json", "--trace", "p.lstrace", "--", str(exe), "150")
    assert r.returncode == 0, r.stderr
    j = json.loads(r.stdout)
    assert j["stopped"] == "exit" and j["exit"] == "exit code 0" and j["wrote_trace"]
    spin = next(i for i in j["intervals"] if i["entity"] == "c/spin")
    assert spin["n"] == 150 and 0 < spin["p50_ns"] <= spin["p99_ns"] <= spin["max_ns"]
    assert j["records"] >= 150 and j["lost_records"] == 0
    # it slept 150 × 1 ms: the wall time says so, and its CPU time is far less
    assert j["wall_ns"] > 150_000_000 and j["user_cpu_ns"] + j["sys_cpu_ns"] < j["wall_ns"]


def test_a_python_program_is_stopped_with_sigint_when_its_time_is_up(cli, lab: None) -> None:
    r = cli("probe", "program", "--json", "--duration", "1500ms", "--trace", "p.lstrace", "--", "python3", str(PERIODIC), "--period-ms", "5")
    assert r.returncode == 0, r.stderr
    j = json.loads(r.stdout)
    assert j["stopped"] == "duration (SIGINT)"
    assert 1.4e9 < j["wall_ns"] < 4e9
    wake = next(i for i in j["intervals"] if i["entity"] == "loop/wake")
    assert 200 < wake["n"] < 320  # 1.5 s at 5 ms


def test_a_program_without_a_trace_is_measured_and_said(cli, lab: None) -> None:
    r = cli("probe", "program", "--json", "--trace", "p.lstrace", "--", "sleep", "0.1")
    assert r.returncode == 0, r.stderr
    j = json.loads(r.stdout)
    assert not j["wrote_trace"] and "LOOPSCOPE_TRACE" in j["note"] and j["records"] == 0


def test_a_failing_or_missing_program_is_an_error_naming_it(cli, beside: None) -> None:
    r = cli("probe", "program", "--", "sh", "-c", "echo boom >&2; exit 3")
    assert r.returncode == 1 and "'sh' failed: exit code 3" in r.stderr and "boom" in r.stderr
    r = cli("probe", "program", "--", "/no/such/program")
    assert r.returncode == 2 and "/no/such/program" in r.stderr and "Traceback" not in r.stderr


def test_a_program_that_outlives_its_timeout_fails_and_is_stopped(cli, lab: None) -> None:
    r = cli("probe", "program", "--until", "exit", "--duration", "300ms", "--", "sleep", "30")
    assert r.returncode == 1 and "did not exit within 0.3 s" in r.stderr


PROG = """name: prog
probes:
  - kind: program
    command: ["python3", "{periodic}", "--period-ms", "2"]
    cpu: [1]
    wakeup: ["loop/wake"]
loads:
  - name: burst
    kind: command
    command: "chrt -f 20 taskset -c 1 python3 -c \\"import ctypes,time; ctypes.CDLL(None).prctl(15, b'ls-burst', 0, 0, 0)\\nwhile True:\\n  t=time.perf_counter()\\n  while time.perf_counter()-t < 0.003: pass\\n  time.sleep(0.017)\\""
phases:
  - {{name: idle}}
  - {{name: burst, loads: [burst]}}
duration: 3s
"""


@pytest.mark.needs_root
@pytest.mark.needs_tool("chrt", "taskset")
def test_a_programs_intervals_are_compared_and_their_outliers_explained(cli, tmp_path: Path, lab: None) -> None:
    (tmp_path / "p.yaml").write_text(PROG.format(periodic=PERIODIC))
    r = cli("run", "p.yaml", "--run-dir", "run", timeout=240)
    assert r.returncode == 0, r.stderr
    run = tmp_path / "run"
    prog = pl.read_parquet(run / "tables" / "program.parquet")
    assert set(prog["interval"].unique()) == {"loop/wake", "loop/work"}
    comp = pl.read_parquet(run / "tables" / "comparisons.parquet").filter(pl.col("kind") == "program")
    assert set(comp["measure"].unique()) == {"loop/wake", "loop/work"}
    ex = json.loads((run / "explain.json").read_text())
    wake = next(g for g in ex["groups"] if g["probe"] == "program loop/wake" and g["phase"] == "burst")
    # The burst is the thread that delays the loop's wake-ups most; on this
    # shared VM late wake-ups of the CPU itself (idle exits, the hypervisor)
    # can still outweigh it in a 3 s phase, so it need not be the top cause.
    threads = [c for c in wake["causes"] if c["cause"].startswith(("thread: ", "load: "))]
    assert threads and threads[0]["cause"] == "load: burst" and threads[0]["share"] >= 0.1, wake["causes"]
    idle = next(g for g in ex["groups"] if g["probe"] == "program loop/wake" and g["phase"] == "idle")
    assert all(c["cause"] != "load: burst" for c in idle["causes"])
    work = next(g for g in ex["groups"] if g["probe"] == "program loop/work" and g["phase"] == "idle")
    # a work interval's own time is "running", never a wake-up's "CPU idle"
    assert any(c["cause"] == "running" for c in work["causes"]) and all(c["cause"] != "CPU idle" for c in work["causes"])
    html = (run / "report.html").read_text()
    assert "loop/wake" in html and "program loop/work" in html


def test_a_failing_program_fails_the_run_and_says_which_probe(cli, tmp_path: Path, lab: None) -> None:
    (tmp_path / "f.yaml").write_text(
        "name: f\nprobes: [{kind: program, name: mine, command: 'sh -c \"echo broken >&2; exit 5\"'}]\nduration: 1s\nkernel: {capture: 'off'}\n"
    )
    r = cli("run", "f.yaml", "--run-dir", "run", "--no-report", timeout=120)
    assert r.returncode == 1
    assert "probe mine" in r.stderr and "exit code 5" in r.stderr


def test_a_program_probe_without_a_command_is_bad_input(cli, tmp_path: Path) -> None:
    (tmp_path / "b.yaml").write_text("name: b\nprobes: [{kind: program, command: ''}]\n")
    r = cli("check", "b.yaml")
    assert r.returncode == 2 and "command" in r.stderr and "Traceback" not in r.stderr


def test_mlock_has_loopscopes_library_lock_the_programs_memory_when_it_opens_its_trace(cli, tmp_path: Path, lab: None) -> None:
    prog = tmp_path / "locked.py"
    prog.write_text(
        "import sys\n"
        "from loopscope.trace import api\n"
        "api.open().close()\n"
        "lck = next(l for l in open('/proc/self/status') if l.startswith('VmLck:'))\n"
        "sys.stderr.write('LOCKED ' + lck.split()[1] + '\\n')\n"
    )
    for flag, want in ((["--mlock"], "mlockall"), ([], None)):
        r = cli("probe", "program", "--json", *flag, "--trace", str(tmp_path / "p.lstrace"), "--", "python3", str(prog))
        assert r.returncode == 0, r.stderr
        j = json.loads(r.stdout)
        kib = int(r.stderr.split("LOCKED ")[1].split()[0])
        assert j["memory_locked"] == want and (kib > 0) == bool(flag), (j, kib)


def test_a_programs_trace_writer_runs_at_sched_idle_unless_its_env_says_otherwise(cli, tmp_path: Path, lab: None) -> None:
    prog = tmp_path / "writer.py"
    prog.write_text(
        "import os, sys, threading\n"
        "from loopscope.trace import api\n"
        "s = api.open()\n"
        "api.flush()\n"  # the writer names itself and sets its policy when it starts: flush returns once it has run
        "tid = next(int(t) for t in os.listdir('/proc/self/task') if open(f'/proc/self/task/{t}/comm').read().strip() == 'loopscope-wr')\n"
        "sys.stderr.write('POLICY %d\\n' % os.sched_getscheduler(tid))\n"
        "s.close()\n"
    )
    for env, want in (([], os.SCHED_IDLE), (["--env", "LOOPSCOPE_WRITER_IDLE=0"], os.SCHED_OTHER)):
        r = cli("probe", "program", "--json", *env, "--trace", str(tmp_path / "w.lstrace"), "--", "python3", str(prog))
        assert r.returncode == 0, r.stderr
        assert int(r.stderr.split("POLICY ")[1].split()[0]) == want, r.stderr
