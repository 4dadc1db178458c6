"""The agent's JSON-lines protocol, spoken to a real agent process."""

from __future__ import annotations

import json
import os
import subprocess
import threading
import sys
import time
from pathlib import Path
from typing import Any

from loopscope.host import procs
from tests.helpers import wait_gone


class Agent:
    def __init__(self, run_id: str) -> None:
        env = procs.child_env(run_id)
        env.pop("LOOPSCOPE_PDEATHSIG")
        self.p = subprocess.Popen(
            [sys.executable, "-m", "loopscope.agent"], stdin=subprocess.PIPE, stdout=subprocess.PIPE, stderr=subprocess.PIPE, env=env, text=True
        )

    def send(self, line: str) -> dict[str, Any]:
        assert self.p.stdin and self.p.stdout
        self.p.stdin.write(line + "\n")
        self.p.stdin.flush()
        return json.loads(self.p.stdout.readline())

    def call(self, **m: Any) -> dict[str, Any]:
        return self.send(json.dumps(m))

    def close(self) -> None:
        self.p.communicate(timeout=30)


def test_hello_describes_the_host(tmp_path: Path) -> None:
    a = Agent("agent-t1")
    r = a.call(id=1, op="hello", run_id="agent-t1", run_dir=str(tmp_path))
    assert r["ok"] and r["id"] == 1 and r["pid"] == a.p.pid
    assert r["provenance"]["kernel"]["release"]
    assert a.call(id=2, op="shutdown")["ok"]
    a.close()
    assert a.p.returncode == 0


def test_bad_requests_get_error_replies_not_a_dead_agent(tmp_path: Path) -> None:
    a = Agent("agent-t2")
    r = a.send("{not json")
    assert not r["ok"] and "bad request" in r["error"]
    r = a.call(id=5, op="fly")
    assert not r["ok"] and r["id"] == 5 and "unknown op 'fly'" in r["error"]
    assert a.call(id=6, op="hello", run_id="agent-t2", run_dir=str(tmp_path))["ok"]
    # a request its model refuses is answered naming the field, before anything is done
    r = a.call(id=7, op="stop_probe", nmae="x")
    assert not r["ok"] and r["id"] == 7 and "bad stop_probe request" in r["error"] and "name" in r["error"]
    r = a.call(id=8, op="signal_probe", name="x", signal="kill")
    assert not r["ok"] and "signal" in r["error"]
    a.call(id=9, op="shutdown")
    a.close()


def test_every_request_of_the_protocol_has_its_handler_in_the_agent() -> None:
    from loopscope import protocol as P
    from loopscope.agent.server import Agent as Server

    for op, req in P.REQUESTS.items():
        assert req.op == op and callable(getattr(Server, op, None)), op
        assert issubclass(req.reply, P.Reply), op


def test_closing_stdin_stops_the_loads_it_started(tmp_path: Path) -> None:
    a = Agent("agent-t3")
    a.call(id=1, op="hello", run_id="agent-t3", run_dir=str(tmp_path))
    r = a.call(id=2, op="start_loads", step_dir=str(tmp_path / "s"), scratch_dir=str(tmp_path / "x"), loads=[{"name": "c", "kind": "cpu", "level": 2}])
    assert r["ok"], r
    pids = r["loads"][0]["pids"]
    assert len(pids) == 2
    assert a.p.stdin and a.p.stdout and a.p.stderr
    a.p.stdin.close()
    a.p.wait(timeout=30)
    a.p.stdout.close()
    a.p.stderr.close()
    for pid in pids:
        assert wait_gone(pid, 5)
    assert procs.pids_of_run("agent-t3") == []


def _switches() -> int:
    import threading

    status = Path(f"/proc/self/task/{threading.get_native_id()}/status").read_text()
    return int(next(line.split()[1] for line in status.splitlines() if line.startswith("voluntary_ctxt_switches")))


def test_waiting_for_a_probe_sleeps_instead_of_polling() -> None:
    from loopscope.agent.server import Agent

    agent = Agent()
    p = subprocess.Popen(["sleep", "5"])
    try:
        before = _switches()
        assert agent._sleep_on({"p": p}, 1.0, requests=False) == []
        woke = _switches() - before
    finally:
        p.kill()
        p.wait()
    # Popen.wait(timeout=1) wakes ~20 times a second to look; a pidfd sleeps until the exit or the timeout
    assert woke <= 3, woke
    q = subprocess.Popen(["sleep", "0.2"])
    assert agent._sleep_on({"q": q}, 5.0, requests=False) == ["q"]
    q.wait()


