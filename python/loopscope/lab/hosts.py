"""Reaching a host's agent: local processes, network namespaces, ssh, launchers.

Every host kind ends in the same thing, an agent speaking JSON lines on its
standard input and output (``docs/agent-protocol.md``); only the way there
differs:

- ``local``: ``python -m loopscope.agent`` as a child of the controller;
- ``netns``: the same, through ``loopscope.lab.nsexec``, which joins the
  host's network namespace and, for a clock offset, a new time namespace;
- ``ssh``: an asyncssh connection (host key checked against known_hosts,
  never accepted blindly) running ``<python> -m loopscope.agent`` on the
  remote machine; its files are fetched over SFTP when the run ends;
- ``exec``: the host's launcher (srun, kubectl exec, …) running the same
  command (``lab/launch.py``); its files come home through the agent.

``Channel`` is the byte pipe; ``AgentClient`` the request/reply layer on
top, which turns a channel that closes into an ``AgentFailure`` naming the
host, the command and the last lines the agent wrote.
"""

from __future__ import annotations

import asyncio
import json
import os
import select
import shlex
import signal
import subprocess
import sys
import threading
import time
from pathlib import Path
from typing import TYPE_CHECKING, Any, TypeVar, cast

from loopscope.errors import RunError
from loopscope.host import procs
from loopscope import protocol as P

if TYPE_CHECKING:
    from loopscope.spec.models import Host

R = TypeVar("R", bound=P.Reply)


class AgentFailure(RunError):
    """A component on a host failed, or the agent itself died."""

    def __init__(self, message: str, host: str | None = None, component: str | None = None) -> None:
        super().__init__(message)
        self.host = host
        self.component = component


class ChannelClosed(RunError):
    """The agent's end of the control channel closed."""


# ---- channels ---------------------------------------------------------------------------


class ProcessChannel:
    """An agent as a child process (local or inside namespaces)."""

    def __init__(self, argv: list[str], env: dict[str, str], log: Path) -> None:
        self.argv = argv
        self.log = log
        log.parent.mkdir(parents=True, exist_ok=True)
        with open(log, "ab") as lf:
            self.p = subprocess.Popen(argv, stdin=subprocess.PIPE, stdout=subprocess.PIPE, stderr=lf, env=env, start_new_session=True)
        self._buf = b""

    @property
    def command(self) -> str:
        return shlex.join(self.argv)

    def send(self, line: bytes) -> None:
        assert self.p.stdin is not None
        try:
            self.p.stdin.write(line)
            self.p.stdin.flush()
        except (BrokenPipeError, OSError):
            raise ChannelClosed() from None

    def recv_line(self, timeout: float | None = None) -> bytes:
        assert self.p.stdout is not None
        fd = self.p.stdout.fileno()
        end = None if timeout is None else time.monotonic() + timeout
        while b"\n" not in self._buf:
            left = None if end is None else max(0.0, end - time.monotonic())
            r, _, _ = select.select([fd], [], [], left)
            if not r:
                raise TimeoutError
            chunk = os.read(fd, 65536)
            if not chunk:
                raise ChannelClosed()
            self._buf += chunk
        line, _, self._buf = self._buf.partition(b"\n")
        return line

    def alive(self) -> bool:
        return self.p.poll() is None

    def exit_text(self) -> str:
        try:
            self.p.wait(timeout=5)
        except subprocess.TimeoutExpired:
            return "still running"
        return procs.exit_text(self.p.returncode)

    def pid(self) -> int:
        return self.p.pid

    def wait(self, timeout: float) -> bool:
        try:
            self.p.wait(timeout=timeout)
            return True
        except subprocess.TimeoutExpired:
            return False

    def terminate(self) -> None:
        if self.p.poll() is None:
            self.p.send_signal(signal.SIGTERM)
            if not self.wait(15):
                self.p.kill()
                self.p.wait()

    def kill(self) -> None:
        if self.p.poll() is None:
            self.p.kill()
            self.p.wait()

    def close(self) -> None:
        for f in (self.p.stdin, self.p.stdout):
            try:
                if f:
                    f.close()
            except OSError:
                pass


class SshError(RunError):
    """ssh to a host failed: connecting, copying or starting the agent."""


