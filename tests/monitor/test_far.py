"""What a host on another kernel's own monitor is given (``monitor.far``): pure, on parsed specs."""

from __future__ import annotations

import pytest
import yaml

from loopscope.errors import RunError
from loopscope.kinds import KINDS
from loopscope.monitor.far import check, sub_spec
from loopscope.spec import parse

SPEC = """name: f
hosts:
  - {name: n, kind: netns}
  - {name: e1, kind: exec, launcher: [ip, netns, exec, x], address: 10.0.0.2}
probes:
  - {kind: timer, name: t-n, host: n, cpu: [0]}
  - {kind: timer, host: e1, cpu: [1]}
loads:
  - {kind: cpu, host: e1}
  - {kind: cpu, name: here, host: n}
monitor: {period: 3s, threshold: 1ms}
"""


def test_the_far_hosts_spec_holds_its_probes_and_loads_only_with_the_host_as_local() -> None:
    exp = parse(SPEC, "f.yaml", KINDS)
    cut = yaml.safe_load(sub_spec(SPEC, exp, "e1"))
    assert cut["hosts"] == [{"name": "e1", "kind": "local"}]
    assert [(p["name"], p["host"]) for p in cut["probes"]] == [(str(exp.probes[1].name), "e1")]
    assert [ld["name"] for ld in cut["loads"]] == [exp.loads[0].name] and cut["phases"][0]["loads"] == [exp.loads[0].name]
    assert cut["monitor"] == {"period": "3s", "threshold": "1ms"}
    # what it is given parses as a spec of its own
    assert parse(yaml.safe_dump(cut), "cut.yaml", KINDS).hosts[0].kind == "local"


def test_a_probe_spanning_a_far_host_and_another_is_refused_naming_both() -> None:
    spec = SPEC.replace("  - {kind: timer, host: e1, cpu: [1]}\n", "  - {kind: rr, host: n, dest: e1, rate: 100pps}\n")
    exp = parse(spec, "f.yaml", KINDS)
    with pytest.raises(RunError, match=r"spans hosts n, e1, and e1 runs on another kernel"):
        check(exp, ["e1"])
    check(exp, [])  # (both near: nothing to refuse)
