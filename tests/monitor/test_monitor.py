"""``loopscope monitor`` for real: a 2 ms SCHED_FIFO burst every second on
the timer probe's CPU, every outlier above the threshold kept and named,
the histograms HdrHistogram's own reader reads, a signal closing the open
period, ``kill -9`` leaving nothing behind and ``--resume`` going on."""

from __future__ import annotations

import json
import re
import os
import shutil
import signal
import subprocess
import time
from pathlib import Path
from typing import Callable

from loopscope.rundir.monitor import MonitorJson

import pytest

from loopscope import cbuild
from loopscope.lab import state
from loopscope.monitor import hist, pack
from loopscope.monitor.keeper import Keeper, Outlier
from loopscope.spec.models import MonitorSettings
from tests.conftest import BIN, Cli

ZOO = Path(__file__).resolve().parents[2] / "python" / "loopscope" / "bench" / "zoo_inject.c"
pytestmark = [pytest.mark.needs_root]


@pytest.fixture(scope="module")
def burst_spec(tmp_path_factory: pytest.TempPathFactory) -> Path:
    if not Path("/sys/kernel/tracing/instances").is_dir() and not Path("/sys/kernel/debug/tracing/instances").is_dir():
        pytest.skip("needs tracefs for the flight recorder")
    if (os.cpu_count() or 1) < 2:
        pytest.skip("needs 2 CPUs: the probe's and the monitor's")
    d = tmp_path_factory.mktemp("mon")
    zoo = d / "ls-zoo"
    subprocess.run([cbuild.compiler(), "-O2", "-pthread", str(ZOO), "-o", str(zoo)], check=True)
    spec = d / "burst.yaml"
    spec.write_text(f"""name: burst
probes:
  - {{kind: timer, name: t, interval_us: 1000, cpu: [1], priority: 5}}
loads:
  - {{name: burst, kind: command, command: [{zoo}, fifo, --cpu, "1", --prio, "10", --burst-us, "2000", --period-us, "1000000"]}}
monitor: {{period: 3s, threshold: 1ms}}
""")
    return spec


def _periods(out: Path) -> int:
    p = out / "periods.jsonl"
    return len(p.read_text().splitlines()) if p.exists() else 0


def _wait_periods(out: Path, n: int, timeout_s: float = 60.0) -> None:
    """Until ``out`` has ``n`` closed periods (or the timeout: the test's own asserts say what is missing)."""
    deadline = time.monotonic() + timeout_s
    while time.monotonic() < deadline and _periods(out) < n:
        time.sleep(0.1)


def _left(pid: int) -> list[str]:
    """Processes of a monitor (its descendants by name) and loopscope's trace instances still there."""
    ps = subprocess.run(["ps", "-eo", "comm="], capture_output=True, text=True).stdout.split()
    procs = [c for c in ps if c.startswith(("ls-agent", "ls-kcapture", "ls-zoo", "ls-probe", "ls-ctl", "ld:"))]
    inst = [p.name for p in Path("/sys/kernel/tracing/instances").iterdir() if p.name.startswith("loopscope-mon")]
    return procs + inst


def sigterm_after(p: subprocess.Popen[str], ready: Callable[[], None]) -> tuple[MonitorJson, float]:
    """Once ``ready`` returns, SIGTERM to the monitor ``p``: its record
    (``--json``'s line) and how long it took to exit; it must exit 130."""
    try:
        ready()
        t = time.monotonic()
        p.send_signal(signal.SIGTERM)
        stdout, stderr = p.communicate(timeout=30)
        took = time.monotonic() - t
    finally:
        if p.poll() is None:
            p.kill()
            p.wait()
    assert p.returncode == 130, stderr
    return json.loads(stdout.strip().splitlines()[-1]), took


