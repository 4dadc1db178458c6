"""Multi-host runs on real network namespaces: the pipeline across hosts, clock
offsets, failures mid-run (a killed agent, a link taken down, Ctrl-C, a
killed controller) and, after every one, nothing left: no namespace, process,
cgroup or state file."""

from __future__ import annotations

import json
import os
import re
import signal
import subprocess
import sys
import tempfile
import time
from pathlib import Path
from typing import Iterator

import polars as pl
import pytest

from loopscope.lab import netns, state
from loopscope.host import procs
from loopscope.host.cgroup import find_root
from tests.conftest import BIN, ROOT, Cli
from tests.lab.test_run import wait_for
from loopscope.kernel.capture import tracefs

pytestmark = [pytest.mark.needs_root, pytest.mark.needs_tool("ip", "ethtool")]

THREE = """name: three
hosts:
  - name: a
  - name: b
  - name: c
links:
  - between: [b, c]
    delay: 2ms
probes:
  - kind: pipeline
    source: a
    nodes: [b, c]
    rate: 500pps
loads:
  - kind: cpu
    host: c
  - {{name: net, kind: net, host: a, dest: "c:9000", rate: 10Mbit}}
duration: {duration}
"""


def leftovers(run_id: str) -> list[str]:
    out = [f"process {p}" for p in procs.pids_of_run(run_id)]
    tag = netns.tag_of(run_id)
    out += [f"namespace {n}" for n in netns.existing() if n.startswith(f"ls-{tag}-")]
    root, _ = find_root()
    if root is not None and (root / run_id).exists():
        out.append(f"cgroup {root / run_id}")
    if (state.state_dir() / f"{run_id}.json").exists():
        out.append("state file")
    return out


def _start(tmp: Path, spec: Path, run_dir: str) -> subprocess.Popen[str]:
    return subprocess.Popen(
        [str(BIN), "run", str(spec), "--run-dir", run_dir, "--no-report"], cwd=tmp, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True
    )


def _pipeline_running(run_id: str) -> bool:
    # A process may exit between the listing and the read: _cmdline says b"" then.
    return any(b"pipe-source" in _cmdline(Path(f"/proc/{p}")) for p in procs.pids_of_run(run_id))


def _agent_of(run_id: str, host: str) -> int:
    info = next(i for i in state.registered() if i.run_id == run_id)
    pid = next(a.pid for a in info.agents if a.host == host)
    assert pid is not None
    return pid


@pytest.fixture(scope="module")
def three(tmp_path_factory: pytest.TempPathFactory, lab: None) -> tuple[Path, subprocess.CompletedProcess[str]]:
    d = tmp_path_factory.mktemp("three")
    spec = d / "three.yaml"
    spec.write_text(THREE.format(duration="1s"))
    r = subprocess.run([str(BIN), "run", str(spec), "--run-dir", "run3"], cwd=d, capture_output=True, text=True, timeout=240)
    return d / "run3", r


@pytest.fixture(autouse=True)
def no_namespace_left(request: pytest.FixtureRequest, lab: None) -> Iterator[None]:
    """No namespace is left that was not there before the test. A test that
    may run beside another (whose namespaces come and go) checks its own run's
    instead (``leftovers``)."""
    if "beside" in request.fixturenames:
        yield
        return
    before = set(netns.existing())
    yield
    assert wait_for(lambda: not set(netns.existing()) - before, 15), set(netns.existing()) - before


