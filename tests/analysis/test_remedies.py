"""From a cause to its remedy: the first remedy offered changes something,
and it is what a real-time engineer would try."""

from __future__ import annotations

from typing import Any

import pytest

from loopscope.analysis.advise import _left_out
from loopscope.analysis.attribution import LATE_IRQ
from loopscope.analysis.remedies import Context, Remedy, by_hand, iso_remedy, partition, remedy


def plain(r: Remedy) -> list[dict[str, Any]]:
    """A remedy's tunings as an experiment file writes them."""
    return [t.model_dump(mode="json", exclude_unset=True) for t in r.tunings]


def _ctx(**kw: object) -> Context:
    base = {"probe": "t", "probe_kind": "timer", "probe_cpus": [1], "usable": [0, 1], "probe_takes_cpu": True, "probe_takes_priority": True, "loads": ["hog"]}
    return Context(**{**base, **kw})  # type: ignore[arg-type]


def test_a_hog_gets_the_probe_sched_fifo_first() -> None:
    r = remedy("load: hog", _ctx())
    assert r is not None and "SCHED_FIFO" in r.remedy and plain(r) == [{"kind": "sched", "probe": "t", "policy": "fifo", "priority": 80}]


def test_a_probe_already_at_fifo_80_is_moved_away_from_a_hog_instead() -> None:
    r = remedy("load: hog", _ctx(probe_priority=80))
    assert r is not None and "SCHED_FIFO" not in r.remedy and any(t.kind == "affinity" for t in r.tunings)


@pytest.mark.parametrize("cause", ["lab: sync", "timer interrupt", "IPI: function call", "IPI: TLB shootdown"])
def test_a_probe_pinned_to_cpu_1_is_never_told_to_pin_itself_to_cpu_1(cause: str) -> None:
    r = remedy(cause, _ctx())
    assert r is not None and plain(r) == [{"kind": "affinity", "probe": "t", "cpus": [0]}], r


def test_calls_aimed_at_the_probes_cpu_hold_the_loads_that_run_elsewhere_not_the_probe() -> None:
    # (moving the probe beside the sender made it later: the calls are aimed at whichever CPU it is on)
    r = remedy("IPI: function call", _ctx(loads=["ipi", "hog"], load_cpus={"ipi": [0], "hog": [1]}))
    assert r is not None and plain(r) == [{"kind": "limit", "load": "ipi", "cpus": 0.001}] and "ipi_send_cpu" in r.command, r


def test_a_thread_competing_with_a_probe_that_cannot_take_a_priority_moves_the_probe_elsewhere() -> None:
    r = remedy("thread: zoo-fifo", _ctx(probe_takes_priority=False))
    assert r is not None and plain(r) == [{"kind": "affinity", "probe": "t", "cpus": [0]}]


def test_timer_slack_is_remedied_by_sched_fifo_which_has_none() -> None:
    r = remedy("timer slack", _ctx())
    assert r is not None and r.tunings and plain(r)[0]["policy"] == "fifo" and "PR_SET_TIMERSLACK" in r.command


def test_a_late_timer_interrupt_is_found_with_other_tools_and_no_phase_pretends_to_change_it() -> None:
    r = remedy(LATE_IRQ, _ctx())
    assert r is not None and r.tunings == [] and "irqsoff" in r.command and "steal" in r.command and r.by_hand, r


def test_a_thread_blocked_on_another_gets_advice_about_its_lock_and_no_tuning() -> None:
    r = remedy("blocked: zoo-holder", _ctx(probe_kind="program", probe_takes_priority=False))
    assert r is not None and "zoo-holder" in r.remedy and "PRIO_INHERIT" in r.command and r.tunings == []


def test_page_faults_of_a_probe_that_ran_unlocked_are_remedied_by_locking_its_memory() -> None:
    r = remedy("page faults", _ctx(probe_kind="program", probe_takes_priority=False, probe_unlocked=True))
    assert r is not None and plain(r) == [{"kind": "mlock", "probe": "t"}] and "mlockall" in r.command


def test_page_faults_of_a_probe_already_locked_get_advice_and_no_tuning() -> None:
    r = remedy("page faults", _ctx(probe_unlocked=False))
    assert r is not None and r.tunings == []


def test_rt_throttling_takes_real_time_priority_from_the_loads_on_the_probes_cpu_only() -> None:
    r = remedy("throttled: RT", _ctx(loads=["spin", "far"], load_cpus={"spin": [1], "far": [0]}))
    assert r is not None and plain(r) == [{"kind": "sched", "load": "spin", "policy": "other"}]


