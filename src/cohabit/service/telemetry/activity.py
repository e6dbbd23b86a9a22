"""What the gateway sees of each deployment's traffic, in this server process's memory:
requests in flight, when it was last used, and counts of requests, errors, generated tokens
and latency, and the requests it holds until a deployment serves. The gateway writes it on
every request (`begin`/`finish`, `hold`/`release`: a lock and a few additions, nothing here
touches the database); the control loop reads it to find idle deployments (scale to zero,
preemption) and the load autoscaling weighs, and tells a held request's watcher the moment
its deployment serves (`watch`/`serving`), and when the first answer to a request held for a
load began (`answered`, taken by the control loop for the load's `first_token`); `/metrics`
exports it. It sits below both, so neither the gateway nor the control loop imports the
other.

Each server process keeps its own: several processes behind one database each see the
traffic they proxied, which is what idleness needs (a copy idle here gets no requests here).
"""

from __future__ import annotations

import bisect
import threading
import time
from collections.abc import Callable
from dataclasses import dataclass, field

# Upper bounds (seconds) of the latency histogram's buckets, Prometheus style (a last +Inf
# bucket is implied): from a one-token answer to a long generation.
LATENCY_BUCKETS_S = (0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1.0, 2.5, 5.0, 10.0, 30.0, 60.0)


@dataclass(slots=True)
class Usage:
    """One deployment's traffic as seen by this process (a copy is handed out by `get`)."""

    in_flight: int = 0
    last_used: float | None = None  # time.time() of the last request's start or end
    requests: int = 0  # finished requests, whatever their answer
    errors: int = 0  # finished with a 5xx or a broken connection
    completion_tokens: int = 0  # generated tokens the engine reported (`usage`)
    seconds_total: float = 0.0  # summed request durations
    # Finished requests per latency bucket (not cumulative); the last counts those above
    # the largest bound.
    buckets: list[int] = field(default_factory=lambda: [0] * (len(LATENCY_BUCKETS_S) + 1))


