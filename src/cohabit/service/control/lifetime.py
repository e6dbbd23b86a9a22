"""How long a deployment's copies stay loaded, for the reconciler: a scale-to-zero deployment
(`min_copies: 0`) idle past its keep-alive is unloaded (engine stopped, budget released,
still listed and routable), and one whose `duration` has ended is stopped, whoever drives it.

Idleness is the latest of: the last use this process's gateway saw (in flight, or held
for its load, counts as now), the last use any server recorded in the store (each records
its own every `use_flush_s` at most), the deployment's load, and this process's start —
traffic another process saw before it is recorded only every `use_flush_s`.
"""

from __future__ import annotations

import time
from dataclasses import dataclass
from datetime import UTC, datetime
from functools import partial
from typing import TYPE_CHECKING

from cohabit.service.control.copies import has_copies
from cohabit.service.control.driver import stop_ended
from cohabit.store import deployments, scaling
from cohabit.store.database import utcnow
from cohabit.store.events import EventKind
from cohabit.store.records import DeploymentRecord

if TYPE_CHECKING:
    from cohabit.service.control.driver import Driver
    from cohabit.service.control.warm import Warm

# How often (at most) a server records a deployment's last use in the store, where the
# reconciler driving it (maybe in another process) reads it.
USE_FLUSH_S = 5.0


@dataclass(frozen=True, slots=True, kw_only=True)
class Use:
    """What a server knows of a deployment's last use."""

    in_flight: int  # requests through this server now, and those held for its load
    used_here: datetime | None  # the last request through this server
    used_anywhere: datetime | None  # the last use any server recorded in the store
    loaded_at: datetime | None  # when it was last loaded (DEPLOYED)
    watched_since: datetime  # when this process started watching


@dataclass(frozen=True, slots=True, kw_only=True)
class Unload:
    why: str


def loads_on_demand(record: DeploymentRecord) -> bool:
    """A REQUESTED deployment that is being loaded again (it ran before and was unloaded, or
    was admitted unloaded), rather than deployed for the first time."""
    return record.deployed_at is not None or record.scaling.starting_copies == 0


def idle_s(use: Use, now: datetime) -> float | None:
    """Seconds since the deployment was last used, loaded, or watched by this process,
    whichever is latest; None while a request is in flight here."""
    if use.in_flight > 0:
        return None
    moments = [use.watched_since, use.loaded_at, use.used_anywhere, use.used_here]
    last = max(m for m in moments if m is not None)
    return (now - last).total_seconds()


def idle_unload(use: Use, *, keep_alive_s: int, now: datetime) -> Unload | None:
    """Unload a scale-to-zero deployment idle for its keep-alive or longer, e.g. idle since
    301 s with `keep_alive: 300s`: `Unload("idle for 301 s")`."""
    idle = idle_s(use, now)
    if idle is None or idle < keep_alive_s:
        return None
    return Unload(why=f"idle for {idle:.0f} s")


class Lifetime:
    """One reconciler's idle unloads and duration ends (see the module docstring)."""

    def __init__(self, reconciler: Driver, *, warm: Warm | None = None) -> None:
        self.reconciler = reconciler
        self.warm = warm  # idle vLLM copies sleep instead (warm.py); None: all unload
        self.started_at = utcnow()
        self.use_flush_s = USE_FLUSH_S
        self._flushed: dict[str, float] = {}  # last use flushed to the store, per deployment

    def note_use(self) -> None:
        """Record in the store when deployments were last used through this server (in
        flight counts as now), at most every `use_flush_s` per deployment."""
        now = time.time()
        due: dict[str, datetime] = {}
        seen = self.reconciler.activity.snapshot()
        self._flushed = {key: at for key, at in self._flushed.items() if key in seen}
        for deployment_id, usage in seen.items():
            used = now if usage.in_flight > 0 else usage.last_used
            if used is None or used - self._flushed.get(deployment_id, 0.0) < self.use_flush_s:
                continue
            due[deployment_id] = datetime.fromtimestamp(used, UTC)
            self._flushed[deployment_id] = used
        scaling.note_use(self.reconciler.db, due)

    def use_of(self, record: DeploymentRecord) -> Use:
        """What this process knows of the deployment's last use."""
        activity = self.reconciler.activity
        local = activity.last_used(record.deployment_id)  # a copy's counts as its own
        return Use(
            # A request held for its load is one on its way: the load is for it.
            in_flight=activity.in_flight(record.deployment_id)
            + activity.waiting(record.deployment_id),
            used_here=None if local is None else datetime.fromtimestamp(local, UTC),
            used_anywhere=record.last_used_at,
            loaded_at=record.deployed_at,
            watched_since=self.started_at,
        )

    def unload_idle(self) -> None:
        """Unload this process's scale-to-zero deployments idle longer than their keep-alive,
        or put their copies to sleep where the warm tier can (one already asleep stays so)."""
        reconciler = self.reconciler
        now = utcnow()
        for record in scaling.scaling_to_zero(reconciler.db, owner=reconciler.owner):
            if record.sleep_level is not None and not has_copies(record):
                continue  # asleep, alone (copies may still have one to put to sleep)
            action = idle_unload(
                self.use_of(record), keep_alive_s=record.scaling.keep_alive_s, now=now
            )
            if action is not None:
                rest = partial(self._rest, record, reason=action.why)
                reconciler.contained(record.id, rest)

    def _rest(self, record: DeploymentRecord, *, reason: str) -> None:
        if self.reconciler.activity.waiting(record.deployment_id) > 0:
            return  # a request is held for it (a wake on its way): not idle
        if self.warm is not None and self.warm.sleep_all(record, reason=reason):
            return
        self.reconciler.unload(record.id, reason=reason)

    def end_durations(self) -> None:
        """Stop the deployments whose duration has ended, whoever drives them (as a user's
        stop would: STOPPED, budget released, engine stopped)."""
        reconciler = self.reconciler
        for record in scaling.past_their_end(reconciler.db, utcnow()):
            ended = deployments.end(reconciler.db, record.id)
            if ended is None:
                continue
            minutes = record.scaling.duration_min
            reason = f"its duration of {minutes} min ended"
            text = f"stopped: {reason}"
            stop_ended(reconciler, ended, EventKind.STOPPED, text, reason=reason)
