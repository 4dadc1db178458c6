"""The kernel capture: a tracefs instance of its own, a SCHED_IDLE reader,
pages decoded against the kernel's own text, losses placed, damage said,
and nothing left behind on any way out."""

from __future__ import annotations

import json
import os
import re
import signal
import subprocess
import sys
import time
from pathlib import Path

import polars as pl
import pytest

from loopscope.analysis import attribution as A
from loopscope.kernel import capture as C
from loopscope.analysis.threads import thread_names
from loopscope.kernel import store as S
from loopscope.rundir import Capture

pytestmark = pytest.mark.needs_root


def _tracefs() -> Path:
    tf = C.tracefs()
    if tf is None:
        pytest.skip("no tracefs on this kernel")
    return tf


PINGPONG = """
import os, threading
a, b = os.pipe(); c, d = os.pipe()
def echo():
    while True:
        os.read(a, 1); os.write(d, b"y")
threading.Thread(target=echo, daemon=True).start()
while True:
    os.write(b, b"x"); os.read(c, 1)
"""


def test_the_decoder_reads_what_the_kernel_prints_as_text(tmp_path: Path, lab: None) -> None:
    tf = _tracefs()
    cap = C.Capture(tmp_path / "k", ["sched:sched_switch", "sched:sched_wakeup", "irq:softirq_entry"], buffer_mb=4, name=f"loopscope-{os.getpid()}")
    meta = cap.start()
    assert meta.refused is None, meta
    try:
        subprocess.run(["sh", "-c", "for i in 1 2 3 4 5 6 7 8; do sleep 0.01; done"], check=True)
        # Freeze the buffers, read the kernel's own text (which does not consume), then drain the same events.
        (tf / "instances" / cap.name / "tracing_on").write_text("0")
        text = (tf / "instances" / cap.name / "trace").read_text()
        cap.drain("golden")
    finally:
        cap.stop()
    pat = re.compile(r"sched_switch: prev_comm=.* prev_pid=(\d+) prev_prio=-?\d+ prev_state=(\S+) ==> next_comm=(.*) next_pid=(\d+)")
    want = sorted((int(m[1]), m[2][0], m[3].strip(), int(m[4])) for m in pat.finditer(text))
    st = S.open_dir(tmp_path / "k")
    df = st.load(0, 1 << 62)
    sw = df.filter(pl.col("event") == "sched_switch")
    got = sorted((r["target"], r["prev_state"], r["next_comm"], r["next_pid"]) for r in sw.iter_rows(named=True))
    assert len(want) > 10
    assert got == want
    soft = sorted(re.findall(r"softirq_entry: vec=\d+ \[action=(\w+)\]", text))
    assert sorted(df.filter(pl.col("event") == "softirq_entry")["name"].to_list()) == soft


def test_the_readers_set_up_is_counted_apart_inside_its_cpu_time(tmp_path: Path, lab: None) -> None:
    # its start and the ring buffers it asks for (zeroed by the kernel on its clock) before anything is recorded
    _tracefs()
    cap = C.Capture(tmp_path / "k", ["sched:sched_switch"], buffer_mb=32, name=f"loopscope-{os.getpid()}")
    assert cap.start().refused is None
    try:
        cap.drain("one")
    finally:
        meta = cap.stop()
    assert meta.reader_setup_cpu_s is not None and meta.reader_cpu_s is not None
    # /proc counts the whole in clock ticks, the reader its set-up exactly: a tick or two apart at most
    assert 0 < meta.reader_setup_cpu_s <= meta.reader_cpu_s + 0.03, (meta.reader_setup_cpu_s, meta.reader_cpu_s)


FAULTER = """
import mmap, time
for _ in range(20):
    m = mmap.mmap(-1, 1 << 20)
    for i in range(0, 1 << 20, 4096):
        m[i] = 1
    m.close()
    time.sleep(0.002)
"""


