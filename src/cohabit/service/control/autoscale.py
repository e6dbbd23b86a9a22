"""Autoscaling: a deployment's copies between `min_copies` (at least one while it is loaded)
and `max_copies`, on the requests it has in flight through this server (where a copy's
traffic counts under its deployment's id) and those the gateway holds for it, both read from
service/telemetry/activity.py. `decide` is the decision, pure; `Autoscaler` observes and acts.

Each pass, for each deployment this reconciler drives: above `per_copy` requests per ready
copy for `window_s`, one copy is added (a REQUESTED row the reconciler places on its own,
spread from the others; when it does not fit, the deployment's timeline says why and it
serves on); when one copy fewer would still carry at most half of `per_copy` each for
`window_s`, the highest-index copy is stopped. After a decision, none for `cooldown_s`.
Every decision is a `scaled` event with its reason, e.g. "2 → 3 copies: 9 requests in
flight on 2 copies, above 4 per copy for 30 s".

Copies asleep (the warm tier, warm.py) are not counted: a copy is added by waking the
lowest-index one asleep, when there is one, before a new one is placed. A deployment whose
copies all sleep is left alone: a request wakes it.
"""

from __future__ import annotations

import logging
import time
from collections.abc import Callable
from dataclasses import dataclass, replace
from typing import TYPE_CHECKING

from cohabit.service.control import timeline
from cohabit.service.control.driver import stop_ended
from cohabit.store import copies, copyset, deployments
from cohabit.store.events import EventKind
from cohabit.store.records import ACTIVE, DeploymentRecord, Scaling

if TYPE_CHECKING:
    from cohabit.service.control.driver import Driver

log = logging.getLogger(__name__)


@dataclass(frozen=True, slots=True, kw_only=True)
class ScalePolicy:
    """When to add or remove a copy (the server's settings)."""

    per_copy: int = 4  # requests in flight (and held) per ready copy above which one is added
    window_s: float = 30.0  # how long the load must stay above (or below) before acting
    cooldown_s: float = 60.0  # after a decision, how long before the next one


@dataclass(frozen=True, slots=True, kw_only=True)
class Load:
    """What a deployment carries now, as one pass sees it."""

    copies: int  # active copies
    ready: int  # copies serving
    in_flight: int  # requests through this server
    waiting: int  # requests the gateway holds until it serves

    @property
    def demand(self) -> int:
        return self.in_flight + self.waiting

    def words(self) -> str:
        held = f" and {self.waiting} waiting" if self.waiting else ""
        requests = "request" if self.in_flight == 1 else "requests"
        ready = "copy" if self.ready == 1 else "copies"
        return f"{self.in_flight} {requests} in flight{held} on {self.ready} {ready}"


@dataclass(frozen=True, slots=True, kw_only=True)
class ScaleMemory:
    """What autoscaling remembers of a deployment between passes (monotonic seconds)."""

    above_since: float | None = None  # when the load was first seen above, still is
    below_since: float | None = None  # when one copy fewer was first seen to carry it
    decided_at: float | None = None  # the last decision carried out

    def decided(self, now: float) -> ScaleMemory:
        """After a decision was carried out: the cool-down starts, the windows start again."""
        return ScaleMemory(decided_at=now)


@dataclass(frozen=True, slots=True, kw_only=True)
class AddCopy:
    why: str


@dataclass(frozen=True, slots=True, kw_only=True)
class RemoveCopy:
    """Stop the highest-index copy."""

    why: str


ScaleAction = AddCopy | RemoveCopy


def decide(
    load: Load,
    scaling: Scaling,
    memory: ScaleMemory,
    *,
    policy: ScalePolicy,
    now: float,
) -> tuple[ScaleAction | None, ScaleMemory]:
    """The decision of one pass for one deployment, and what to remember until the next (the
    decision's own cool-down is added by `ScaleMemory.decided` once it was carried out).

    e.g. 9 requests in flight on 1 ready copy of `max_copies: 2`, above 4 per copy since 30 s
    ago: `AddCopy("9 requests in flight on 1 copy, above 4 per copy for 30 s")`."""
    if memory.decided_at is not None and now - memory.decided_at < policy.cooldown_s:
        return None, memory
    low = max(scaling.min_copies, 1)
    high = max(scaling.max_copies or scaling.starting_copies, low)
    per = policy.per_copy
    if load.copies < low:
        return AddCopy(why=f"below min_copies {low}"), memory
    settled = load.ready == load.copies  # no copy on its way: judge what serves
    above = settled and load.copies < high and load.demand > per * load.ready
    above_since = _since(memory.above_since, above, now)
    below = load.copies > low and 2 * load.demand <= per * (load.copies - 1)
    below_since = _since(memory.below_since, below, now)
    remembered = replace(memory, above_since=above_since, below_since=below_since)
    window = f"{policy.window_s:g} s"
    if above_since is not None and now - above_since >= policy.window_s:
        return AddCopy(why=f"{load.words()}, above {per} per copy for {window}"), remembered
    if below_since is not None and now - below_since >= policy.window_s:
        fewer = load.copies - 1
        why = f"{load.words()}, at most {per / 2:g} per copy on {fewer} for {window}"
        return RemoveCopy(why=why), remembered
    return None, remembered