class SshChannel:
    """An agent on a remote machine over asyncssh, driven from a thread of its own."""

    def __init__(self, host: Host, remote_cmd: str, log: Path, connect_timeout: float = 10.0) -> None:
        self.host = host
        self.remote_cmd = remote_cmd
        self.log = log
        log.parent.mkdir(parents=True, exist_ok=True)
        self.loop = asyncio.new_event_loop()
        self.thread = threading.Thread(target=self.loop.run_forever, name=f"ssh-{host.name}", daemon=True)
        self.thread.start()
        self.conn: Any = None
        self.proc: Any = None
        self._closed = False
        self._exit: str | None = None
        try:
            self._call(self._open(connect_timeout), connect_timeout + 5)
        except BaseException:
            self.close()
            raise

    @property
    def command(self) -> str:
        return f"ssh {self.host.user + '@' if self.host.user else ''}{self.host.address}:{self.host.port} {self.remote_cmd}"

    def _call(self, coro: Any, timeout: float | None) -> Any:
        fut = asyncio.run_coroutine_threadsafe(coro, self.loop)
        try:
            return fut.result(timeout)
        except TimeoutError:
            fut.cancel()
            raise

    async def _open(self, timeout: float) -> None:
        self.conn = await connect(self.host, timeout)
        self.proc = await self.conn.create_process(self.remote_cmd, encoding=None)
        self._stderr_task = asyncio.ensure_future(self._pump_stderr())

    async def _pump_stderr(self) -> None:
        with open(self.log, "ab") as lf:
            while True:
                b = await self.proc.stderr.read(4096)
                if not b:
                    break
                lf.write(b)
                lf.flush()

    def send(self, line: bytes) -> None:
        if self._closed or self.proc is None:
            raise ChannelClosed()

        async def w() -> None:
            self.proc.stdin.write(line)
            await self.proc.stdin.drain()

        try:
            self._call(w(), 30)
        except Exception:
            raise ChannelClosed() from None

    def recv_line(self, timeout: float | None = None) -> bytes:
        if self._closed or self.proc is None:
            raise ChannelClosed()
        try:
            line = self._call(self.proc.stdout.readline(), timeout)
        except TimeoutError:
            raise
        except Exception:
            raise ChannelClosed() from None
        if not line:
            raise ChannelClosed()
        return bytes(line).rstrip(b"\n")

    def alive(self) -> bool:
        return not self._closed and self.proc is not None and self.proc.exit_status is None and not self.proc.stdout.at_eof()

    def exit_text(self) -> str:
        if self.proc is None:
            return "not started"
        st = self.proc.exit_status
        sig = self.proc.exit_signal
        if sig:
            return f"killed by {sig[0]}"
        return f"exit code {st}" if st is not None else "connection closed"

    def pid(self) -> int:
        return 0

    def wait(self, timeout: float) -> bool:
        try:
            self._call(self.proc.wait(), timeout)
            return True
        except Exception:
            return False

    def terminate(self) -> None:
        if self.proc is not None and self.proc.exit_status is None:
            try:
                self.proc.stdin.write_eof()
            except Exception:
                pass
            if not self.wait(10):
                try:
                    self.proc.send_signal("TERM")
                except Exception:
                    pass
        self.close()

    def kill(self) -> None:
        self.close()

    def fetch(self, remote: str, local: Path) -> None:
        """Copy the remote directory ``remote`` into ``local`` (SFTP)."""

        async def get() -> None:
            async with self.conn.start_sftp_client() as sftp:
                local.mkdir(parents=True, exist_ok=True)
                if await sftp.exists(remote):
                    for name in await sftp.listdir(remote):
                        if name in (".", ".."):
                            continue
                        await sftp.get(f"{remote}/{name}", str(local), recurse=True, preserve=True)

        self._call(get(), 300)

    def run(self, cmd: str, timeout: float = 30) -> tuple[int, str]:
        async def r() -> tuple[int, str]:
            res = await self.conn.run(cmd, check=False)
            return int(res.exit_status or 0), str(res.stdout or "") + str(res.stderr or "")

        return self._call(r(), timeout)  # type: ignore[no-any-return]

    def close(self) -> None:
        if self._closed:
            return
        self._closed = True

        async def c() -> None:
            if self.conn is not None:
                self.conn.close()
                try:
                    await asyncio.wait_for(self.conn.wait_closed(), 5)
                except Exception:
                    pass

        try:
            self._call(c(), 10)
        except Exception:
            pass
        self.loop.call_soon_threadsafe(self.loop.stop)
        self.thread.join(timeout=5)