def test_a_watch_ends_when_the_controllers_next_request_arrives() -> None:
    from loopscope.agent.requests import Requests
    from loopscope.agent.server import Agent

    agent = Agent()
    r, w = os.pipe()
    agent.requests = Requests(r)
    p = subprocess.Popen(["sleep", "5"])
    try:
        t0 = time.monotonic()
        threading.Timer(0.3, lambda: os.write(w, b'{"id": 2, "op": "status"}\n')).start()
        assert agent._sleep_on({"p": p}, None, requests=True) == []
        assert 0.25 < time.monotonic() - t0 < 3
        assert agent.requests.next() == '{"id": 2, "op": "status"}'
    finally:
        p.kill()
        p.wait()
        os.close(r)
        os.close(w)


def test_a_lab_component_takes_its_name_at_the_first_import_of_loopscope() -> None:
    """Its start-up (the imports after the first, a tenth of a second of
    CPU) is then attributed to it, not to "python"."""
    code = "import loopscope, sys; sys.stdout.write(open('/proc/thread-self/comm').read().strip() + ' ' + str('loopscope.cli' in sys.modules))"
    r = subprocess.run([sys.executable, "-c", code], env={**os.environ, "LOOPSCOPE_COMM": "ls-probe"}, capture_output=True, text=True, timeout=60)
    assert r.stdout == "ls-probe False", r.stderr


def test_a_probe_the_agent_starts_is_named_ls_probe_and_its_threads_keep_their_names(tmp_path: Path) -> None:
    a = Agent("agent-t5")
    try:
        assert a.call(id=1, op="hello", run_id="agent-t5", run_dir=str(tmp_path))["ok"]
        spec = {"kind": "pipe-sink", "name": "s", "bind": "127.0.0.1:0", "flow": 1}
        r = a.call(id=2, op="start_probe", probe=spec, step_dir=str(tmp_path / "st"), scratch_dir=str(tmp_path / "x"), wait_ready=True)
        assert r["ok"], r
        pid = r["pid"]
        assert Path(f"/proc/{pid}/comm").read_text().strip() == "ls-probe"
        # "ready" means bound (packets queue in the socket); its receiving thread may start a moment later
        deadline = time.monotonic() + 5
        while True:
            names = {Path(f"/proc/{pid}/task/{t}/comm").read_text().strip() for t in os.listdir(f"/proc/{pid}/task")}
            if "ls-pipe-sink" in names or time.monotonic() > deadline:
                break
            time.sleep(0.05)
        assert "ls-pipe-sink" in names, names
        assert a.call(id=3, op="stop_probe", name="s")["ok"]
    finally:
        a.call(id=9, op="shutdown")
        a.close()


def test_a_program_run_as_a_probe_does_not_inherit_the_probes_name(tmp_path: Path, lab: None) -> None:
    code = "import os, loopscope; print(os.environ.get('LOOPSCOPE_COMM'), open('/proc/self/comm').read().strip())"
    r = subprocess.run(
        [sys.executable, "-m", "loopscope.cli", "probe", "program", "--trace", str(tmp_path / "p.lstrace"), "--json", "--", "python3", "-c", code],
        env={**os.environ, "LOOPSCOPE_COMM": "ls-probe"},
        capture_output=True,
        text=True,
        timeout=60,
        cwd=tmp_path,
    )
    assert "None python3" in r.stderr, r.stderr


def test_a_probe_spec_outside_its_models_bounds_is_refused_naming_the_field_and_the_agent_stays(tmp_path: Path) -> None:
    a = Agent("agent-t9")
    try:
        assert a.call(id=1, op="hello", run_id="agent-t9", run_dir=str(tmp_path))["ok"]
        r = a.call(
            id=2,
            op="start_probe",
            probe={"kind": "pipe-node", "name": "n", "bind": "127.0.0.1:0", "next": "127.0.0.1:0"},
            step_dir=str(tmp_path / "st"),
            scratch_dir=str(tmp_path / "x"),
        )
        assert not r["ok"] and "next" in r["error"] and "port 1..65535" in r["error"], r
        assert a.call(id=3, op="status")["ok"]  # it answered, and it is still there
    finally:
        a.call(id=9, op="shutdown")
        a.close()
