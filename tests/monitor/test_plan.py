"""How a monitor's probes measure (``plan.lanes``): side by side when they
are on different hosts, in turn when they share one, and what ``check``
says of it."""

from __future__ import annotations

from loopscope.kinds import KINDS
from loopscope.monitor.plan import footprint, lanes
from loopscope.spec import parse
from loopscope.spec.models import Experiment

HOSTS = "hosts: [{name: a}, {name: b}, {name: c}]\n"


def _exp(probes: str) -> Experiment:
    return parse(f"name: m\n{HOSTS}probes:\n{probes}monitor: {{period: 3s, threshold: 1ms}}\n", "m.yaml", KINDS)


def _names(exp: Experiment) -> list[list[str]]:
    return [[str(p.name) for p in lane] for lane in lanes(exp)]


def test_probes_on_different_hosts_measure_side_by_side_and_those_sharing_a_host_take_turns() -> None:
    exp = _exp("  - {kind: timer, name: ta, host: a}\n  - {kind: timer, name: tb, host: b}\n  - {kind: timer, name: tb2, host: b}\n")
    assert _names(exp) == [["ta"], ["tb", "tb2"]]
    said = "\n".join(footprint(exp))
    assert "2 lanes measure side by side every period; within a lane the probes take turns (tb, tb2)" in said


def test_an_rr_probe_joins_the_lanes_of_both_its_hosts() -> None:
    exp = _exp("  - {kind: timer, name: ta, host: a}\n  - {kind: rr, name: ping, host: b, dest: a}\n  - {kind: timer, name: tc, host: c}\n")
    assert _names(exp) == [["ta", "ping"], ["tc"]]


def test_one_probe_measures_every_period() -> None:
    assert "its probe measures every period" in "\n".join(footprint(_exp("  - {kind: timer, name: ta, host: a}\n")))


def test_the_recorder_records_only_the_cpus_of_pinned_probes_held_up_only_there() -> None:
    from loopscope.kernel.capture import filter_for
    from loopscope.monitor.plan import recorded_cpus

    assert recorded_cpus(_exp("  - {kind: timer, name: ta, host: a, cpu: [1]}\n  - {kind: sched, name: sb, host: b, cpu: [1]}\n")) == [1]
    # an unpinned probe, or a kind held up elsewhere too (an rr probe's packets), records every CPU
    assert recorded_cpus(_exp("  - {kind: timer, name: ta, host: a}\n")) is None
    assert recorded_cpus(_exp("  - {kind: timer, name: ta, host: a, cpu: [1]}\n  - {kind: rr, name: p, host: b, dest: a}\n")) is None
    # the kernel keeps what fires there, and the wake-ups and migrations aimed there from any CPU
    assert filter_for("sched:sched_switch", cpus=[1]) == "CPU == 1"
    assert "target_cpu == 1" in str(filter_for("sched:sched_waking", cpus=[1]))
    assert str(filter_for("sched:sched_migrate_task", cpus=[1, 3])).startswith("(orig_cpu == 1 || orig_cpu == 3 || dest_cpu == 1 || dest_cpu == 3) && ")
