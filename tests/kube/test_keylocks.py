"""`KeyedLocks`: one re-entrant lock per key, gone once nobody holds or waits for it."""

from __future__ import annotations

import threading

from cohabit.kube.keylocks import KeyedLocks

WAIT_S = 10.0  # only how long a broken lock may take to fail the test


def test_a_key_is_reentrant_and_dropped_when_released() -> None:
    locks = KeyedLocks()
    with locks.hold("ns/a"), locks.hold("ns/a"):
        assert len(locks) == 1
    assert len(locks) == 0


def test_other_keys_are_held_at_once() -> None:
    locks = KeyedLocks()
    entered = threading.Event()

    def other() -> None:
        with locks.hold("ns/b"):
            entered.set()

    with locks.hold("ns/a"):
        thread = threading.Thread(target=other)
        thread.start()
        assert entered.wait(WAIT_S), "a second key waited for the first"
        thread.join(WAIT_S)
    assert len(locks) == 0


def test_one_key_is_held_by_one_thread_at_a_time() -> None:
    locks = KeyedLocks()
    waiting = threading.Event()
    entered = threading.Event()

    def same() -> None:
        waiting.set()
        with locks.hold("ns/a"):
            entered.set()

    with locks.hold("ns/a"):
        thread = threading.Thread(target=same)
        thread.start()
        assert waiting.wait(WAIT_S)
        # The other thread counts as waiting for the key, and has not entered.
        assert not entered.is_set()
    assert entered.wait(WAIT_S)
    thread.join(WAIT_S)
    assert len(locks) == 0
