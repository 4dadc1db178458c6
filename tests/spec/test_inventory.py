"""Hosts from an Ansible inventory, read by ansible-core's own ``ansible-inventory``."""

from __future__ import annotations

from pathlib import Path

import pytest

from loopscope.kinds import KINDS
from loopscope.spec import inventory
from loopscope.spec.load import SpecError, parse
from tests.conftest import Cli

pytestmark = pytest.mark.skipif(
    inventory.tool() is None, reason="needs ansible-core's ansible-inventory (Debian: ansible-core; scripts/install-deps.sh test installs it)"
)

INI = """\
[gateways]
gw1 ansible_host=10.76.0.2 ansible_user=ops ansible_port=2222 ansible_python_interpreter=/usr/bin/python3.11
gw2 ansible_host=10.76.0.3 loopscope_workdir=/var/tmp/ls

[edge:children]
gateways

[edge]
edge9 loopscope_address=10.76.0.9

[other]
lonely
"""


def spec(tmp: Path, hosts: str) -> Path:
    (tmp / "inv.ini").write_text(INI)
    p = tmp / "e.yaml"
    p.write_text(f"name: inv\nhosts: {hosts}\nprobes:\n  - {{kind: timer, host: gw1}}\nduration: 1s\n")
    return p


def test_a_group_gives_its_hosts_and_its_children_groups_hosts_with_their_variables(tmp_path: Path) -> None:
    p = spec(tmp_path, "{inventory: inv.ini, group: edge, kind: exec, launcher: [srun, '--nodelist={name}', '--comment={address}']}")
    exp = parse(p.read_text(), str(p), KINDS)
    by = {h.name: h for h in exp.hosts}
    assert sorted(by) == ["edge9", "gw1", "gw2"]
    assert by["gw1"].address == "10.76.0.2" and by["gw1"].user == "ops" and by["gw1"].port == 2222 and by["gw1"].system_python == "/usr/bin/python3.11"
    assert by["gw1"].launcher == ["srun", "--nodelist=gw1", "--comment=10.76.0.2"]
    assert by["gw2"].workdir == "/var/tmp/ls" and by["edge9"].address == "10.76.0.9"
    assert all(h.kind == "exec" for h in exp.hosts)


def test_an_inventory_item_sits_among_other_hosts(tmp_path: Path) -> None:
    p = spec(tmp_path, "[{name: here, kind: local}, {inventory: inv.ini, group: gateways}]")
    exp = parse(p.read_text(), str(p), KINDS)
    assert [h.name for h in exp.hosts] == ["here", "gw1", "gw2"]
    assert exp.hosts[1].kind == "ssh" and exp.hosts[2].address == "10.76.0.3"


def test_a_group_that_does_not_exist_is_refused_with_the_groups_there_are(tmp_path: Path, cli: Cli) -> None:
    p = spec(tmp_path, "{inventory: inv.ini, group: routers}")
    r = cli("check", str(p))
    assert r.returncode == 2
    assert "e.yaml:2: hosts.group: " in r.stderr and "has no group 'routers'; its groups are all, edge, gateways, other" in r.stderr


def test_an_inventory_that_does_not_parse_is_refused_with_ansibles_words(tmp_path: Path, cli: Cli) -> None:
    p = spec(tmp_path, "{inventory: inv.ini, group: edge}")
    (tmp_path / "inv.ini").write_text("[broken\nx y=\n")
    with pytest.raises(SpecError) as e:
        parse(p.read_text(), str(p), KINDS)
    assert "hosts.inventory" in str(e.value) and "Ansible cannot parse it" in str(e.value)
    (tmp_path / "inv.ini").unlink()
    r = cli("check", str(p))
    assert r.returncode == 2 and "no such inventory file" in r.stderr


def test_an_exec_host_without_an_address_is_refused_naming_it(tmp_path: Path) -> None:
    p = spec(tmp_path, "{inventory: inv.ini, group: other, kind: exec, launcher: [srun]}")
    with pytest.raises(SpecError) as e:
        parse(p.read_text(), str(p), KINDS)
    assert "host lonely of" in str(e.value) and "has no address" in str(e.value)