def test_a_slowed_probe_gets_its_neighbours_held_to_a_sliver_of_a_cpu() -> None:
    r = remedy("slowed: no kernel event", _ctx(loads=["cache"], load_cpus={"cache": [0]}))
    assert r is not None and plain(r) == [{"kind": "limit", "load": "cache", "cpus": 0.001}]


def test_a_pipelines_own_stage_is_never_named_as_an_intruder_to_move_or_preempt() -> None:
    ctx = _ctx(
        probe_kind="pipeline", probe_cpus=[], probe_takes_cpu=False, probe_takes_priority=False, own_threads=frozenset({"ls-pipe-source", "ls-pipe-node"})
    )
    r = remedy("thread: ls-pipe-source", ctx)
    assert r is not None and "probe's own" in r.remedy and r.tunings == [] and "taskset" not in r.command and r.by_hand
    # a thread that is not the probe's own is still one to move
    other = remedy("thread: kworker/1:1", ctx)
    assert other is not None and "move kworker/1:1" in other.remedy


def test_a_load_beside_a_probe_that_takes_no_cpu_is_not_moved_alone_and_says_why() -> None:
    r = remedy("load: cpu", _ctx(probe_kind="pipeline", probe_cpus=[], probe_takes_cpu=False, probe_takes_priority=False, loads=["cpu"]))
    assert r is not None and r.tunings == [] and "pipeline probe takes no cpu" in by_hand(r, _ctx(probe_kind="pipeline", probe_takes_cpu=False))


def test_a_load_beside_a_pinnable_probe_moves_with_the_probe_pinned_apart() -> None:
    r = remedy("load: hog", _ctx(probe_priority=80))
    assert r is not None and plain(r) == [{"kind": "affinity", "load": "hog", "cpus": [0]}, {"kind": "affinity", "probe": "t", "cpus": [1]}]


def test_every_remedy_the_follow_up_leaves_out_says_why_and_names_whose_tuning_it_gives_way_to() -> None:
    ctx, have = _ctx(probe_priority=80), []  # type: ignore[var-annotated]
    idle = remedy("CPU idle", ctx)
    assert _left_out(idle, ctx, True, "t: CPU idle", have) is None
    # the same tuning for another probe's cause is applied: in the follow-up
    assert _left_out(remedy("CPU idle", ctx), ctx, True, "u: CPU idle", have) is None
    # a different tuning of a target already tuned gives way, naming whose remedy stays
    assert _left_out(remedy("timer interrupt", ctx), ctx, True, "t: timer interrupt", have) is None
    said = _left_out(remedy("migrations", ctx), ctx, True, "t: migrations", have)
    assert said is not None and "t: timer interrupt" in said, said
    assert "reboot" not in str(_left_out(None, ctx, True, "t: x", have)) and _left_out(None, ctx, True, "t: x", have) == "no remedy known"
    assert _left_out(remedy("blocked: holder", ctx), ctx, True, "t: blocked", have) == "a change to the program (its locking), which a phase cannot make"
    assert len(have) == 2  # dma_latency once, the probe's affinity once


def test_several_intruders_on_a_pinned_probes_cpu_are_offered_one_partition_and_the_labs_own_loads_are_not_counted() -> None:
    ctx = _ctx()
    row = partition(ctx, [("thread: kworker/1:1", 0.3), ("irq: virtio0-input.0", 0.2), ("load: hog", 0.4)])
    assert row is not None and row["cause"] == "intruders: thread: kworker/1:1, irq: virtio0-input.0" and row["share"] == 0.5
    assert plain(iso_remedy(ctx)) == [{"kind": "isolate", "cpus": [1]}] and "audit --cpus 1" in str(row["command"])
    # one intruder, a load (isolation does not move the lab's loads), or an unpinned probe: no partition offered
    assert partition(ctx, [("thread: kworker/1:1", 0.3), ("load: hog", 0.6)]) is None
    assert partition(_ctx(probe_cpus=[]), [("thread: a", 0.3), ("irq: b", 0.3)]) is None
    # nor where it would keep every CPU (outliers of an unpinned probe on both), or for a probe that takes no cpu
    assert partition(_ctx(probe_cpus=[0, 1]), [("thread: a", 0.3), ("irq: b", 0.3)]) is None
    assert partition(_ctx(probe_takes_cpu=False), [("thread: a", 0.3), ("irq: b", 0.3)]) is None
