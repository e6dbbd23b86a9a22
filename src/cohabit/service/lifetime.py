"""How long a deployment's copies stay loaded, for the reconciler: a scale-to-zero deployment
(`min_copies: 0`) idle past its keep-alive is unloaded (engine stopped, budget released,
still listed and routable), and one whose `duration` has ended is stopped, whoever drives it.

Idleness is the latest of: the last use this process's gateway saw (in flight counts as
now), the last use any server recorded in the store (each records its own every
`use_flush_s` at most), the deployment's load, and this process's start — traffic another
process saw before it is recorded only every `use_flush_s`.
"""

from __future__ import annotations

import time
from datetime import UTC, datetime
from functools import partial
from typing import TYPE_CHECKING

from cohabit.runtime.interface import EngineHandle, handle_from_json
from cohabit.service import timeline
from cohabit.store import deployments, scaling
from cohabit.store.database import utcnow
from cohabit.store.events import EventKind
from cohabit.store.records import DeploymentRecord

if TYPE_CHECKING:
    from cohabit.service.reconciler import Reconciler

# How often (at most) a server records a deployment's last use in the store, where the
# reconciler driving it (maybe in another process) reads it.
USE_FLUSH_S = 5.0


class Lifetime:
    """One reconciler's idle unloads and duration ends (see the module docstring)."""

    def __init__(self, reconciler: Reconciler) -> None:
        self.reconciler = reconciler
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

    def idle_s(self, record: DeploymentRecord) -> float | None:
        """Seconds since the deployment was last used (through any server, or loaded, or this
        process started, whichever is latest); None while a request is in flight here."""
        activity = self.reconciler.activity
        if activity.in_flight(record.deployment_id) > 0:  # a copy's count as its own
            return None
        local = activity.last_used(record.deployment_id)
        moments = [self.started_at, record.deployed_at, record.last_used_at]
        if local is not None:
            moments.append(datetime.fromtimestamp(local, UTC))
        last = max(m for m in moments if m is not None)
        return (utcnow() - last).total_seconds()

    def unload_idle(self) -> None:
        """Unload this process's scale-to-zero deployments idle longer than their keep-alive."""
        reconciler = self.reconciler
        for record in scaling.scaling_to_zero(reconciler.db, owner=reconciler.owner):
            idle = self.idle_s(record)
            if idle is not None and idle >= record.scaling.keep_alive_s:
                unload = partial(reconciler.unload, record.id, reason=f"idle for {idle:.0f} s")
                reconciler.contained(record.id, unload)

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
            # On the timeline before the engine's stop, as the API's stop does: whoever sees
            # the engine gone finds the event there.
            text = f"stopped: {reason}"
            timeline.note(reconciler.db, record.id, EventKind.STOPPED, text, reason=reason)
            handle = reconciler.forget(record.id) or handle_from_json(ended.engine_handle)
            reconciler.stop_engine(handle or EngineHandle(deployment_id=record.id))