async def connect(host: Host, timeout: float) -> Any:
    """An asyncssh connection to ``host`` with its key checked; SshError says why not."""
    import asyncssh

    kh = os.path.expanduser(host.known_hosts) if host.known_hosts else os.path.expanduser("~/.ssh/known_hosts")
    opts: dict[str, object] = {"port": host.port, "known_hosts": kh, "connect_timeout": timeout}
    if host.user:
        opts["username"] = host.user
    if host.identity:
        opts["client_keys"] = [os.path.expanduser(host.identity)]
        opts["agent_path"] = None
    try:
        return await asyncssh.connect(host.address, **opts)
    except asyncssh.HostKeyNotVerifiable as e:
        raise SshError(
            f"its host key does not match {kh} ({e.reason}); if the machine was reinstalled, check and update that file (ssh-keygen -R {host.address})"
        ) from None
    except asyncssh.PermissionDenied:
        raise SshError(f"login refused for {host.user or 'your user'} (give `identity:` or load a key into ssh-agent)") from None
    except (OSError, asyncio.TimeoutError) as e:
        raise SshError(f"cannot reach {host.address}:{host.port}: {getattr(e, 'strerror', None) or e or 'timed out'}") from None
    except (asyncssh.Error, ValueError) as e:
        raise SshError(f"ssh failed: {e}") from None


def ssh_preflight(host: Host, timeout: float = 10.0) -> str | None:
    """None when ``host`` can be reached and has this controller's loopscope; else what is wrong."""
    from loopscope.lab import launch

    async def check() -> str | None:
        try:
            conn = await connect(host, timeout)
        except SshError as e:
            return str(e)
        try:
            r = await conn.run(f"sh -c {shlex.quote(launch.check_line(host))}", check=False)
            out = str(r.stdout or "") + str(r.stderr or "")
            why = launch.check_answer(host.name, f"ssh {host.address}", r.exit_status, out)
            if why and r.exit_status != 0:
                err = out.strip().splitlines()
                which = host.python or "the installed interpreter or this controller's"
                return (
                    f"loopscope is not installed for {which} on {host.address} "
                    f"({err[-1] if err else f'exit code {r.exit_status}'}); `loopscope hosts install EXPERIMENT` puts this controller's there, or set `python:` to an interpreter that has it"
                )
            return why.split(": ", 1)[1] if why else None
        finally:
            conn.close()

    try:
        return asyncio.run(asyncio.wait_for(check(), timeout + 20))
    except asyncio.TimeoutError:
        return f"no answer from {host.address}:{host.port} within {timeout + 20:.0f} s"


# ---- the request/reply layer ---------------------------------------------------------------


