"""`slowed: no kernel event`: a span's running time beyond the same work's
median in the phase it is compared with."""

from __future__ import annotations

import polars as pl

from loopscope.analysis import slowed as SL


def _wins(base: list[int], other: list[int]) -> pl.DataFrame:
    rows = [("baseline", x) for x in base] + [("load", x) for x in other]
    return pl.DataFrame({"probe": ["t loop/work"] * len(rows), "phase": [p for p, _ in rows], "latency_ns": [x for _, x in rows], "span": [True] * len(rows)})


def test_running_beyond_the_reference_phases_median_is_slowed_and_the_rest_stays_running() -> None:
    refs = SL.references(_wins([100] * 9, [150] * 9), ["baseline", "load"], {})
    assert refs.to_dicts() == [{"probe": "t loop/work", "phase": "load", "ref_phase": "baseline", "ref_ns": 100}]
    att = pl.DataFrame({"id": [7, 7], "cause": ["running", "irq: x"], "ns": [240, 10]})
    outl = pl.DataFrame({"id": [7], "probe": ["t loop/work"], "phase": ["load"], "span": [True]})
    got = {r["cause"]: r["ns"] for r in SL.split(att, outl, refs).to_dicts()}
    assert got == {"running": 100, SL.LABEL: 140, "irq: x": 10}


def test_the_reference_phase_and_a_phase_whose_median_did_not_move_are_never_slowed() -> None:
    refs = SL.references(_wins([100] * 9, [105] * 9), ["baseline", "load"], {})
    assert not len(refs)
    att = pl.DataFrame({"id": [1], "cause": ["running"], "ns": [900]})
    outl = pl.DataFrame({"id": [1], "probe": ["t loop/work"], "phase": ["baseline"], "span": [True]})
    assert SL.split(att, outl, SL.references(_wins([100] * 9, [150] * 9), ["baseline", "load"], {})).to_dicts() == att.to_dicts()


def test_a_wake_up_window_is_not_a_span_and_is_never_slowed() -> None:
    refs = SL.references(_wins([100] * 9, [150] * 9), ["baseline", "load"], {})
    att = pl.DataFrame({"id": [3], "cause": ["running"], "ns": [400]})
    outl = pl.DataFrame({"id": [3], "probe": ["t loop/work"], "phase": ["load"], "span": [False]})
    assert SL.split(att, outl, refs).to_dicts() == att.to_dicts()


def test_a_late_timer_interrupt_in_a_recording_without_interrupts_says_it_may_be_an_unrecorded_handler() -> None:
    from loopscope import _native
    from loopscope.analysis import recorded as R

    # the split's own name for it, hedged the same way as an idle-looking gap
    assert R.LATE_IRQ == _native.LATE_IRQ
    h = R.hedged(["sched_switch", "sched_wakeup", "hrtimer_start"])
    assert h[R.LATE_IRQ].startswith("timer interrupt late or not recorded (interrupts,")


def test_an_idle_cpu_in_a_recording_without_interrupts_says_it_may_be_them() -> None:
    from loopscope.analysis import recorded as R

    minimal = ["sched_switch", "sched_wakeup", "sched_waking"]
    h = R.hedged(minimal)
    assert h["CPU idle"].startswith("CPU idle or not recorded (interrupts, soft interrupts, timer interrupts, IPIs, timer slack")
    full = [*minimal, "irq_handler_entry", "softirq_entry", "local_timer_entry", "call_function_entry", "hrtimer_start"]
    assert R.hedged(full) == {}