def test_a_pipeline_across_three_namespaces_measures_every_hop(three: tuple[Path, subprocess.CompletedProcess[str]]) -> None:
    run_dir, r = three
    assert r.returncode == 0, r.stderr
    run = json.loads((run_dir / "run.json").read_text())
    assert run["status"] == "completed"
    assert run["hosts"] == {"a": "netns", "b": "netns", "c": "netns"}
    msgs = pl.read_parquet(run_dir / "tables" / "pipeline.parquet")
    assert set(msgs["phase"].unique()) == {"baseline", "cpu-1", "net"}
    # the network load's sink on c wrote nothing into the directory the run was started in
    assert not (run_dir.parent / "runs").exists()
    assert {"hop0_net_ns", "node1_stack_ns", "node1_work_ns", "hop1_net_ns", "hop2_net_ns", "e2e_ns"} <= set(msgs.columns)
    # The 2 ms link between b and c is never shorter than 2 ms; the others carry no delay.
    assert msgs["hop1_net_ns"].min() >= 2_000_000
    assert msgs["hop0_net_ns"].median() < 2_000_000
    assert (msgs["e2e_ns"] >= msgs["hop1_net_ns"]).all()
    # Each host's files are under hosts/<name>, the emulator's under netem/.
    for h, f in (("a", "pipeline.source.json"), ("b", "pipeline.node1.json"), ("c", "pipeline.node2.json"), ("a", "pipeline.sink.json")):
        assert (run_dir / "hosts" / h / "steps" / "r01-baseline" / f).exists()
    em = json.loads((run_dir / "netem" / "netem.json").read_text())
    bc = next(l for l in em["links"] if l["name"] == "b->c")
    assert bc["configured"] and bc["forwarded"] > 0 and bc["applied_ns"]["min"] >= 2_000_000
    prov = json.loads((run_dir / "provenance.json").read_text())
    assert "emulator" in prov["lab"]["links"]["mechanism"]
    # Only the delayed link is the emulator's; a -> b and the rest go through the router's kernel.
    assert run["paths"]["b->c"]["mechanism"] == "emulator" and run["paths"]["a->b"]["mechanism"] == "kernel"
    assert prov["lab"]["links"]["paths"]["a->b"]["carried_by"] == "kernel"
    assert next(p for p in em["ports"] if p["host"] == "a")["frames"] == 0
    assert run["router_kernel"]["forwarded"] >= len(msgs)
    # The clock-sync probes took the sync network, not the router.
    cs = run["clocksync"]
    assert cs["network"] == "sync" and all(i["network"] == "sync" and i["dest"].startswith("10.78.") for i in cs["initiators"].values())
    if tracefs() is not None:
        # the stages' kernel-to-application waits are attributed on their hosts' CPUs
        ex = json.loads((run_dir / "explain.json").read_text())
        stacks = {g["probe"] for g in ex["groups"]}
        assert {"pipeline node1 stack (b)", "pipeline node2 stack (c)", "pipeline sink stack (a)"} <= stacks, stacks
    assert leftovers("run3") == []


@pytest.mark.needs_tool("chromium", "chromedriver")
def test_the_network_load_s_probes_leave_no_run_directory_of_their_own(three: tuple[Path, subprocess.CompletedProcess[str]]) -> None:
    run_dir, r = three
    assert r.returncode == 0, r.stderr
    # the sender and the receiver of the net load write into the run's scratch, never into runs/ of the working directory
    assert sorted(p.name for p in run_dir.parent.iterdir()) == ["run3", "three.yaml"]


def test_the_agents_and_the_controller_sleep_while_the_pipeline_measures(three: tuple[Path, subprocess.CompletedProcess[str]]) -> None:
    run_dir, r = three
    assert r.returncode == 0, r.stderr
    groups = json.loads((run_dir / "explain.json").read_text())["groups"]
    assert groups
    # they used to poll every host four times a second: up to 20 % of a group's outlier time
    agent = {f"{g['probe']} {g['phase']}": (g.get("lab") or {}).get("lab: agent", 0.0) for g in groups}
    assert max(agent.values()) <= 0.03, agent