def _since(since: float | None, true: bool, now: float) -> float | None:
    """When a condition started holding (now, when it just did); None while it does not."""
    if not true:
        return None
    return now if since is None else since


class Autoscaler:
    """One reconciler's autoscaling: observes each deployment it drives that may scale, asks
    `decide`, and carries the decision out (see the module docstring)."""

    def __init__(
        self,
        reconciler: Driver,
        *,
        policy: ScalePolicy | None = None,
        clock: Callable[[], float] = time.monotonic,
    ) -> None:
        self.reconciler = reconciler
        self.policy = ScalePolicy() if policy is None else policy
        self._clock = clock
        self._memory: dict[str, ScaleMemory] = {}

    def run(self) -> None:
        """One look at every deployment this reconciler drives that may scale."""
        reconciler = self.reconciler
        for record in copies.scalable(reconciler.db, owner=reconciler.owner):
            try:
                self._decide(record)
            except Exception:  # scaling is retried next pass; it never fails a deployment
                log.exception("scaling deployment %s failed", record.id)

    def _decide(self, record: DeploymentRecord) -> None:
        now = self._clock()
        memory = self._memory.get(record.id, ScaleMemory())
        if memory.decided_at is not None and now - memory.decided_at < self.policy.cooldown_s:
            return  # no need to read the copies
        active = [
            r for r in deployments.copies_of(self.reconciler.db, record.id) if r.status in ACTIVE
        ]
        rows = [r for r in active if r.sleep_level is None]
        asleep = [r for r in active if r.sleep_level is not None]
        if asleep and not rows:
            return  # put away while idle: a request wakes it
        ready = copyset.serving(rows)
        activity = self.reconciler.activity
        load = Load(
            copies=len(rows),
            ready=len(ready),
            in_flight=activity.in_flight(record.id),
            waiting=activity.waiting(record.id),
        )
        action, self._memory[record.id] = decide(
            load, record.scaling, memory, policy=self.policy, now=now
        )
        if isinstance(action, AddCopy) and asleep:
            self._wake(record, asleep[0], load, action.why)
        elif isinstance(action, AddCopy):
            self._add(record, load, action.why)
        elif isinstance(action, RemoveCopy):
            self._remove(record, rows, load, action.why)

    def _decided_now(self, deployment_id: str) -> None:
        self._memory[deployment_id] = ScaleMemory().decided(self._clock())

    def _add(self, record: DeploymentRecord, load: Load, why: str) -> None:
        added = copies.add(self.reconciler.db, record.id)
        if added is None:
            return
        self._decided_now(record.id)
        message = f"{load.copies} → {load.copies + 1} copies: {why}"
        self._scaled(record.id, message, load, added.copy_index)
        self.reconciler.wake()  # placed on the next pass

    def _wake(self, record: DeploymentRecord, copy: DeploymentRecord, load: Load, why: str) -> None:
        """Add a copy by waking one asleep (room made for it as for a load); the cool-down
        starts either way, so a wake that finds no room is not tried every pass."""
        self._decided_now(record.id)
        if not self.reconciler.load(copy.id):
            return
        message = f"{load.copies} → {load.copies + 1} copies: {why}; copy {copy.copy_index} woken"
        self._scaled(record.id, message, load, copy.copy_index)

    def _remove(
        self, record: DeploymentRecord, rows: list[DeploymentRecord], load: Load, why: str
    ) -> None:
        last = max((r for r in rows if r.copy_of is not None), key=lambda r: r.copy_index)
        ended = deployments.end(self.reconciler.db, last.id)
        if ended is None:
            return
        self._decided_now(record.id)
        message = f"{load.copies} → {load.copies - 1} copies: {why}"
        stop_ended(self.reconciler, ended, EventKind.STOPPED, f"stopped: scaled down ({why})")
        self._scaled(record.id, message, load, last.copy_index)

    def _scaled(self, deployment_id: str, message: str, load: Load, copy_index: int) -> None:
        timeline.note(
            self.reconciler.db,
            deployment_id,
            EventKind.SCALED,
            message,
            copies_before=load.copies,
            in_flight=load.in_flight,
            waiting=load.waiting,
            ready=load.ready,
            per_copy=self.policy.per_copy,
            copy_index=copy_index,
        )
