"""Polling a deployment until it is ready, shared by the sync and async clients: which statuses
end the wait, which errors are worth another poll (5xx, no answer — up to
`MAX_TRANSIENT_POLL_ERRORS` in a row; never a 4xx), how long each poll and pause may take so
the whole wait stays inside its timeout; and which log lines are new since the last poll.
"""

from __future__ import annotations

import time
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field

from cohabit.sdk.errors import (
    CohabitError,
    DeploymentFailedError,
    ServerError,
    ServerUnreachable,
    deploy_timeout,
    failure_message,
)
from cohabit.sdk.schemas import Deployment, DeploymentEvent, DeploymentEvents
from cohabit.sdk.statuses import FAILURE_STATUSES, READY_STATUSES

MAX_TRANSIENT_POLL_ERRORS = 3
POLL_REQUEST_TIMEOUT_S = 30.0
# A stopped deployment never becomes ready: waiting on it ends the wait too.
WAIT_FAILURE_STATUSES = FAILURE_STATUSES | {"STOPPED"}

OnUpdate = Callable[[Deployment], None]


@dataclass(slots=True, kw_only=True)
class Wait:
    """One wait's state. The loop: poll (`request_timeout_s`), then `outcome(record)` or
    `failed_poll(err)`, then sleep `pause_s()` — which raises TimeoutError when time is up."""

    deployment_id: str
    timeout_s: float | None
    poll_interval_s: float
    clock: Callable[[], float] = time.monotonic
    started_s: float = field(init=False)
    transient_errors: int = 0
    last_status: str | None = None

    def __post_init__(self) -> None:
        if self.poll_interval_s <= 0:
            raise ValueError("poll_interval_seconds must be > 0")
        self.started_s = self.clock()

    def remaining_s(self) -> float | None:
        if self.timeout_s is None:
            return None
        return self.timeout_s - (self.clock() - self.started_s)

    def request_timeout_s(self) -> float:
        remaining = self.remaining_s()
        if remaining is None:
            return POLL_REQUEST_TIMEOUT_S
        return max(0.5, min(POLL_REQUEST_TIMEOUT_S, remaining))

    def outcome(self, record: Deployment) -> Deployment | None:
        """The record when it is DEPLOYED (or UNLOADED: routable, its first request loads
        it); None to keep polling; raises on a failure status."""
        self.transient_errors = 0
        status = record.status.upper()
        self.last_status = status
        if status in READY_STATUSES:
            return record
        if status in WAIT_FAILURE_STATUSES:
            raise DeploymentFailedError(
                failure_message(self.deployment_id, status, record.last_error_message),
                status=status,
                last_error_code=record.last_error_code,
                last_error_message=record.last_error_message,
                deployment_id=self.deployment_id,
                no_fit=None if record.no_fit is None else record.no_fit.model_dump(),
            )
        return None

    def failed_poll(self, err: CohabitError) -> None:
        """Swallow a transient error (count it); re-raise a 4xx or the one too many."""
        if not isinstance(err, ServerError | ServerUnreachable):
            raise err
        self.transient_errors += 1
        if self.transient_errors >= MAX_TRANSIENT_POLL_ERRORS:
            raise err

    def pause_s(self) -> float:
        remaining = self.remaining_s()
        if remaining is None:
            return self.poll_interval_s
        if remaining <= 0:
            raise deploy_timeout(
                self.deployment_id, timeout_s=self.timeout_s or 0.0, status=self.last_status
            )
        return min(self.poll_interval_s, remaining)


# Event kinds that close a timeline. Once the deployment has ended, a follower stops when it
# has seen one, or after `ENDED_GRACE_POLLS` empty polls: the server writes the last event
# just after the deployment ends, so a poll may see the end before that event.
CLOSING_EVENTS = frozenset({"stopped", "failed", "no_fit"})
ENDED_GRACE_POLLS = 2


@dataclass(slots=True, kw_only=True)
class EventFollow:
    """Following a timeline, shared by the sync and async clients: poll with `after`, hand
    each page to `take` (its events are the new ones), stop once `done`; pause between
    polls only after a page that brought nothing (a full one may have more behind it)."""

    after: int = 0
    ended: bool = False
    closed: bool = False
    quiet_ended_polls: int = 0

    def take(self, page: DeploymentEvents) -> list[DeploymentEvent]:
        self.after = max(self.after, page.cursor)
        self.closed = self.closed or any(e.kind in CLOSING_EVENTS for e in page.events)
        self.ended = page.ended
        if page.ended and not page.events:
            self.quiet_ended_polls += 1
        return page.events

    @property
    def done(self) -> bool:
        return self.ended and (self.closed or self.quiet_ended_polls > ENDED_GRACE_POLLS)


def new_lines(seen: Sequence[str], current: Sequence[str]) -> list[str]:
    """Lines of `current` (a log tail) not already printed from `seen` (the previous tail):
    everything after the longest end of `seen` that `current` starts with."""
    for overlap in range(min(len(seen), len(current)), 0, -1):
        if list(seen[-overlap:]) == list(current[:overlap]):
            return list(current[overlap:])
    return list(current)
