"""Autoscaling: a deployment's copies between `min_copies` (at least one while it is loaded)
and `max_copies`, on the requests it has in flight through this server (service/activity.py,
where a copy's traffic counts under its deployment's id) and those the gateway holds for it.

Each pass, for each deployment this reconciler drives: above `per_copy` requests per ready
copy for `window_s`, one copy is added (a REQUESTED row the reconciler places on its own,
spread from the others; when it does not fit, the deployment's timeline says why and it
serves on); when one copy fewer would still carry at most half of `per_copy` each for
`window_s`, the highest-index copy is stopped. After a decision, none for `cooldown_s`.
Every decision is a `scaled` event with its reason, e.g. "2 → 3 copies: 9 requests in
flight on 2 copies, above 4 per copy for 30 s".
"""

from __future__ import annotations

import logging
import time
from collections.abc import Callable
from dataclasses import dataclass
from typing import TYPE_CHECKING

from cohabit.runtime.interface import EngineHandle, handle_from_json
from cohabit.service import timeline
from cohabit.store import copies, deployments
from cohabit.store.events import EventKind
from cohabit.store.records import ACTIVE, DeploymentRecord, DeploymentStatus

if TYPE_CHECKING:
    from cohabit.service.reconciler import Reconciler

log = logging.getLogger(__name__)
S = DeploymentStatus


@dataclass(frozen=True, slots=True, kw_only=True)
class ScalePolicy:
    """When to add or remove a copy (the server's settings)."""

    per_copy: int = 4  # requests in flight (and held) per ready copy above which one is added
    window_s: float = 30.0  # how long the load must stay above (or below) before acting
    cooldown_s: float = 60.0  # after a decision, how long before the next one


@dataclass(frozen=True, slots=True, kw_only=True)
class _Load:
    copies: int  # active copies
    ready: int  # copies serving
    in_flight: int
    waiting: int

    @property
    def demand(self) -> int:
        return self.in_flight + self.waiting

    def words(self) -> str:
        held = f" and {self.waiting} waiting" if self.waiting else ""
        requests = "request" if self.in_flight == 1 else "requests"
        ready = "copy" if self.ready == 1 else "copies"
        return f"{self.in_flight} {requests} in flight{held} on {self.ready} {ready}"


class Autoscaler:
    """The autoscaling of one reconciler's deployments (run under its pass lock)."""

    def __init__(
        self, reconciler: Reconciler, *, clock: Callable[[], float] = time.monotonic
    ) -> None:
        self.reconciler = reconciler
        self.policy = ScalePolicy()
        # Requests the gateway holds for a deployment (set by the app to Gateway.waiting).
        self.waiting: Callable[[str], int] = lambda _deployment_id: 0
        self._clock = clock
        self._above: dict[str, float] = {}  # since when above, per deployment
        self._below: dict[str, float] = {}
        self._decided: dict[str, float] = {}  # when the last decision was made

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
        last = self._decided.get(record.id)
        if last is not None and now - last < self.policy.cooldown_s:
            return
        rows = [
            r for r in deployments.copies_of(self.reconciler.db, record.id) if r.status in ACTIVE
        ]
        ready = [r for r in rows if r.status is S.DEPLOYED and r.engine_handle is not None]
        load = _Load(
            copies=len(rows),
            ready=len(ready),
            in_flight=self.reconciler.activity.in_flight(record.id),
            waiting=self.waiting(record.id),
        )
        scaling = record.scaling
        low = max(scaling.min_copies, 1)
        high = max(scaling.max_copies or scaling.starting_copies, low)
        per = self.policy.per_copy
        if load.copies < low:
            self._add(record, load, f"below min_copies {low}")
            return
        settled = load.ready == load.copies  # no copy on its way: judge what serves
        above = settled and load.copies < high and load.demand > per * load.ready
        if self._held(self._above, record.id, above, now):
            window = f"{self.policy.window_s:g} s"
            self._add(record, load, f"{load.words()}, above {per} per copy for {window}")
            return
        below = load.copies > low and 2 * load.demand <= per * (load.copies - 1)
        if self._held(self._below, record.id, below, now):
            half = f"{per / 2:g}"
            fewer = load.copies - 1
            why = (
                f"{load.words()}, at most {half} per copy on {fewer} for {self.policy.window_s:g} s"
            )
            self._remove(record, rows, load, why)

    def _held(self, since: dict[str, float], deployment_id: str, true: bool, now: float) -> bool:
        """Whether a condition has held for the window (it starts counting when first true)."""
        if not true:
            since.pop(deployment_id, None)
            return False
        return now - since.setdefault(deployment_id, now) >= self.policy.window_s

    def _decided_now(self, deployment_id: str) -> None:
        self._decided[deployment_id] = self._clock()
        self._above.pop(deployment_id, None)
        self._below.pop(deployment_id, None)

    def _add(self, record: DeploymentRecord, load: _Load, why: str) -> None:
        added = copies.add(self.reconciler.db, record.id)
        if added is None:
            return
        self._decided_now(record.id)
        message = f"{load.copies} → {load.copies + 1} copies: {why}"
        self._scaled(record.id, message, load, added.copy_index)
        self.reconciler.wake()  # placed on the next pass

    def _remove(
        self, record: DeploymentRecord, rows: list[DeploymentRecord], load: _Load, why: str
    ) -> None:
        last = max((r for r in rows if r.copy_of is not None), key=lambda r: r.copy_index)
        ended = deployments.end(self.reconciler.db, last.id)
        if ended is None:
            return
        self._decided_now(record.id)
        reconciler = self.reconciler
        message = f"{load.copies} → {load.copies - 1} copies: {why}"
        timeline.note(reconciler.db, last.id, EventKind.STOPPED, f"stopped: scaled down ({why})")
        self._scaled(record.id, message, load, last.copy_index)
        handle = reconciler.forget(last.id) or handle_from_json(ended.engine_handle)
        reconciler.stop_engine(handle or EngineHandle(deployment_id=last.id))

    def _scaled(self, deployment_id: str, message: str, load: _Load, copy_index: int) -> None:
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