def test_every_burst_outlier_is_kept_and_named_and_sigterm_closes_the_period_with_exit_130(burst_spec: Path, tmp_path: Path, lab: None) -> None:
    out = tmp_path / "m"
    p = subprocess.Popen([str(BIN), "monitor", str(burst_spec), "-o", str(out), "--json"], stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)

    # two whole periods, then SIGTERM inside the third
    def two_periods() -> None:
        _wait_periods(out, 2)
        time.sleep(1.5)

    rec, took = sigterm_after(p, two_periods)
    assert took < 5, took
    assert rec["status"] == "interrupted" and rec["periods"] == 3
    rows = [json.loads(x) for x in (out / "periods.jsonl").read_text().splitlines()]
    assert [r["period"] for r in rows] == [1, 2, 3]
    assert rows[2]["interrupted"] is True and rows[2]["count"] > 0  # the open period was closed, not lost
    # HdrHistogram's own log reader gets every period back, with every value
    hs = hist.read_log(out / "histograms" / "t.hlog")
    assert [h.get_total_count() for h in hs] == [r["count"] for r in rows]
    assert all(abs(h.get_max_value() - r["max_ns"]) <= r["max_ns"] / 1000 for h, r in zip(hs, rows))
    # one burst a second: every outlier above 1 ms kept, and named for the burst
    # (the probe is SCHED_FIFO below the burst: only the burst can hold it up a millisecond)
    c = rec["counts"]
    outl = [json.loads(x) for x in (out / "outliers.jsonl").read_text().splitlines()]
    assert len(outl) == c["outliers_above"] >= 4
    assert c["kept"] == c["outliers_above"] and not c["not_kept"], c
    # Every burst while the probe measured made one, named for it; what else
    # came above 1 ms is this VM's own (its host's threads, a vCPU not run),
    # and it is explained too: one cause takes most of each outlier.
    named = [o for o in outl if o["top_cause"] == "load: burst"]
    bursts = int(sum(r["seconds"] for r in rows))
    assert len(named) >= bursts - 2, ([o["top_cause"] for o in outl], bursts)
    # the burst's own are whole and the burst takes most of each; the VM's own are kept and named
    assert all(o["complete"] and o["causes"][0]["share"] > 0.5 for o in named), named
    assert all(o["window"] and o["top_cause"] for o in outl), [(o["top_cause"], o.get("missing"), o.get("causes")) for o in outl]
    assert all(o["latency_ns"] > 1_000_000 for o in outl)
    # the periods' windows were packed (one store each), and every outlier's window is found in its pack
    wd = out / "windows"
    assert sorted(d.name for d in wd.iterdir()) and all(pack.PACK.match(d.name) for d in wd.iterdir())
    for o in outl:
        f = pack.find(wd, o["window"])
        assert f is not None and f.t0 < f.t1 and len(f.store.load(f.t0, f.t1)) > 0, o
    assert _left(p.pid) == []
    # what the recorder recorded is written down: the probe is a pinned timer, so only its CPU (and wake-ups aimed there)
    said = json.loads((out / "kernel" / "recorder.json").read_text())
    assert said["filters"]["sched:sched_switch"] == "CPU == 1" and "target_cpu == 1" in said["filters"]["sched:sched_waking"], said
    # the monitor's page: per probe the run's histogram, the maxima, the heat map; the causes ranked
    r = subprocess.run([str(BIN), "report", str(out)], capture_output=True, text=True, timeout=120)
    assert r.returncode == 0, r.stderr
    page = (out / "report.html").read_text()
    assert page.count("<svg") == 3 and "Causes of the kept outliers" in page and "load: burst" in page


@pytest.mark.parametrize("recorder", ["alternate", "pause"])
def test_the_other_flight_recorders_keep_and_name_every_burst_too(burst_spec: Path, tmp_path: Path, recorder: str, lab: None) -> None:
    spec = tmp_path / "r.yaml"
    spec.write_text(burst_spec.read_text().replace("threshold: 1ms}", f"threshold: 1ms, recorder: {recorder}}}"))
    out = tmp_path / "m"
    r = subprocess.run([str(BIN), "monitor", str(spec), "-o", str(out), "--for", "7s", "--json"], capture_output=True, text=True, timeout=120)
    assert r.returncode == 0, r.stderr
    rec = json.loads(r.stdout.strip().splitlines()[-1])
    assert rec["settings"]["recorder"] == recorder and rec["recorder"] == f"flight recorder ({recorder})"
    outl = [json.loads(x) for x in (out / "outliers.jsonl").read_text().splitlines()]
    bursts = int(sum(json.loads(x)["seconds"] for x in (out / "periods.jsonl").read_text().splitlines()))
    assert len([o for o in outl if o["top_cause"] == "load: burst"]) >= bursts - 2, outl
    assert rec["counts"]["kept"] == rec["counts"]["outliers_above"], rec["counts"]