def test_per_thread_events_leave_out_the_lab_and_its_loads_but_keep_the_rest(tmp_path: Path, lab: None) -> None:
    _tracefs()
    events = ["sched:sched_switch", "sched:sched_wakeup", "exceptions:page_fault_user", "timer:hrtimer_start"]
    cap = C.Capture(tmp_path / "k", events, buffer_mb=8, name=f"loopscope-{os.getpid()}")
    meta = cap.start()
    assert meta.refused is None, meta
    try:
        for comm in ("ld:flood", "ls-agent", "zoo-measured"):
            # a process is named after the file it executes: a link of that name to Python
            (tmp_path / comm).symlink_to(os.path.realpath(sys.executable))
            subprocess.run([str(tmp_path / comm), "-I", "-c", FAULTER], check=True)
        cap.drain("test")
    finally:
        meta = cap.stop()
    assert meta.unfiltered_events == [] and "ld:*" in (meta.filters or {})["exceptions:page_fault_user"]
    st = S.open_dir(tmp_path / "k")
    df = st.load(0, 1 << 62)
    # named by every switch, out as well as in (this VM does not trace CPU 1's switches out of idle)
    names = thread_names(st)
    faults = df.filter(pl.col("event") == "page_fault_user").with_columns(pl.col("pid").replace_strict(names, default=None).alias("comm"))
    by = faults.group_by("comm").len()
    got = dict(zip(by["comm"], by["len"]))
    assert got.get("zoo-measured", 0) >= 20 * 256  # every page it touched
    assert got.get("ld:flood", 0) == 0 and got.get("ls-agent", 0) == 0
    woken = set(df.filter(pl.col("event") == "sched_wakeup")["target_comm"].to_list())
    assert "zoo-measured" in woken and "ld:flood" not in woken and "ls-agent" not in woken
    timers = df.filter(pl.col("event") == "hrtimer_start").with_columns(pl.col("pid").replace_strict(names, default=None).alias("comm"))
    assert "zoo-measured" in set(timers["comm"].to_list()) and "ld:flood" not in set(timers["comm"].to_list())


def test_the_reader_is_named_for_the_lab_and_runs_at_sched_idle(tmp_path: Path, lab: None) -> None:
    tf = _tracefs()
    cap = C.Capture(tmp_path / "k", ["sched:sched_switch"], buffer_mb=2, name=f"loopscope-{os.getpid()}")
    assert cap.start().refused is None
    try:
        assert cap.proc is not None
        pid = cap.proc.pid
        assert Path(f"/proc/{pid}/comm").read_text().strip() == "ls-kcapture"
        assert os.sched_getscheduler(pid) == os.SCHED_IDLE
        assert (tf / "instances" / cap.name).is_dir()
        assert (tf / "instances" / cap.name / "trace_clock").read_text().find("[mono]") >= 0
    finally:
        meta = cap.stop()
    assert not (tf / "instances" / cap.name).exists()
    assert (meta.reader or {}).get("segments", 0) >= 1 and meta.data
    assert A.task_label("ls-kcapture", 5) == "lab: capture"


def test_an_agent_killed_with_sigkill_leaves_no_instance(tmp_path: Path, lab: None) -> None:
    tf = _tracefs()
    code = (
        f"import time; from pathlib import Path; from loopscope.kernel.capture import Capture\n"
        f"c = Capture(Path({str(tmp_path / 'k')!r}), ['sched:sched_switch'], buffer_mb=2, name='loopscope-killtest{os.getpid()}')\n"
        "m = c.start(); print(m.refused, flush=True); time.sleep(60)\n"
    )
    p = subprocess.Popen([sys.executable, "-c", code], stdout=subprocess.PIPE, text=True)
    assert p.stdout is not None and p.stdout.readline().strip() == "None"
    inst = tf / "instances" / f"loopscope-killtest{os.getpid()}"
    assert inst.is_dir()
    p.send_signal(signal.SIGKILL)
    p.wait()
    p.stdout.close()
    end = time.monotonic() + 10
    while inst.exists() and time.monotonic() < end:
        time.sleep(0.05)
    assert not inst.exists()
    # What it read on its way out is a whole segment.
    assert S.open_dir(tmp_path / "k").problems == []


def test_cleanup_removes_an_instance_whose_owner_is_gone(lab: None) -> None:
    # (lab: cleanup looks at the whole machine, and takes what no live run has registered yet)
    tf = _tracefs()
    dead = 4_000_000
    while Path(f"/proc/{dead}").exists():
        dead += 1
    inst = tf / "instances" / f"loopscope-{dead}"
    inst.mkdir()
    # a bench's recording is named for its process too: gone, it is a leftover; alive (this test), it is not
    rec, live = tf / "instances" / f"loopscope-foreign-{dead}", tf / "instances" / f"loopscope-foreign-{os.getpid()}"
    rec.mkdir()
    live.mkdir()
    from loopscope.lab import cleanup

    try:
        actions = cleanup.run()
        assert not inst.exists() and not rec.exists()
        assert any(f"loopscope-{dead}" in a for a in actions) and any(f"loopscope-foreign-{dead}" in a for a in actions)
        assert live.exists()
    finally:
        for d in (inst, rec, live):
            if d.exists():
                d.rmdir()


