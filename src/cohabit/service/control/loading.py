"""The reconciler's record of its loads as they happen: the milestones each engine's log
shows (`progress`, at every poll of a loading engine), the load's phases once it serves
(`ready`), and the time from serving to the first answer to a request held for the load
(`first_tokens`, once a pass). Each lands on the deployment's timeline (timeline.py) and in
the load-phase histogram; loadphases.py reads them back.
"""

from __future__ import annotations

import logging
from datetime import UTC, datetime

from cohabit.runtime.interface import EngineStatus, MilestoneSeen
from cohabit.service.control import loadphases, timeline
from cohabit.service.telemetry.activity import Activity
from cohabit.service.telemetry.metrics import ReconcilerCounters
from cohabit.store import deployments, events
from cohabit.store.database import Database
from cohabit.store.errors import RecordNotFound
from cohabit.store.events import EventKind

log = logging.getLogger(__name__)


class LoadWatch:
    """One reconciler's loads (see the module docstring)."""

    def __init__(self, db: Database, counters: ReconcilerCounters, activity: Activity) -> None:
        self.db = db
        self.counters = counters
        self.activity = activity
        # Deployment id → the milestones recorded of its engine's current run.
        self._recorded: dict[str, tuple[MilestoneSeen, ...]] = {}

    def progress(self, deployment_id: str, engine: EngineStatus) -> None:
        """Record the milestones the runtime has seen since the last poll (a new run of the
        engine starts with none recorded)."""
        seen = engine.milestones
        recorded = self._recorded.get(deployment_id, ())
        if seen[: len(recorded)] != recorded:
            recorded = ()  # another run of the engine
        for new in seen[len(recorded) :]:
            timeline.milestone(self.db, deployment_id, new)
        if seen:
            self._recorded[deployment_id] = seen
        else:
            self._recorded.pop(deployment_id, None)

    def ready(self, deployment_id: str, *, pid: int | None) -> None:
        """It serves: the `healthy` event with this load's phases, counted per engine."""
        self._recorded.pop(deployment_id, None)
        phases = timeline.healthy(self.db, deployment_id, pid=pid)
        if phases is not None:
            self.counters.load_phases(phases.engine, phases.seconds)

    def first_tokens(self) -> None:
        """For each load whose first held request was answered since the last pass (this
        process's gateway): `first_token`, from the deployment's `deployed_at` to that
        answer's first byte, once per load."""
        for deployment_id, answered in self.activity.first_answers().items():
            try:
                self._first_token(deployment_id, datetime.fromtimestamp(answered, UTC))
            except Exception:  # a lost phase, never a failed pass
                log.exception("recording the first token of deployment %s failed", deployment_id)

    def _first_token(self, deployment_id: str, answered: datetime) -> None:
        try:
            record = deployments.get(self.db, deployment_id)
        except RecordNotFound:
            return
        ready_at = record.deployed_at
        if ready_at is None or answered < ready_at:
            return  # answered by a copy that served before this load
        recent = events.latest(self.db, deployment_id, limit=loadphases.RECENT_EVENTS)
        this_load = []
        for event in reversed(recent):
            if event.kind == EventKind.HEALTHY.value:
                break
            this_load.append(event.kind)
        if EventKind.FIRST_TOKEN.value in this_load:
            return  # one per load: a later held request's answer does not count
        engine = next(
            (
                str((e.data or {}).get("engine", ""))
                for e in reversed(recent)
                if e.kind == EventKind.STARTED.value
            ),
            record.engine,
        )
        seconds = round((answered - ready_at).total_seconds(), 3)
        self.counters.load_phases(engine, {loadphases.FIRST_TOKEN: seconds})
        timeline.first_token(self.db, deployment_id, seconds=seconds)
