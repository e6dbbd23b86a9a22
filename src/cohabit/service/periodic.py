"""A step run on a daemon thread of its own: once at start, then every `interval_s` until
stopped. A step that raises is logged and tried again at the next tick, so a database that is
away for a while, or a bad sample, never ends the thread. The retention purge and the memory
meter run this way."""

from __future__ import annotations

import logging
import threading
from collections.abc import Callable

log = logging.getLogger(__name__)


class Periodic:
    def __init__(self, name: str, step: Callable[[], object], *, interval_s: float) -> None:
        self.name = name  # the thread's name, and what a failed step's log line says
        self.step = step
        self.interval_s = interval_s
        self._stopping = threading.Event()
        self._thread: threading.Thread | None = None

    def start(self) -> None:
        self._thread = threading.Thread(target=self._loop, name=self.name, daemon=True)
        self._thread.start()

    def stop(self, *, timeout_s: float = 10.0) -> None:
        self._stopping.set()
        if self._thread is not None:
            self._thread.join(timeout_s)

    def _loop(self) -> None:
        while not self._stopping.is_set():
            try:
                self.step()
            except Exception:
                log.exception("%s: a step failed; trying again in %s s", self.name, self.interval_s)
            self._stopping.wait(self.interval_s)
