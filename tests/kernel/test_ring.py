"""The draining flight recorder's memory (``kernel.ring.Ring``): pages kept
as read, found by the time in their headers, let go after ``reach``."""

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
    r = Ring(reach_ns=1_000, page_size=PAGE)
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
    r = Ring(reach_ns=1_000, page_size=PAGE)
    r.gaps.append((0, 100, 200, 42))
    r.gaps.append((1, 2_900, 3_100, 7))
    r.trim(now_k=4_000)
    assert r.gaps == [(1, 2_900, 3_100, 7)]
