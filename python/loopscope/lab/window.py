"""A measuring window across hosts, with the lab asleep.

While a pipeline's stages or an app's processes measure on several hosts,
nothing of the lab may wake on their CPUs: every wake-up of an agent or of
the controller lands in some probe's window (the controller once looked at
every host every 5 s, and those looks were up to 9 % of a stage's outlier
time under load). Yet a stage that dies must fail the run at once, not
when the window ends.

So each agent sleeps on its processes: the agent of the host whose probe
ends the window (a pipeline's source) answers ``wait_probe`` when it exits,
every other agent answers ``watch`` when one of its probes or loads exits,
and the controller waits for the first answer, each in a thread of its own
blocked on its channel (no timer anywhere). A failure answers at once; a
dead agent closes its channel, which answers too. When the window ends,
each agent still watching is woken by the controller's next request, which
it then handles as usual.
"""

from __future__ import annotations

import queue
import threading
import time
from dataclasses import dataclass
from typing import Callable

from loopscope import protocol as P
from loopscope.lab.hosts import AgentClient
from loopscope.lab.lab import Lab


@dataclass
class _Pending:
    host: str
    rid: int
    req: P.WaitProbe | P.Watch


def _posted(agent: AgentClient, req: P.Request[P.R]) -> tuple[int, Callable[[], P.R]]:
    """``req`` sent without waiting: its id, and how to wait for its typed reply."""
    rid = agent.post(req)
    return rid, lambda: agent.answer(req, rid)


def sleep_through(lab: Lab, watch: dict[str, list[str]], until: tuple[str, str] | None, timeout_s: float) -> tuple[bool, list[tuple[str, str]]]:
    """Sleep while ``watch`` (host → probe names) measure, until the probe
    ``until`` (host, name) exits or ``timeout_s`` passes. Raises the first
    failure (a probe that failed, a load that ended, a dead agent). Returns
    whether ``until`` ended (False: the time ran out first; True without
    ``until``) and the watched probes that exited cleanly meanwhile."""
    answers: queue.Queue[tuple[_Pending, P.Waited | P.Watched | BaseException]] = queue.Queue()
    pending: dict[str, _Pending] = {}
    threads: list[threading.Thread] = []

    def ask(host: str, req: P.WaitProbe | P.Watch) -> None:
        agent = lab.agent(host)
        rid, fetch = _posted(agent, req) if isinstance(req, P.WaitProbe) else _posted(agent, req)
        p = _Pending(host, rid, req)
        pending[host] = p

        def wait() -> None:
            try:
                answers.put((p, fetch()))
            except BaseException as e:  # noqa: BLE001 - handed to the waiting thread
                answers.put((p, e))

        t = threading.Thread(target=wait, name=f"ls-window-{host}", daemon=True)
        t.start()
        threads.append(t)

    exited: list[tuple[str, str]] = []
    hosts = set(watch) | ({until[0]} if until else set())
    end = time.monotonic() + timeout_s
    done = until is None
    try:
        for host in sorted(hosts):
            if until is not None and host == until[0]:
                ask(host, P.WaitProbe(name=until[1], timeout_s=timeout_s, collect=False, watch=watch.get(host, [])))
            elif watch.get(host):
                ask(host, P.Watch(names=watch[host]))
        while (left := end - time.monotonic()) > 0:
            try:
                p, got = answers.get(timeout=left)
            except queue.Empty:
                break
            del pending[p.host]
            if isinstance(got, BaseException):
                raise got
            if isinstance(got, P.Waited) and got.done:
                done = True
                break
            exited += [(p.host, n) for n in got.exited]
            left_on = [n for n in watch.get(p.host, []) if (p.host, n) not in exited]
            if isinstance(p.req, P.WaitProbe) and until is not None:
                ask(p.host, P.WaitProbe(name=until[1], timeout_s=max(0.0, end - time.monotonic()), collect=False, watch=left_on))
            elif left_on:
                ask(p.host, P.Watch(names=left_on))
        return done, exited
    finally:
        _wake(lab, pending)
        for t in threads:
            t.join(timeout=30)


def _wake(lab: Lab, pending: dict[str, _Pending]) -> None:
    """End every wait still outstanding: the agent answers it when the next
    request arrives (a ``status``, whose own answer is read here); an agent
    that cannot answer is left to the failure already on its way."""
    for host, p in pending.items():
        try:
            lab.agent(host).ask(P.GetStatus(), timeout=30)
        except Exception:  # noqa: BLE001 - the window's own outcome (or its failure) is what the caller needs
            pass
