"""What the gateway sees of each deployment's traffic, in this server process's memory:
requests in flight, when it was last used, and counts of requests, errors, generated tokens
and latency, and the requests it holds until a deployment serves. The gateway writes it on
every request (`begin`/`finish`, `hold`/`release`: a lock and a few additions, nothing here
touches the database); the control loop reads it to find idle deployments (scale to zero,
preemption) and the load autoscaling weighs, and `/metrics` exports it. It sits below both,
so neither the gateway nor the control loop imports the other.

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