class Activity:
    """Thread-safe per-deployment traffic counters (see the module docstring)."""

    def __init__(self, *, clock: Callable[[], float] = time.time) -> None:
        self._lock = threading.Lock()
        self._usage: dict[str, Usage] = {}
        self._held: dict[str, int] = {}  # deployment id → requests held until it serves
        self._watchers: dict[str, list[Callable[[], None]]] = {}  # woken when it serves
        # Deployment id → clock time the first answer to a request held for its load began,
        # until the control loop takes it (`first_answers`).
        self._answered: dict[str, float] = {}
        # Deployment ids and engine URLs this process is stopping → time.monotonic() then.
        self._withdrawn: dict[str, float] = {}
        self._now = clock

    def begin(self, deployment_id: str) -> None:
        """A request to the deployment entered the gateway."""
        with self._lock:
            usage = self._usage.get(deployment_id)
            if usage is None:
                usage = self._usage[deployment_id] = Usage()
            usage.in_flight += 1
            usage.last_used = self._now()

    def finish(
        self,
        deployment_id: str,
        *,
        seconds: float,
        ok: bool,
        completion_tokens: int | None = None,
    ) -> None:
        """The request `begin` counted has ended (answered, failed or cut off)."""
        with self._lock:
            usage = self._usage.get(deployment_id)
            if usage is None:
                usage = self._usage[deployment_id] = Usage(in_flight=1)
            usage.in_flight = max(0, usage.in_flight - 1)
            usage.last_used = self._now()
            usage.requests += 1
            usage.errors += 0 if ok else 1
            usage.completion_tokens += completion_tokens or 0
            usage.seconds_total += seconds
            usage.buckets[bisect.bisect_left(LATENCY_BUCKETS_S, seconds)] += 1

    def in_flight(self, deployment_id: str) -> int:
        with self._lock:
            usage = self._usage.get(deployment_id)
            return 0 if usage is None else usage.in_flight

    def last_used(self, deployment_id: str) -> float | None:
        """time.time() of the deployment's last request here; None when it had none."""
        with self._lock:
            usage = self._usage.get(deployment_id)
            return None if usage is None else usage.last_used

    def get(self, deployment_id: str) -> Usage:
        """A copy of the deployment's counters (zeros when it had no traffic here)."""
        with self._lock:
            usage = self._usage.get(deployment_id)
            return Usage() if usage is None else _copy(usage)

    def snapshot(self) -> dict[str, Usage]:
        """Copies of every deployment's counters."""
        with self._lock:
            return {key: _copy(usage) for key, usage in self._usage.items()}

    def hold(self, deployment_id: str) -> bool:
        """A request is held until the deployment serves (the gateway asked for its load);
        True for the first one held, which is the one that asks."""
        with self._lock:
            held = self._held.get(deployment_id, 0)
            self._held[deployment_id] = held + 1
            return held == 0

    def release(self, deployment_id: str) -> None:
        """The request `hold` counted is no longer held (routed, refused or gone)."""
        with self._lock:
            held = self._held.get(deployment_id, 0) - 1
            if held > 0:
                self._held[deployment_id] = held
            else:
                self._held.pop(deployment_id, None)

    def held(self) -> frozenset[str]:
        """The deployments requests are held for (the control loop looks at their engines
        sooner)."""
        with self._lock:
            return frozenset(self._held)

    def watch(self, deployment_id: str, wake: Callable[[], None]) -> None:
        """Call `wake` (from the control loop's thread) when `deployment_id` starts serving."""
        with self._lock:
            self._watchers.setdefault(deployment_id, []).append(wake)

    def unwatch(self, deployment_id: str, wake: Callable[[], None]) -> None:
        with self._lock:
            watchers = self._watchers.get(deployment_id, [])
            if wake in watchers:
                watchers.remove(wake)
            if not watchers:
                self._watchers.pop(deployment_id, None)

    def serving(self, deployment_id: str) -> None:
        """`deployment_id` now serves (the control loop recorded it): wake its watchers."""
        with self._lock:
            watchers = list(self._watchers.get(deployment_id, ()))
        for wake in watchers:
            wake()

    def answered(self, load_id: str) -> None:
        """The engine's answer to a request held for `load_id`'s load began to come back (its
        first byte): the earliest since `first_answers` last took them counts."""
        with self._lock:
            self._answered.setdefault(load_id, self._now())

    def first_answers(self) -> dict[str, float]:
        """Take what `answered` recorded: deployment id → clock time (time.time())."""
        with self._lock:
            taken, self._answered = self._answered, {}
        return taken

    def withdraw(self, deployment_id: str, base_url: str | None) -> None:
        """The control loop is about to stop this engine (its row already says so): route
        nothing more to it, though the gateway's table may not have read that yet."""
        now = time.monotonic()
        with self._lock:
            self._withdrawn[deployment_id] = now
            if base_url:
                self._withdrawn[base_url.rstrip("/")] = now

    def withdrawn(self) -> frozenset[str]:
        """Deployment ids and engine URLs withdrawn since the table was last read."""
        with self._lock:
            return frozenset(self._withdrawn)

    def settle(self, read_began: float) -> None:
        """A read of the table that began at `read_began` (time.monotonic()) is current: what
        was withdrawn before it shows there."""
        with self._lock:
            if self._withdrawn:
                self._withdrawn = {k: t for k, t in self._withdrawn.items() if t >= read_began}

    def waiting(self, deployment_id: str) -> int:
        """How many requests are held until `deployment_id` serves (autoscaling counts them
        as load)."""
        with self._lock:
            return self._held.get(deployment_id, 0)

    def forget(self, deployment_id: str) -> None:
        """Drop an ended deployment's counters."""
        with self._lock:
            self._usage.pop(deployment_id, None)


def _copy(usage: Usage) -> Usage:
    return Usage(
        in_flight=usage.in_flight,
        last_used=usage.last_used,
        requests=usage.requests,
        errors=usage.errors,
        completion_tokens=usage.completion_tokens,
        seconds_total=usage.seconds_total,
        buckets=list(usage.buckets),
    )
