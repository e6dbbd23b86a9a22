"""Failed logins counted per client address, so that guessing a token at /api/auth/token
costs time: after `max_failures` in `window_s` the address is refused (429) until the window
ends. In memory and bounded: at most `max_clients` addresses are remembered."""

from __future__ import annotations

import math
import time
from collections import OrderedDict
from collections.abc import Callable
from dataclasses import dataclass

MAX_FAILURES = 10
WINDOW_S = 60.0
# Enough for every client of a busy server; 10,000 entries of a few hundred bytes each.
MAX_CLIENTS = 10_000


@dataclass(slots=True)
class _Window:
    started_s: float
    failures: int


class FailureThrottle:
    """Counts failures per client in fixed windows. Used from the event loop only (the login
    route's own code, never a worker thread), so it needs no lock. `clock` returns seconds
    (time.monotonic); tests hand in their own."""

    def __init__(
        self,
        *,
        max_failures: int = MAX_FAILURES,
        window_s: float = WINDOW_S,
        max_clients: int = MAX_CLIENTS,
        clock: Callable[[], float] = time.monotonic,
    ) -> None:
        self.max_failures = max_failures
        self.window_s = window_s
        self.max_clients = max_clients
        self._clock = clock
        self._windows: OrderedDict[str, _Window] = OrderedDict()

    def __len__(self) -> int:
        return len(self._windows)

    def retry_after_s(self, client: str) -> int | None:
        """Whole seconds until `client` may try again, or None when it may now."""
        window = self._current(client)
        if window is None or window.failures < self.max_failures:
            return None
        return max(1, math.ceil(window.started_s + self.window_s - self._clock()))

    def failed(self, client: str) -> None:
        window = self._current(client)
        if window is None:
            # The oldest remembered address goes first, so the memory held stays bounded
            # however many addresses fail.
            while len(self._windows) >= self.max_clients:
                self._windows.popitem(last=False)
            window = self._windows[client] = _Window(started_s=self._clock(), failures=0)
        window.failures += 1

    def succeeded(self, client: str) -> None:
        self._windows.pop(client, None)

    def _current(self, client: str) -> _Window | None:
        window = self._windows.get(client)
        if window is not None and self._clock() >= window.started_s + self.window_s:
            del self._windows[client]
            return None
        return window