def test_a_real_overrun_is_counted_and_placed_in_time(tmp_path: Path, lab: None) -> None:
    # A 1 MiB buffer per CPU and two threads switching as fast as they can for
    # a second: the kernel overwrites unread pages, and every dropped event is
    # placed on a CPU between two times inside the capture.
    _tracefs()
    cap = C.Capture(
        tmp_path / "k",
        ["sched:sched_switch", "sched:sched_wakeup", "sched:sched_waking", "sched:sched_stat_runtime"],
        buffer_mb=1,
        name=f"loopscope-{os.getpid()}",
    )
    assert cap.start().refused is None
    spin = subprocess.Popen([sys.executable, "-c", PINGPONG])
    try:
        time.sleep(1.5)
        cap.drain("overrun")
    finally:
        spin.kill()
        spin.wait()
        cap.stop()
    st = S.open_dir(tmp_path / "k")
    if st.lost_events == 0:
        pytest.skip("the kernel kept up with a 1 MiB buffer this time: nothing was lost")
    w = st.lost
    assert not st.unknown_loss
    assert ((w["start_ns"] <= w["end_ns"]) & (w["start_ns"] >= (st.t_first or 0) - 2_000_000_000) & (w["end_ns"] <= (st.t_last or 0) + 2_000_000_000)).all()
    # A window over a loss is incomplete; one far from any is not.
    k = A.Kernel.of(st.load(st.t_first or 0, st.t_last or 0), st.lost_events, st.lost)
    a, b = int(w["start_ns"][0]), int(w["end_ns"][0])
    assert k.lost_in(a, b + 1) is not None


