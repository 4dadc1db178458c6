"""The host kinds' contract: every kind the experiment file may name has
its lab half in the registry, and every kind answers every hook (the
registry dispatches by lookup, so a kind without one would fail a run).
Starting agents is the lab tests' part (test_multihost, test_exec,
test_ssh); here each hook is walked with a host whose agent never started."""

from __future__ import annotations

import typing
from pathlib import Path

import pytest

from loopscope.lab.hostkinds import HOST_KINDS, Down, HostKind, HostRt
from loopscope.spec.hostkinds import DECLARED, REMOTE, resolve
from loopscope.spec.models import Host

ADDRESS = {"netns": None, "local": None, "ssh": "h.example", "exec": "10.1.2.3"}


def _host(kind: str) -> Host:
    extra = {"launcher": ["false"]} if DECLARED[kind].launched else {}  # a launcher that reaches nothing
    return Host(name="h", kind=kind, address=ADDRESS[kind], **extra)  # type: ignore[arg-type]


def test_every_kind_a_file_may_name_has_a_lab_half_and_auto_resolves_to_one() -> None:
    named = set(typing.get_args(Host.model_fields["kind"].annotation))
    assert named == set(DECLARED)
    assert set(HOST_KINDS) == named - {"auto"}
    assert {resolve("auto", True, None)[0], resolve("auto", True, "no root")[0], resolve("auto", False, None)[0]} == {"netns", "local"}
    assert resolve("auto", True, "no root")[1] == "runs as local processes on loopback (no root)"
    assert set(REMOTE) == {n for n, k in HOST_KINDS.items() if k.declared.remote}


@pytest.mark.parametrize("name", sorted(HOST_KINDS))
def test_a_host_kind_answers_every_hook(name: str, tmp_path: Path) -> None:
    kind = HOST_KINDS[name]
    assert kind.name == name and kind.declared is DECLARED[name]
    assert type(kind).start is not HostKind.start, f"{name}: no way to start its agent"
    spec = _host(name)
    assert kind.preflight([]) == {}
    if name != "netns":  # a netns host's address is its namespace's (the topology's)
        assert kind.address(spec, 2, True, None) == (spec.address or "127.0.2.1")
    assert isinstance(kind.describe(spec), dict)
    h = HostRt("h", name, spec, 1, "127.0.0.1", str(tmp_path / "there"), tmp_path / "here")
    assert h.remote == DECLARED[name].remote and (h.here if not h.remote else not h.here)
    down = Down("run-1", "run-1", completed=False, live=False)
    # no agent ever started: its files are fetched through a fresh one where
    # the kind does that (the launcher reaches nothing: said, not raised)
    before = sorted(tmp_path.iterdir())
    assert kind.home_before_stop(h, down) == []
    said = kind.home_after_stop(h, down)
    assert said == ([] if not kind.down_when_lost else [said[0]]) and all(x.startswith("host h: ") for x in said)
    kind.cleanup(h, multi=True)
    assert sorted(p for p in tmp_path.iterdir() if p.name != "here") == [p for p in before if p.name != "here"]


def test_a_kind_s_entry_is_checked_by_its_declaration() -> None:
    problems = DECLARED["exec"].problems(0, Host(name="e", kind="exec"))
    assert [w for w, _ in problems] == [("hosts", 0, "address"), ("hosts", 0, "launcher")]
    assert DECLARED["ssh"].address_key(Host(name="s", kind="ssh", address="a", port=2222)) == "a:2222"
    assert DECLARED["local"].problems(1, Host(name="l", kind="local", address="not-ip"))[0][1] == "must be an IPv4 address for a local host [got 'not-ip']"
