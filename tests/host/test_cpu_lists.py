"""The kernel's CPU lists and masks, as isolate and audit read and write them."""

from __future__ import annotations

from loopscope.host.isolate import cpu_list, cpus_without, mask_without


def test_a_cpu_list_reads_ranges_and_skips_isolcpus_flags() -> None:
    assert cpu_list("0-2,5") == [0, 1, 2, 5] and cpu_list("managed_irq,domain,1-3") == [1, 2, 3] and cpu_list("") == []


def test_a_list_without_the_isolated_cpus_may_be_empty_and_the_caller_chooses_where_then() -> None:
    assert cpus_without("0-1", {1}) == [0] and cpus_without("1", {1}) == []


def test_a_mask_loses_the_isolated_cpus_and_keeps_its_layout_of_words() -> None:
    assert mask_without("3", {1}) == "1" and mask_without("00000000,000000ff", {0, 7}) == "00000000,0000007e"