def test_kill_9_leaves_nothing_running_and_resume_goes_on_from_the_directory(burst_spec: Path, tmp_path: Path, lab: None) -> None:
    out = tmp_path / "m"
    p = subprocess.Popen([str(BIN), "monitor", str(burst_spec), "-o", str(out)], stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
    try:
        _wait_periods(out, 1)
        time.sleep(1.0)
        # a second monitor on the directory is refused, naming the first
        r = subprocess.run([str(BIN), "monitor", str(burst_spec), "--resume", str(out)], capture_output=True, text=True, timeout=60)
        assert r.returncode == 2 and f"pid {p.pid}" in r.stderr and "Traceback" not in r.stderr
        p.kill()
        p.wait()
    finally:
        if p.poll() is None:
            p.kill()
            p.wait()
    t = time.monotonic()
    while _left(p.pid) and time.monotonic() - t < 5:
        time.sleep(0.1)
    assert _left(p.pid) == []
    r = subprocess.run([str(BIN), "monitor", str(burst_spec), "--resume", str(out), "--for", "4s", "--json"], capture_output=True, text=True, timeout=120)
    assert r.returncode == 0, r.stderr
    rec = json.loads(r.stdout.strip().splitlines()[-1])
    assert rec["status"] == "completed" and any(f"pid {p.pid}" in n for n in rec["notes"])
    # the killed monitor's session is no longer registered as running (what `loopscope cleanup` would remove)
    assert [i.run_id for i in state.registered() if i.controller_pid == p.pid] == []
    rows = [json.loads(x) for x in (out / "periods.jsonl").read_text().splitlines()]
    assert [r["period"] for r in rows] == list(range(1, len(rows) + 1)) and len(rows) >= 2
    assert rec["probes"]["t"]["count"] == sum(r["count"] for r in rows)  # the whole run's histogram carries on
    assert len(list((out / "sessions").iterdir())) == 2


@pytest.mark.parametrize(
    "field,value,says",
    [("threshold", "soon", "threshold"), ("period", "500ms", "period"), ("retain", "10kB", "retain"), ("metrics", "agent", "metrics: agent serves")],
)
def test_a_bad_monitor_setting_is_refused_naming_its_field(cli: Cli, tmp_path: Path, field: str, value: str, says: str, beside: None) -> None:
    f = tmp_path / "bad.yaml"
    f.write_text(f"name: bad\nprobes:\n  - {{kind: timer, interval_us: 1000}}\nmonitor:\n  {field}: {value}\n")
    r = cli("monitor", str(f), "-o", str(tmp_path / "m"))
    assert r.returncode == 2 and f"monitor.{says}" in r.stderr and "Traceback" not in r.stderr, r.stderr
    assert not (tmp_path / "m").exists()  # (metrics: agent is refused without --metrics, naming it)


def test_a_monitor_refused_in_preflight_makes_no_directory(cli: Cli, tmp_path: Path, beside: None) -> None:
    f = tmp_path / "cpu.yaml"
    f.write_text("name: cpu\nprobes:\n  - {kind: timer, interval_us: 1000, cpu: [4096]}\nmonitor: {period: 1m, threshold: 200us}\n")
    r = cli("monitor", str(f), "-o", str(tmp_path / "m"))
    assert r.returncode == 2 and "probes.0.cpu: CPU 4096 is not available" in r.stderr, r.stderr
    assert not (tmp_path / "m").exists()


def test_a_spec_without_a_monitor_mapping_is_refused_saying_what_to_add(cli: Cli, tmp_path: Path, beside: None) -> None:
    f = tmp_path / "plain.yaml"
    f.write_text("name: plain\nprobes:\n  - {kind: timer, interval_us: 1000}\nduration: 1s\n")
    r = cli("monitor", str(f))
    assert r.returncode == 2 and "monitor:" in r.stderr and "Traceback" not in r.stderr


def test_histogram_batches_land_in_the_buckets_hdrhistogram_gives_one_value_at_a_time() -> None:
    import numpy as np

    v = np.random.default_rng(7).integers(1, 10**11, 50_000)
    a, b = hist.new(), hist.new()
    hist.record(a, v)
    for x in v:
        b.record_value(int(x))
    assert a.equals(b)


def _free_port() -> int:
    import socket

    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


@pytest.mark.needs_tool("prometheus")
def test_a_real_prometheus_scraping_the_endpoint_answers_the_p99_within_one_bucket_of_the_monitor(
    burst_spec: Path, tmp_path: Path, lab: None, beside: None
) -> None:
    import urllib.error
    import urllib.parse
    import urllib.request

    from loopscope.monitor.metrics import BUCKETS

    mport, pport = _free_port(), _free_port()
    (tmp_path / "prom.yml").write_text(
        f"global: {{scrape_interval: 1s}}\nscrape_configs:\n  - job_name: loopscope\n    static_configs: [{{targets: ['127.0.0.1:{mport}']}}]\n"
    )
    prom = subprocess.Popen(
        ["prometheus", f"--config.file={tmp_path / 'prom.yml'}", f"--storage.tsdb.path={tmp_path / 'tsdb'}", f"--web.listen-address=127.0.0.1:{pport}"],
        stdout=subprocess.DEVNULL,
        stderr=subprocess.DEVNULL,
    )
    base = f"http://127.0.0.1:{pport}"

    def get(path: str) -> bytes:
        with urllib.request.urlopen(base + path, timeout=10) as f:
            return bytes(f.read())

    def query(q: str) -> float | None:
        res = json.loads(get("/api/v1/query?" + urllib.parse.urlencode({"query": q})))["data"]["result"]
        return float(res[0]["value"][1]) if res else None

    out = tmp_path / "m"
    mon = None
    try:
        deadline = time.monotonic() + 60
        while time.monotonic() < deadline:
            try:
                get("/-/ready")
                break
            except (urllib.error.URLError, ConnectionError):
                time.sleep(0.3)
        mon = subprocess.Popen(
            [str(BIN), "monitor", str(burst_spec), "-o", str(out), "--for", "30s", "--metrics", f"127.0.0.1:{mport}"],
            stdout=subprocess.DEVNULL,
            stderr=subprocess.DEVNULL,
        )
        # two periods closed, then a scrape that saw the second's close
        while time.monotonic() < deadline and _periods(out) < 2:
            time.sleep(0.2)
        closed = hist.new()
        for h in hist.read_log(out / "histograms" / "t.hlog"):
            closed.add(h)
        time.sleep(2.5)
        p99_prom = query('histogram_quantile(0.99, loopscope_latency_seconds_bucket{probe="t"})')
        count_prom = query('loopscope_latency_seconds_count{probe="t"}')
        outliers = query('sum(loopscope_outliers_total{probe="t"})')
    finally:
        if mon is not None:
            mon.send_signal(signal.SIGTERM)
            mon.wait(timeout=30)
        prom.terminate()
        prom.wait(timeout=30)
    assert p99_prom is not None and count_prom is not None, "Prometheus has no sample of the monitor's metrics"
    p99 = hist.quantile(closed, 0.99)
    assert p99 is not None
    # the scrape holds the closed periods and some of the open one's values: at most every value measured by the stop
    assert count_prom >= closed.get_total_count()
    every = hist.new()
    for h in hist.read_log(out / "histograms" / "t.hlog"):
        every.add(h)
    p99_every = hist.quantile(every, 0.99)
    assert p99_every is not None and count_prom <= every.get_total_count()
    edges = [0.0, *[b * 1e9 for b in BUCKETS], float("inf")]

    def bucket(v: float) -> int:
        return next(i for i in range(1, len(edges)) if v <= edges[i])

    # within one bucket of the p99 of what it can have seen (the open period's values made it 538 µs against the closed
    # periods' 141 µs once, beside a loaded test run)
    lo, hi = sorted((bucket(p99), bucket(p99_every)))
    assert lo - 1 <= bucket(p99_prom * 1e9) <= hi + 1, (p99_prom, p99, p99_every)
    assert outliers is not None and outliers >= 1


def test_a_metrics_address_in_use_is_refused_before_anything_starts(cli: Cli, burst_spec: Path, tmp_path: Path, beside: None) -> None:
    import socket

    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        s.listen()
        port = s.getsockname()[1]
        r = cli("monitor", str(burst_spec), "-o", str(tmp_path / "m"), "--metrics", f"127.0.0.1:{port}")
    assert r.returncode == 2 and "--metrics" in r.stderr and "Traceback" not in r.stderr, r.stderr
    assert not (tmp_path / "m").exists()


def test_two_monitors_at_once_leave_each_other_running(burst_spec: Path, tmp_path: Path, lab: None, beside: None) -> None:
    # each session's lab has a run id of its own: one monitor's teardown
    # once killed every process of the other's (both were "001")
    spec = tmp_path / "quiet.yaml"
    spec.write_text("name: quiet\nprobes:\n  - {kind: timer, name: t, interval_us: 1000}\nmonitor: {period: 2s, threshold: 5ms}\n")
    a = subprocess.Popen(
        [str(BIN), "monitor", str(spec), "-o", str(tmp_path / "a"), "--for", "9s", "--json"], stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True
    )
    try:
        time.sleep(1.0)
        b = subprocess.run([str(BIN), "monitor", str(spec), "-o", str(tmp_path / "b"), "--for", "3s"], capture_output=True, text=True, timeout=120)
        assert b.returncode == 0, b.stderr
        out, err = a.communicate(timeout=120)
    finally:
        if a.poll() is None:
            a.kill()
            a.wait()
    assert a.returncode == 0, err
    assert json.loads(out.strip().splitlines()[-1])["status"] == "completed"


def test_a_full_disk_stops_keeping_windows_says_so_and_the_histograms_go_on(burst_spec: Path, tmp_path: Path, lab: None, beside: None) -> None:
    from loopscope.monitor.keeper import DISK_FLOOR

    disk = tmp_path / "disk"
    disk.mkdir()
    subprocess.run(["mount", "-t", "tmpfs", "-o", f"size={(DISK_FLOOR >> 20) + 40}m", "tmpfs", str(disk)], check=True)
    try:
        filler = disk / "filler"
        subprocess.run(["fallocate", "-l", "50m", str(filler)], check=True)  # 54 MB free: under the floor from the start
        out = disk / "m"
        p = subprocess.Popen(
            [str(BIN), "monitor", str(burst_spec), "-o", str(out), "--for", "13s", "--json"], stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True
        )
        try:
            _wait_periods(out, 2)
            filler.unlink()  # room again
            stdout, stderr = p.communicate(timeout=120)
        finally:
            if p.poll() is None:
                p.kill()
                p.wait()
        assert p.returncode == 0, stderr
        rec = json.loads(stdout.strip().splitlines()[-1])
        assert "windows are no longer kept" in stderr and "windows are kept again" in stderr
        assert any("no longer kept" in n for n in rec["notes"])
        c = rec["counts"]
        assert c["not_kept"].get("disk", 0) >= 2 and c["kept"] >= 1, c  # not kept while full, kept again after
        rows = [json.loads(x) for x in (out / "periods.jsonl").read_text().splitlines()]
        assert len(rows) >= 3 and all(r["count"] > 0 for r in rows)  # the histograms went on throughout: two periods full, one after
        assert len(hist.read_log(out / "histograms" / "t.hlog")) == len(rows)
    finally:
        subprocess.run(["umount", "-l", str(disk)], check=False)


@pytest.mark.needs_tool("ip")
def test_an_rr_and_a_pipeline_probe_across_namespaces_take_turns_and_their_outliers_are_named_by_their_windows(tmp_path: Path, lab: None) -> None:
    spec = tmp_path / "net.yaml"
    spec.write_text("""name: net
hosts: [{name: a}, {name: b}]
probes:
  - {kind: rr, name: ping, host: a, dest: b, rate: 500pps}
  - {kind: pipeline, name: pipe, source: a, nodes: [b], sink: a, rate: 500pps, size: 256, work_us: 20}
loads:
  - {name: cpu, kind: cpu, level: 1}
monitor: {period: 2s, threshold: 100us}
""")
    out = tmp_path / "m"
    r = subprocess.run([str(BIN), "monitor", str(spec), "-o", str(out), "--for", "9s", "--json"], capture_output=True, text=True, timeout=180)
    assert r.returncode == 0, r.stderr
    rows = [json.loads(x) for x in (out / "periods.jsonl").read_text().splitlines()]
    # one probe measures at a time, in turn
    assert [x["probe"] for x in rows[:2]] == ["ping", "pipe"] and all(x["count"] > 0 for x in rows), rows
    outl = [json.loads(x) for x in (out / "outliers.jsonl").read_text().splitlines()]
    # the rr probe's windows are its client's round trips; the pipeline's, each stage's wait for its message
    probes = {o["probe"] for o in outl}
    assert any(p.startswith("ping client") for p in probes) and any(p.startswith("pipe ") and "stack" in p for p in probes), probes
    assert all(o["top_cause"] for o in outl if o["window"]), outl
    # every host's part of a period (the echo's, the stages') is gone once its histogram is written
    assert not [p for p in out.glob("sessions/*/hosts/*/steps/*") if p.name != "loads"]


def test_an_uninstrumented_cyclictest_is_monitored_from_its_threads_own_kernel_events_and_each_burst_is_named(
    burst_spec: Path, tmp_path: Path, lab: None
) -> None:
    if shutil.which("cyclictest") is None:
        pytest.skip("needs cyclictest (rt-tests)")
    spec = tmp_path / "cyc.yaml"
    # cyclictest's thread at SCHED_FIFO 5 on CPU 1, below the burst's 10: each burst holds it up ~2 ms
    spec.write_text(f"""name: cyc
probes:
  - kind: threads
    name: cyc
    command: [cyclictest, -m, -p, "5", -i, "1000", -t, "1", -q, -a, "1"]
    threads: "^cyclictest$"
    cpu: [1]
loads:
  - {{name: burst, kind: command, command: [{burst_spec.parent / "ls-zoo"}, fifo, --cpu, "1", --prio, "10", --burst-us, "2000", --period-us, "1000000"]}}
monitor: {{period: 3s, threshold: 1ms}}
""")
    out = tmp_path / "m"
    p = subprocess.Popen([str(BIN), "monitor", str(spec), "-o", str(out), "--for", "10s", "--json"], stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
    try:
        # while a period runs, only the program's threads are recorded (the probe put its command in set_event_pid)
        deadline = time.monotonic() + 30
        pids: list[str] = []
        while time.monotonic() < deadline and not pids:
            f = Path(f"/sys/kernel/tracing/instances/loopscope-mon{p.pid}-w/set_event_pid")
            pids = f.read_text().split() if f.exists() else []
            pids = [x for x in pids if Path(f"/proc/{x}/comm").exists() and Path(f"/proc/{x}/comm").read_text().strip() == "cyclictest"]
            time.sleep(0.1)
        stdout, stderr = p.communicate(timeout=120)
    finally:
        if p.poll() is None:
            p.kill()
            p.wait()
    assert pids, "the watching capture never listed cyclictest's threads"
    assert p.returncode == 0, stderr
    rows = [json.loads(x) for x in (out / "periods.jsonl").read_text().splitlines()]
    # 1 kHz: every activation of the thread is in its period's histogram (none dropped for an untraced switch-in)
    assert rows and all(r["count"] >= 0.95 * 1000 * r["seconds"] for r in rows), rows
    outl = [json.loads(x) for x in (out / "outliers.jsonl").read_text().splitlines()]
    bursts = int(sum(r["seconds"] for r in rows))
    # every burst while it measured made one, named for it; anything else above 1 ms is this VM's own, explained too
    assert len([o for o in outl if o["top_cause"] == "load: burst"]) >= bursts - 2, (outl, bursts)
    assert all(o["window"] and o["top_cause"] and o["causes"][0]["share"] > 0.5 for o in outl), outl
    rec = json.loads(stdout.strip().splitlines()[-1])
    assert rec["counts"]["kept"] == rec["counts"]["outliers_above"] == len(outl)
    assert _left(p.pid) == [] and not [p for p in out.glob("sessions/*/steps/*") if p.name != "loads"]


def test_a_probe_that_dies_starts_again_with_the_next_period_and_is_counted(tmp_path: Path, lab: None, beside: None) -> None:
    spec = tmp_path / "quiet.yaml"
    spec.write_text("name: quiet\nprobes:\n  - {kind: timer, name: t, interval_us: 1000}\nmonitor: {period: 2s, threshold: 5ms}\n")
    out = tmp_path / "m"
    p = subprocess.Popen([str(BIN), "monitor", str(spec), "-o", str(out), "--for", "9s", "--json"], stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
    try:
        _wait_periods(out, 1)
        time.sleep(0.8)  # inside the second period
        probes = subprocess.run(["pgrep", "-f", f"loopscope.probes.launch .*{out}"], capture_output=True, text=True).stdout.split()
        assert probes
        for pid in probes:
            os.kill(int(pid), signal.SIGKILL)
        stdout, stderr = p.communicate(timeout=120)
    finally:
        if p.poll() is None:
            p.kill()
            p.wait()
    assert p.returncode == 0, stderr
    rec = json.loads(stdout.strip().splitlines()[-1])
    assert rec["status"] == "completed" and rec["probes"]["t"]["probe_restarts"] == 1
    rows = [json.loads(x) for x in (out / "periods.jsonl").read_text().splitlines()]
    assert sum(1 for r in rows if r.get("probe_died")) == 1 and rows[-1].get("probe_died") is None and rows[-1]["count"] > 0


def test_retain_removes_the_oldest_windows_first_and_keeps_the_rest_within_it(tmp_path: Path) -> None:

    for i in range(10):
        d = tmp_path / "windows" / f"{i:07d}" / "events"
        d.mkdir(parents=True)
        (d / "00000.parquet").write_bytes(os.urandom(300_000))
    k = Keeper(tmp_path, MonitorSettings(retain="1MB"), "unused", dict, enabled=False)  # type: ignore[arg-type]
    assert k.counts.kept_bytes >= 3_000_000  # what a resumed monitor finds on disk counts
    k._retain()
    left = sorted(p.name for p in (tmp_path / "windows").iterdir())
    assert left == ["0000007", "0000008", "0000009"] and k.counts.windows_removed == 7
    assert k.counts.kept_bytes <= 1_000_000
    k.stop()


@pytest.mark.needs_tool("script")
def test_the_live_view_on_a_terminal_shows_the_last_periods_values_after_it_closes(burst_spec: Path, tmp_path: Path, lab: None, beside: None) -> None:
    out = tmp_path / "live"
    # a terminal for the live view: script(1) gives the command a pseudo-terminal and copies what it draws
    r = subprocess.run(
        ["script", "-qec", f"{BIN} monitor {burst_spec} -o {out} --for 7s", "/dev/null"],
        capture_output=True,
        text=True,
        timeout=120,
        env={**os.environ, "COLUMNS": "160"},
    )
    assert r.returncode == 0, r.stdout[-2000:]
    frames = re.sub(r"\x1b\[[0-9;?]*[a-zA-Z]", "", r.stdout).replace("\r", "\n")
    assert "loopscope monitor · burst" in frames, frames[-2000:]
    # the last frame (drawn as the monitor ends, its period closed) holds values: the open period's, or the
    # last closed one's said as such (probes take turns, and one not measuring shows its last period)
    rows = re.findall(r"^│ (t(?: \(last period\))?)\s*│\s*([0-9,]+)\s*│", frames, re.M)
    assert rows and int(rows[-1][1].replace(",", "")) > 0, rows[-5:]


def test_an_outlier_handed_to_the_keeper_after_it_stopped_is_counted_and_written_as_not_kept(tmp_path: Path) -> None:
    k = Keeper(tmp_path, MonitorSettings(), "unused", dict, enabled=False)  # type: ignore[arg-type]
    k.start()
    k.put(Outlier("t", "localhost", 1, 1_000_000, 2_000_000, False))
    k.stop()
    # a tail's read that ended after the stop: never left in the queue, never uncounted
    k.put(Outlier("t", "localhost", 1, 9_000_000, 3_000_000, False))
    lines = [json.loads(x) for x in (tmp_path / "outliers.jsonl").read_text().splitlines()]
    assert [(o["t_ns"], o["not_kept"]) for o in lines] == [(1_000_000, "recorder"), (9_000_000, "stopped")]
    assert k.counts.above == 2 and sum(k.counts.not_kept.values()) == 2 and k.counts.kept == 0
