"""The draining flight recorder's memory (``kernel.ring.Ring``): pages kept
as read, found by the time in their headers, let go after ``reach`` once
the ring holds more than its spare bytes."""

from __future__ import annotations

from loopscope.kernel.ring import Ring

PAGE = 64


def _pages(*stamps: int) -> bytes:
    """Pages whose headers carry these times (the rest of each page is filler)."""
    return b"".join(t.to_bytes(8, "little") + bytes([i + 1]) * (PAGE - 8) for i, t in enumerate(stamps))


def test_a_keep_gets_the_pages_whose_span_meets_its_window_and_no_others() -> None:
    r = Ring(reach_ns=10_000, page_size=PAGE)
    r.add(0, _pages(100, 200, 300, 400))
    got = r.over(0, 250, 320)
    # a page runs from its time to the next page's: 200-300 and 300-400 meet [250, 320]
    assert [int.from_bytes(p[:8], "little") for p in got] == [200, 300]
    assert [int.from_bytes(p[:8], "little") for p in r.over(0, 450, 500)] == [400]  # the newest page runs on
    assert r.over(1, 0, 1000) == []  # a CPU that recorded nothing


def test_pages_older_than_the_reach_go_and_a_window_before_them_is_known_to_be_cut() -> None:
    r = Ring(reach_ns=1_000, page_size=PAGE, spare_bytes=0)
    r.add(0, _pages(100, 200, 3_000, 3_500))
    assert r.bytes == 4 * PAGE
    r.trim(now_k=4_500)  # the edge is 3,500: the pages that ended before it go (200-3,000 did; 3,000-3,500 did not)
    assert [int.from_bytes(p[:8], "little") for p in r.over(0, 0, 10_000)] == [3_000, 3_500]
    assert r.bytes == 2 * PAGE and r.cut[0] == 3_000


def test_a_short_tail_that_is_no_page_is_not_kept() -> None:
    r = Ring(reach_ns=1_000, page_size=PAGE)
    r.add(0, _pages(100) + b"\x01\x02")
    assert r.bytes == PAGE and len(r.over(0, 0, 1_000)) == 1


def test_a_gap_the_kernel_overwrote_is_let_go_with_the_pages_of_its_time() -> None:
    r = Ring(reach_ns=1_000, page_size=PAGE, spare_bytes=0)
    r.gaps.append((0, 100, 200, 42))
    r.gaps.append((1, 2_900, 3_100, 7))
    r.trim(now_k=4_000)
    assert r.gaps == [(1, 2_900, 3_100, 7)]


def test_pages_older_than_the_reach_stay_while_the_ring_has_room_so_a_late_keep_still_finds_its_window() -> None:
    r = Ring(reach_ns=1_000, page_size=PAGE, spare_bytes=4 * PAGE)
    r.add(0, _pages(100, 200, 3_000, 3_500))
    r.gaps.append((0, 150, 180, 5))
    r.trim(now_k=4_500)  # 100-200 and 200-3,000 ended before the edge (3,500), but four pages fit in the spare bytes
    assert [int.from_bytes(p[:8], "little") for p in r.over(0, 150, 250)] == [100, 200]
    assert 0 not in r.cut and r.gaps == [(0, 150, 180, 5)]  # nothing was let go: a window there is whole


def test_over_its_spare_bytes_the_ring_lets_go_of_the_oldest_pages_first_whichever_cpu_they_are_of() -> None:
    r = Ring(reach_ns=1_000, page_size=PAGE, spare_bytes=5 * PAGE)
    r.add(0, _pages(1_000, 1_500, 5_100))
    r.add(1, _pages(100, 2_000, 5_000))
    r.trim(now_k=6_000)  # six pages, room for five; the edge is 5,000: of the pages that ended before it, the oldest goes
    assert r.bytes == 5 * PAGE
    assert [int.from_bytes(p[:8], "little") for p in r.over(1, 0, 10_000)] == [2_000, 5_000]
    assert [int.from_bytes(p[:8], "little") for p in r.over(0, 0, 10_000)] == [1_000, 1_500, 5_100]
    assert r.cut == {1: 2_000}
    r.spare_bytes = 0
    r.trim(now_k=6_000)  # no room: every page that ended before the edge goes, and no other
    assert r.bytes == 4 * PAGE and r.cut == {0: 1_500, 1: 2_000}