def test_the_multi_host_report_renders_hops_hosts_and_links_in_chromium(three: tuple[Path, subprocess.CompletedProcess[str]]) -> None:
    from selenium.webdriver.common.by import By

    from tests.helpers import chromium, layout_problems

    run_dir, r = three
    assert r.returncode == 0, r.stderr
    assert (run_dir / "report.html").stat().st_size < 1_000_000
    d = chromium(1280, 1600, log=True)
    try:
        d.get((run_dir / "report.html").as_uri())
        sec = d.find_element(By.ID, "probe-pipeline").text
        assert "Probe pipeline" in sec
        # the end-to-end summary first, with the tail beside p50 and p99
        e2e = d.find_element(By.ID, "probe-pipeline").find_element(By.XPATH, "following-sibling::table[1]")
        assert [th.text for th in e2e.find_elements(By.TAG_NAME, "th")] == ["phase", "samples", "p50", "p99", "p99.9", "max", "mean"]
        body = d.find_element(By.TAG_NAME, "body").text
        for text in ("network b → c", "b (node 1): kernel → application", "end to end", "Messages"):
            assert text in body
        assert "10.77.2.2" in d.find_element(By.ID, "hosts").find_element(By.XPATH, "following-sibling::table").text
        links = d.find_element(By.ID, "links").find_element(By.XPATH, "following-sibling::table[1]").text
        assert "b->c" in links and "c->b" in links and "a->b" not in links
        about = d.find_element(By.ID, "links").find_element(By.XPATH, "following-sibling::p[1]").text
        assert "The kernel forwarded a→b, a→c, b→a, c→a" in about and "% of one CPU" in about
        clocks = d.find_element(By.ID, "clocks").find_element(By.XPATH, "following-sibling::table[1]").text
        assert "reference" in clocks and "ppm" in clocks
        assert [e for e in d.get_log("browser") if e["level"] in ("SEVERE", "ERROR")] == []
        # the noise: the queueing fits are one line whose link leads to their table, not a bullet each
        q = d.find_element(By.XPATH, "//p[strong[text()='Queueing inside the hosts']]")
        target = q.find_element(By.LINK_TEXT, "table").get_attribute("href").rsplit("#", 1)[1]
        assert d.find_element(By.ID, target).tag_name == "details" and "kernel → application stages by phase" in q.text
        assert not [li for li in d.find_elements(By.CSS_SELECTOR, "li") if "kernel → application" in li.text and "Erlang" in li.text]
        # the worst outliers: one control per probe and phase
        groups = json.loads((run_dir / "explain.json").read_text())["groups"]
        assert len(d.find_elements(By.CSS_SELECTOR, "details.outliers")) == len(groups)
        # the mislabels: no "None", offsets in the unit that suits them, the traces where they are, the baseline named
        assert "None" not in body and not re.search(r"[+−-]0\.0+\d* ms", body)
        files = d.find_element(By.ID, "files").find_element(By.XPATH, "following-sibling::p[1]").text
        assert "hosts/<host>/steps/<rep>-<phase>/" in files and "tables/pipeline.parquet" in files
        names = [p["name"] for p in json.loads((run_dir / "spec.json").read_text())["phases"]]
        assert f"the baseline phase, {'baseline' if 'baseline' in names else names[0]} (" in body
        # at 1280 px: clocks, links, hops and the causes' tables all fit; no chart text under 11 px
        got = layout_problems(d)
        assert got["wide"] == [] and got["page_width"] <= got["viewport"], got["wide"][:10]
        assert got["small"] == [], got["small"][:10]
        h = d.execute_script("return document.body.scrollHeight")
        d.set_window_size(1280, min(int(h) + 40, 16000))
        out = ROOT / "test-artifacts"
        out.mkdir(exist_ok=True)
        assert d.save_screenshot(str(out / "report-multihost.png"))
    finally:
        d.quit()


def test_a_clock_offset_shifts_the_hosts_monotonic_clock_only(tmp_path: Path) -> None:
    code = "import time; print(time.clock_gettime_ns(time.CLOCK_MONOTONIC), time.time_ns())"
    before_mono, before_rt = time.monotonic_ns(), time.time_ns()
    out = subprocess.run(
        [sys.executable, "-m", "loopscope.lab.nsexec", "--monotonic-ns", "-2500000000", "--", sys.executable, "-c", code],
        capture_output=True,
        text=True,
        check=True,
    ).stdout
    mono, rt = map(int, out.split())
    elapsed = rt - before_rt
    assert abs((mono - before_mono) - elapsed - (-2_500_000_000)) < 200_000_000
    assert 0 <= elapsed < 5_000_000_000


def test_a_stage_killed_inside_the_window_fails_the_run_at_once_naming_it(tmp_path: Path, beside: None) -> None:
    spec = tmp_path / "three.yaml"
    spec.write_text(THREE.format(duration="30s"))
    with _start(tmp_path, spec, "killnode") as p:
        assert wait_for(lambda: _pipeline_running("killnode"), 60)
        node = next(pid for pid in procs.pids_of_run("killnode") if b"pipe-node" in _cmdline(Path(f"/proc/{pid}")))
        t0 = time.monotonic()
        os.kill(node, signal.SIGKILL)
        out, err = p.communicate(timeout=60)
        took = time.monotonic() - t0
    assert p.returncode == 1, err
    # the agents watch their stages: seen at once, not when the 30 s window ends
    assert took < 15, (took, err)
    assert re.search(r"probe pipeline\.node\d on [bc]: .*killed by SIGKILL", err, re.S), err
    assert wait_for(lambda: leftovers("killnode") == [], 15), leftovers("killnode")


