"""Test tiers, set from the fixtures a test uses.

- **fast**: pure logic, parsing, and analysis of recorded fixtures
  (`make check`, while working);
- **lab**: a test that starts a lab, a probe, a load or a kernel capture,
  or runs a peer that measures or loads the machine: it uses the `lab`
  fixture, itself or through a fixture of its own (a module's run);
- **bench**: a bench's quick form: it uses the `bench` fixture.

A lab or bench test that also uses the `beside` fixture may run beside
another such test: it asserts no latency, rate or cause (only what a run,
a bench or a monitor leaves and says), changes no machine-wide setting (no
sysctl, IRQ, isolation, `loopscope cleanup`), and finds its leftovers by its
own run id, not by a look at the whole machine.

`make test` runs every tier: the fast one on both CPUs (pytest-xdist; it
measures nothing) while the lab and bench tests marked `beside` run two at
a time (`--tier beside`), then the rest one at a time (`--tier alone`: they
measure the machine, and share it with nothing else). `--tier slow` is
both lab tiers, one at a time. A fast test therefore touches nothing
machine-wide either: one that runs `loopscope cleanup`'s code (which takes
what no live run has registered yet) is a lab test. `make check` runs
`pytest --tier fast`, which deselects the lab and bench tests and guards the rest: a fast test that
starts a lab anyway (a loopscope command that measures, a peer that loads
or records the machine, a kernel capture) fails, naming the fixture it
needs. So a test cannot land in the fast tier by mistake.
"""

from __future__ import annotations

import os
import subprocess
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

#: loopscope commands that measure the machine (start a lab, probes, loads,
#: agents) or change what is on it (cleanup removes every run's leftovers:
#: two at once would take each other's)
LAB_COMMANDS = {"run", "monitor", "probe", "bench", "calibrate", "hosts", "cleanup", "audit"}
LAB_SUBCOMMANDS = {("model", "check")}
#: programs that load, measure or record the machine, or make namespaces
LAB_TOOLS = {
    "stress-ng",
    "cyclictest",
    "trace-cmd",
    "perf",
    "iperf3",
    "sockperf",
    "irtt",
    "ip",
    "unshare",
    "nsenter",
    "lttng",
    "chrt",
    "taskset",
    "prometheus",
    "sshd",
    "srun",
    "ansible-playbook",
}


def pytest_addoption(parser: pytest.Parser) -> None:
    parser.addoption(
        "--tier",
        choices=["fast", "slow", "beside", "alone", "all"],
        default="all",
        help="fast: only the tests that use neither the lab nor the bench fixture, guarded against starting a lab (make check); "
        "slow: only those that do; beside: the slow ones that may run two at a time (the `beside` fixture); alone: the other slow ones "
        "(make test runs fast and beside on every CPU, then alone)",
    )


@pytest.fixture(scope="session")
def lab() -> None:
    """Marks a test as one that starts a lab (its tier: lab)."""


@pytest.fixture(scope="session")
def bench() -> None:
    """Marks a test as a bench's quick form (its tier: bench)."""


@pytest.fixture(scope="session")
def beside(lab: None) -> None:
    """Marks a lab or bench test that may run beside another such test (the module's note says which may)."""


def pytest_collection_modifyitems(config: pytest.Config, items: list[pytest.Item]) -> None:
    for item in items:
        names = getattr(item, "fixturenames", ())
        if "bench" in names:
            item.add_marker(pytest.mark.bench)
        elif "lab" in names:
            item.add_marker(pytest.mark.lab)
    tier = config.getoption("--tier")
    if tier == "all":
        return
    keep = [i for i in items if _tier_of(i) in TIERS[tier]]
    gone = [i for i in items if i not in keep]
    if gone:
        config.hook.pytest_deselected(items=gone)
        items[:] = keep


@pytest.fixture(autouse=True)
def no_trace_instance_left(request: pytest.FixtureRequest) -> Iterator[None]:
    """A test of the alone tier (run with nothing beside it) leaves no loopscope
    trace instance it made: one left behind goes on recording every event of the
    machine. Said as the test's error, and removed so that the next test does not
    meet it. (Other tiers share the machine with tests that record.)"""
    if request.config.getoption("--tier") != "alone" or _tier_of(request.node) != "alone":
        yield
        return
    import time

    from loopscope.kernel.capture import leftover_instances, remove_instance

    before = set(leftover_instances())
    yield
    end = time.monotonic() + 5
    while (left := set(leftover_instances()) - before) and time.monotonic() < end:
        time.sleep(0.1)
    if left:
        for name in left:
            remove_instance(name)
        pytest.fail(f"the test left these kernel trace instances recording: {', '.join(sorted(left))}")


#: which tests each --tier runs, by the tier each test is in (`_tier_of`)
TIERS = {"fast": {"fast"}, "slow": {"beside", "alone"}, "beside": {"beside"}, "alone": {"alone"}}


def _tier_of(item: pytest.Item) -> str:
    if not (item.get_closest_marker("lab") or item.get_closest_marker("bench")):
        return "fast"
    return "beside" if "beside" in getattr(item, "fixturenames", ()) else "alone"


def _labbish(argv: list[str]) -> str | None:
    """What a command line starts that the fast tier must not (None: nothing)."""
    if not argv:
        return None
    prog = Path(str(argv[0])).name
    args = [str(a) for a in argv[1:]]
    if prog == "loopscope" or (prog.startswith("python") and args[:2] == ["-m", "loopscope.cli"]):
        rest = args[2:] if prog.startswith("python") else args
        words = [a for a in rest if not a.startswith("-")]
        if "--help" in rest or "-h" in rest:
            return None
        if words and (words[0] in LAB_COMMANDS or tuple(words[:2]) in LAB_SUBCOMMANDS):
            return f"loopscope {' '.join(words[:2])}"
        return None
    if prog in LAB_TOOLS:
        return prog
    return None


@pytest.fixture(scope="session", autouse=True)
def _fast_tier_guard(request: pytest.FixtureRequest) -> Iterator[None]:
    """In the fast tier, starting a lab fails the test that does it."""
    if request.config.getoption("--tier") != "fast":
        yield
        return
    from loopscope.kernel import capture as C

    real_init = subprocess.Popen.__init__
    real_start = C.Capture.start

    def init(self: subprocess.Popen[Any], args: Any, *a: Any, **kw: Any) -> None:
        argv = [args] if isinstance(args, (str, bytes, os.PathLike)) else list(args)
        what = _labbish([x.decode() if isinstance(x, bytes) else str(x) for x in argv])
        if what:
            pytest.fail(f"a fast-tier test started {what}: give the test (or its fixture) the `lab` fixture, or `bench` for a bench", pytrace=False)
        real_init(self, args, *a, **kw)

    def start(self: C.Capture) -> Any:
        pytest.fail("a fast-tier test started a kernel capture: give the test (or its fixture) the `lab` fixture", pytrace=False)
        return real_start(self)

    subprocess.Popen.__init__ = init  # type: ignore[method-assign]
    C.Capture.start = start  # type: ignore[method-assign]
    try:
        yield
    finally:
        subprocess.Popen.__init__ = real_init  # type: ignore[method-assign]
        C.Capture.start = real_start  # type: ignore[method-assign]