class AgentClient:
    """One host's agent and its JSON-lines channel."""

    def __init__(self, host: str, kind: str, channel: Any, log: Path) -> None:
        self.host = host
        self.kind = kind
        self.ch = channel
        self.log = log
        self.spawn_ns = time.monotonic_ns()
        self.next_id = 0
        self.dead: str | None = None
        # Replies are read under a lock and matched by id: a thread may wait
        # for one request's reply (a window's watch) while another is sent.
        self._reading = threading.Lock()
        self._inbox: dict[int, dict[str, Any]] = {}
        #: requests sent whose replies nobody has taken yet (one given up on, a step cut short, stays)
        self._open: set[int] = set()

    @property
    def idle(self) -> bool:
        """Nothing asked of it is still unanswered: a request now is answered at once."""
        return not self._open and self.dead is None

    def _died(self, op: str, why: str | None = None) -> AgentFailure:
        ex = self.ch.exit_text()
        tail = "\n".join("    " + l for l in procs.tail(self.log)) or "    (no output)"
        self.dead = f"the agent on {self.host} died during {op} ({why or ex})"
        return AgentFailure(f"{self.dead}\n  command: {self.ch.command}\n  last output ({self.log}):\n{tail}", host=self.host, component="agent")

    def ask(self, req: P.Request[R], timeout: float | None = None) -> R:
        """Send a typed request and wait for its typed reply."""
        return self.answer(req, self.post(req), timeout)

    def post(self, req: P.Request[R]) -> int:
        """Send a typed request without waiting: its id, for ``answer``."""
        return self.send(req.op, **req.model_dump(mode="json", exclude_unset=True))

    def answer(self, req: P.Request[R], rid: int, timeout: float | None = None) -> R:
        """The typed reply to request ``rid`` (sent by ``post``)."""
        got = self.reply(rid, req.op, timeout)
        return cast(R, req.reply.model_validate({k: v for k, v in got.items() if k not in ("id", "ok")}))

    def send(self, op: str, **kw: Any) -> int:
        """Send a request without waiting for its reply: its id."""
        self.next_id += 1
        self._open.add(self.next_id)
        msg = {"id": self.next_id, "op": op, **kw}
        try:
            self.ch.send((json.dumps(msg) + "\n").encode())
        except ChannelClosed:
            raise self._died(op) from None
        return self.next_id

    def reply(self, rid: int, op: str, timeout: float | None = None) -> dict[str, object]:
        """The reply to request ``rid`` (replies to other requests that come
        first are kept for whoever waits for them)."""
        while True:
            got = self._inbox.pop(rid, None)
            if got is None:
                with self._reading:
                    got = self._inbox.pop(rid, None)
                    if got is None:
                        got = self._read_one(op, timeout)
                        if got.get("id") != rid:
                            self._inbox[int(got.get("id") or -1)] = got
                            continue
            self._open.discard(rid)
            if not got.get("ok"):
                raise AgentFailure(f"{got.get('component', 'agent')} on {self.host}: {got.get('error')}", host=self.host, component=got.get("component"))
            return dict(got)

    def _read_one(self, op: str, timeout: float | None) -> dict[str, Any]:
        try:
            line = self.ch.recv_line(timeout)
        except ChannelClosed:
            raise self._died(op) from None
        except TimeoutError:
            raise AgentFailure(f"the agent on {self.host} did not answer {op} within {timeout:.0f} s", host=self.host, component="agent") from None
        try:
            got = json.loads(line)
        except json.JSONDecodeError:
            got = None
        if not isinstance(got, dict):
            # a launcher that printed its own words on the agent's channel
            with open(self.log, "ab") as lf:
                lf.write(b"(on the agent's standard output) " + line[:2000] + b"\n")
            self.ch.terminate()
            raise self._died(op, f"it printed something that is not the agent's: {line[:200].decode(errors='replace')!r}") from None
        return got

    def check_alive(self) -> None:
        if not self.ch.alive():
            raise self._died("the run")

    def close(self, timeout: float = 15.0) -> None:
        if self.ch.alive():
            try:
                self.ch.send(b'{"id": 0, "op": "shutdown"}\n')
                self.ch.recv_line(timeout)
            except (ChannelClosed, TimeoutError):
                pass
            if not self.ch.wait(timeout):
                self.ch.terminate()
        self.ch.close()

    def terminate(self) -> None:
        self.ch.terminate()
        self.ch.close()


def agent_argv(python: str = sys.executable) -> list[str]:
    return [python, "-m", "loopscope.agent"]


def local_agent(host: str, run_id: str, log: Path) -> AgentClient:
    env = procs.child_env(run_id)  # the agent dies with this controller (LOOPSCOPE_PDEATHSIG)
    return AgentClient(host, "local", ProcessChannel(agent_argv(), env, log), log)


def netns_agent(host: str, run_id: str, ns: str, offset_ns: int, log: Path) -> AgentClient:
    env = procs.child_env(run_id)  # nsexec execs the agent: its parent is this controller
    argv = [sys.executable, "-m", "loopscope.lab.nsexec", "--net", f"/run/netns/{ns}"]
    if offset_ns:
        argv += ["--monotonic-ns", str(offset_ns)]
    argv += ["--", *agent_argv()]
    return AgentClient(host, "netns", ProcessChannel(argv, env, log), log)


def exec_agent(host: Host, run_id: str, log: Path) -> AgentClient:
    """An agent through the host's launcher (``lab/launch.py``)."""
    from loopscope.lab import launch

    ch = ProcessChannel(launch.argv(host, launch.agent_line(host, run_id)), launch.launcher_env(run_id), log)
    return AgentClient(host.name, "exec", ch, log)


def ssh_agent(host: Host, run_id: str, log: Path) -> AgentClient:
    from loopscope.lab import launch

    cmd = f"sh -c {shlex.quote(launch.agent_line(host, run_id))}"
    try:
        ch = SshChannel(host, cmd, log)
    except SshError as e:
        raise AgentFailure(f"host {host.name}: {e}", host=host.name, component="ssh") from None
    return AgentClient(host.name, "ssh", ch, log)