def test_a_damaged_segment_is_said_and_its_span_counts_as_lost(tmp_path: Path, lab: None) -> None:
    _tracefs()
    cap = C.Capture(tmp_path / "k", ["sched:sched_switch", "sched:sched_stat_runtime"], buffer_mb=2, name=f"loopscope-{os.getpid()}")
    assert cap.start().refused is None
    try:
        for i in range(2):
            subprocess.run(["sh", "-c", "for i in 1 2 3 4 5; do sleep 0.01; done"], check=True)
            cap.drain(f"s{i}")
    finally:
        cap.stop()
    d = tmp_path / "k"
    segs = [json.loads(line) for line in (d / "segments.jsonl").read_text().splitlines()]
    first = next(s for s in segs if s.get("file"))
    f = d / first["file"]
    f.write_bytes(f.read_bytes()[: f.stat().st_size // 2])  # cut short, as a kill or a full disk leaves it
    with open(d / "segments.jsonl", "a") as idx:
        idx.write('{"seg": 99, "reason": "asked", "t_fi')  # an index line cut short
    st = S.open_dir(d)
    assert any(first["file"] in p and "unreadable" in p for p in st.problems)
    assert any("cut short" in p for p in st.problems)
    assert st.unknown_loss  # the cut line's losses cannot be placed: every window is incomplete
    assert ((st.lost["start_ns"] == first["t_first_ns"]) & (st.lost["end_ns"] == first["t_last_ns"])).any()
    k = A.Kernel.of(st.load(0, 1 << 62), max(1, st.lost_events), None)
    assert "unknown times" in (k.lost_in(first["t_first_ns"], first["t_last_ns"]) or "")


def test_a_segment_the_disk_has_no_room_for_is_counted_as_lost_on_its_cpus(tmp_path: Path, lab: None) -> None:
    # the capture's directory on a small filesystem, filled once the capture has started: the index's lines fit, a
    # second of switching does not
    _tracefs()
    disk = tmp_path / "small"
    disk.mkdir()
    subprocess.run(["mount", "-t", "tmpfs", "-o", "size=512k", "tmpfs", str(disk)], check=True)
    try:
        cap = C.Capture(disk / "k", ["sched:sched_switch", "sched:sched_wakeup"], buffer_mb=8, name=f"loopscope-{os.getpid()}")
        assert cap.start().refused is None
        fs = os.statvfs(disk)
        (disk / "filler").write_bytes(b"x" * (fs.f_bavail * fs.f_frsize - 16384))
        spin = subprocess.Popen([sys.executable, "-c", PINGPONG])
        try:
            time.sleep(1.0)
            got = cap.drain("full")
        finally:
            spin.kill()
            spin.wait()
            cap.stop()
        segs = [json.loads(line) for line in (disk / "k" / "segments.jsonl").read_text().splitlines()]
        full = next(s for s in segs if s.get("write_error"))
        assert "No space left on device" in full["write_error"] and full["file"] is None
        unwritten = [w for w in full["lost"] if "could not be written" in w["why"]]
        # every event read is lost, on the CPU it was recorded on, over its span there
        assert sum(w["events"] for w in unwritten) == full["events"] > 10_000
        assert all(full["t_first_ns"] <= w["start_ns"] <= w["end_ns"] <= full["t_last_ns"] for w in unwritten)
        assert got["lost_events"] >= full["events"]
        assert not list((disk / "k" / "events").glob("*.tmp"))
        st = S.open_dir(disk / "k")
        assert st.lost_events >= full["events"]
    finally:
        subprocess.run(["umount", str(disk)], check=False)


def test_a_tracepoint_the_kernel_lacks_is_named_not_fatal(tmp_path: Path) -> None:
    _tracefs()
    have, lack, refused = C.available(["sched:sched_switch", "nosuch:event"])
    assert refused is None and have == ["sched:sched_switch"] and lack == ["nosuch:event"]


def test_buffers_are_sized_for_the_longest_window_within_memory() -> None:
    short, _ = C.size_buffers(2.0)
    long, why = C.size_buffers(600.0)
    assert C.MIN_BUFFER_MB <= short < long <= C.MAX_BUFFER_MB
    assert "window" in why or "step" in why
    asked, why = C.size_buffers(2.0, 7)
    assert asked == 7 and "buffer_mb" in why


@pytest.mark.parametrize(
    ("comm", "pid", "label"),
    [
        ("ls-kcapture", 1, "lab: capture"),
        ("ls-netem", 1, "lab: emulator"),
        ("ls-agent", 1, "lab: agent"),
        ("ls-ctl", 1, "lab: agent"),
        ("ls-sync-recv", 1, "lab: sync"),
        ("ls-probe", 1, "lab: probe"),
        ("ld:flood", 1, "load: flood"),
        ("stress-ng", 77, "load: stress"),
        ("polars-3", 1, "thread: polars-3"),
        ("perf", 1, "thread: perf"),
    ],
)
def test_the_lab_and_the_loads_are_named_by_what_they_are(comm: str, pid: int, label: str) -> None:
    assert A.task_label(comm, pid, {77: "load: stress"}) == label


def test_roles_explain_the_kernel_threads_and_the_lab() -> None:
    assert "DAMON" in (A.role_of("thread: kdamond") or "")
    assert A.role_of("lab: capture") and A.role_of("thread: ksoftirqd") and A.role_of("thread: kworker")
    assert A.role_of("load: cpu") and A.role_of("thread: my-app") is None


@pytest.mark.needs_tool("perf")
def test_a_run_recorded_with_perf_record_still_opens(tmp_path: Path, lab: None) -> None:
    r = subprocess.run(
        [
            "perf",
            "record",
            "-q",
            "-a",
            "-k",
            "mono",
            "-e",
            "sched:sched_switch",
            "-e",
            "sched:sched_stat_runtime",
            "-o",
            str(tmp_path / "kernel.perf"),
            "--",
            "sleep",
            "0.3",
        ],
        capture_output=True,
        text=True,
        timeout=60,
    )
    assert r.returncode == 0, r.stderr
    st = S.open_capture(tmp_path, Capture(host="h", data="kernel.perf"))
    assert st.legacy is not None and st.events > 0
    ev = st.load(st.t_first or 0, st.t_last or 0)
    assert set(ev.columns) == set(S.SCHEMA) and (ev["event"] == "sched_switch").any()


def test_a_capture_format_newer_than_this_reader_is_refused_by_name(tmp_path: Path, lab: None) -> None:
    with pytest.raises(S.CaptureError, match="tracefs-segments/9"):
        S.open_capture(tmp_path, Capture(host="h", format="tracefs-segments/9", data="kernel"))