def test_a_killed_agent_fails_the_run_on_every_host_and_leaves_nothing(tmp_path: Path, beside: None) -> None:
    spec = tmp_path / "three.yaml"
    spec.write_text(THREE.format(duration="20s"))
    with _start(tmp_path, spec, "killb") as p:
        assert wait_for(lambda: _pipeline_running("killb"), 60)
        os.kill(_agent_of("killb", "b"), signal.SIGKILL)
        out, err = p.communicate(timeout=60)
    assert p.returncode == 1, err
    assert "the agent on b died" in err and "killed by SIGKILL" in err
    run = json.loads((tmp_path / "killb" / "run.json").read_text())
    assert run["status"] == "failed" and run["failed"]["host"] == "b"
    assert wait_for(lambda: leftovers("killb") == [], 15), leftovers("killb")


def test_a_link_taken_down_mid_run_shows_as_lost_messages(tmp_path: Path, cli: Cli, lab: None, beside: None) -> None:
    spec = tmp_path / "three.yaml"
    spec.write_text(
        THREE.format(duration="3s").replace(
            'loads:\n  - kind: cpu\n    host: c\n  - {name: net, kind: net, host: a, dest: "c:9000", rate: 10Mbit}\n', "loads: []\n"
        )
    )
    with _start(tmp_path, spec, "down") as p:
        assert wait_for(lambda: _pipeline_running("down"), 60)
        time.sleep(1.0)
        subprocess.run(["ip", "-n", netns.ns_name(netns.tag_of("down"), "c"), "link", "set", "eth0", "down"], check=True)
        out, err = p.communicate(timeout=120)
    assert p.returncode == 0, err
    r = cli("report", "down")
    assert r.returncode == 0, r.stderr
    st = pl.read_parquet(tmp_path / "down" / "tables" / "stages.parquet")
    sent = st.filter(pl.col("role") == "source")["sent"][0]
    got = st.filter(pl.col("role") == "sink")["unique"][0]
    assert 0 < got < sent
    html = (tmp_path / "down" / "report.html").read_text()
    assert f"{sent - got:,}" in html
    assert leftovers("down") == []


def test_ctrl_c_in_a_multi_host_run_stops_every_host(tmp_path: Path, beside: None) -> None:
    spec = tmp_path / "three.yaml"
    spec.write_text(THREE.format(duration="20s"))
    with _start(tmp_path, spec, "intr") as p:
        assert wait_for(lambda: _pipeline_running("intr"), 60)
        p.send_signal(signal.SIGINT)
        out, err = p.communicate(timeout=60)
    assert p.returncode == 130, err
    assert json.loads((tmp_path / "intr" / "run.json").read_text())["status"] == "interrupted"
    assert wait_for(lambda: leftovers("intr") == [], 15), leftovers("intr")


def test_a_killed_controller_leaves_no_namespace_behind(tmp_path: Path, cli: Cli, beside: None) -> None:
    spec = tmp_path / "three.yaml"
    spec.write_text(THREE.format(duration="20s"))
    with _start(tmp_path, spec, "kill9") as p:
        assert wait_for(lambda: _pipeline_running("kill9"), 60)
        p.send_signal(signal.SIGKILL)
        p.communicate(timeout=30)
    # Agents die with the controller; the reaper deletes the namespaces and the state.
    assert wait_for(lambda: leftovers("kill9") == [], 30), leftovers("kill9")
    assert json.loads((tmp_path / "kill9" / "run.json").read_text())["status"] == "abandoned"


