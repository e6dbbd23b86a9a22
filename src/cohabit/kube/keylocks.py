"""One lock per key, made on first use and dropped when nobody holds or waits for it.

The operator serializes what it does to one ModelDeployment (its pod, its status) under that
deployment's lock, so work on different deployments overlaps; only the budget decision
itself takes the one lock every decision shares (`controller.py`).
"""

from __future__ import annotations

import threading
from collections.abc import Iterator
from contextlib import contextmanager


class KeyedLocks:
    """`with locks.hold(key):` — re-entrant per key, as `threading.RLock` is."""

    def __init__(self) -> None:
        self._guard = threading.Lock()
        self._locks: dict[str, tuple[threading.RLock, int]] = {}

    @contextmanager
    def hold(self, key: str) -> Iterator[None]:
        with self._guard:
            lock, users = self._locks.get(key, (threading.RLock(), 0))
            self._locks[key] = (lock, users + 1)
        try:
            with lock:
                yield
        finally:
            with self._guard:
                lock, users = self._locks[key]
                if users == 1:
                    del self._locks[key]
                else:
                    self._locks[key] = (lock, users - 1)

    def __len__(self) -> int:
        """Keys held or waited for now."""
        with self._guard:
            return len(self._locks)
