"""loopscope.once: a value made by one thread, however many ask."""

from __future__ import annotations

import threading
import time

import pytest

from loopscope.once import Once


def test_a_thread_asking_while_another_makes_the_value_waits_for_it_instead_of_making_it_again() -> None:
    once, made, got = Once(), [], []

    def make() -> int:
        made.append(threading.current_thread().name)
        time.sleep(0.2)
        return 42

    threads = [threading.Thread(target=lambda: got.append(once.get("k", make)), name=f"t{i}") for i in range(4)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    assert got == [42] * 4
    assert len(made) == 1


def test_different_keys_are_made_side_by_side() -> None:
    once, inside, most = Once(), [0], [0]
    lock = threading.Lock()

    def make() -> None:
        with lock:
            inside[0] += 1
            most[0] = max(most[0], inside[0])
        time.sleep(0.2)
        with lock:
            inside[0] -= 1

    threads = [threading.Thread(target=once.get, args=(k, make)) for k in ("a", "b")]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    assert most[0] == 2


def test_a_value_whose_making_raised_is_made_again_by_the_next_to_ask() -> None:
    once = Once()

    def fail() -> int:
        raise OSError("gone")

    with pytest.raises(OSError):
        once.get("k", fail)
    assert once.get("k", lambda: 7) == 7