def test_cleanup_removes_namespaces_of_a_run_whose_reaper_was_killed_too(tmp_path: Path, cli: Cli, lab: None) -> None:
    spec = tmp_path / "three.yaml"
    spec.write_text(THREE.format(duration="20s"))
    with _start(tmp_path, spec, "kill10") as p:
        assert wait_for(lambda: _pipeline_running("kill10"), 60)
        reapers = [int(d.name) for d in Path("/proc").iterdir() if d.name.isdigit() and b"loopscope.lab.reaper\x00kill10" in _cmdline(d)]
        assert reapers
        for r in reapers:
            os.kill(r, signal.SIGKILL)
        p.send_signal(signal.SIGKILL)
        p.communicate(timeout=30)
    assert wait_for(lambda: not procs.pids_of_run("kill10"), 20)
    assert any(n.startswith(f"ls-{netns.tag_of('kill10')}-") for n in netns.existing())
    r = cli("cleanup")
    assert r.returncode == 0 and "network namespaces" in r.stdout, r.stdout
    assert leftovers("kill10") == []


def _cmdline(d: Path) -> bytes:
    try:
        return (d / "cmdline").read_bytes()
    except OSError:
        return b""


def test_preflight_names_the_host_or_link_at_fault(tmp_path: Path, cli: Cli, lab: None) -> None:
    spec = tmp_path / "bad.yaml"
    spec.write_text(
        "name: bad\nhosts:\n  - {name: a}\n  - {name: b, address: 10.77.1.9}\n  - {name: c}\n"
        "links:\n  - {between: [a, zz], delay: 1ms}\n"
        "probes:\n  - {kind: pipeline, source: a, nodes: [q]}\nduration: 1s\n"
    )
    r = cli("run", str(spec))
    assert r.returncode == 2, r.stderr
    assert "links.0: link to a host that does not exist: 'zz'" in r.stderr
    assert "probes.0.nodes.0: no host named 'q'" in r.stderr
    # b's explicit address falls in a's automatic subnet.
    spec.write_text("name: clash\nhosts:\n  - {name: a}\n  - {name: b, address: 10.77.1.9}\nprobes:\n  - {kind: timer, host: b}\nduration: 1s\n")
    r = cli("run", str(spec))
    assert r.returncode == 2 and "host b: address 10.77.1.9 clashes with host a's subnet" in r.stderr, r.stderr
    assert not list(tmp_path.glob("runs/*"))


def test_preflight_refuses_what_the_sync_network_and_the_emulator_cannot_do(tmp_path: Path, cli: Cli, lab: None) -> None:
    spec = tmp_path / "bad.yaml"
    spec.write_text(
        "name: bad\nhosts:\n  - {name: a}\n  - {name: b, address: 10.78.5.2, sync_address: 10.9.9.9}\n"
        "emulator: {cpu: 4000, poll: true}\nprobes:\n  - {kind: timer, host: b}\nduration: 1s\n"
    )
    r = cli("run", str(spec))
    assert r.returncode == 2, r.stderr
    assert "hosts.1.sync_address: only ssh and exec hosts take one" in r.stderr
    assert "emulator.cpu: CPU 4000 is not one this process may use" in r.stderr
    assert "address 10.78.5.2 lies in 10.78.0.0/16" in r.stderr and "clocksync.network: experiment" in r.stderr
    assert "Traceback" not in r.stderr and not list(tmp_path.glob("runs/*"))


def test_netns_hosts_without_privileges_are_refused_at_preflight(lab: None) -> None:
    # A directory the unprivileged user can read and write (pytest's tmp_path is private to root).
    with tempfile.TemporaryDirectory(prefix="loopscope-nopriv-") as d:
        work = Path(d)
        os.chmod(work, 0o777)
        spec = work / "ns.yaml"
        spec.write_text("name: ns\nhosts:\n  - {name: a, kind: netns}\n  - {name: b, kind: netns}\nprobes:\n  - {kind: timer, host: a}\nduration: 1s\n")
        spec.chmod(0o644)
        r = subprocess.run(
            ["setpriv", "--reuid=65534", "--regid=65534", "--clear-groups", "--inh-caps=-all", str(BIN), "run", str(spec), "--results", str(work / "runs")],
            capture_output=True,
            text=True,
            timeout=120,
            cwd=work,
            env={**os.environ, "HOME": str(work)},
        )
        assert r.returncode == 2, r.stderr
        assert "hosts a, b: netns hosts cannot be created" in r.stderr and "root" in r.stderr, r.stderr
        assert not (work / "runs").exists() or not list((work / "runs").iterdir())
