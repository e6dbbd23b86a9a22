"""Retention: ended deployments (STOPPED, FAILED, ERROR, MUST_REDOWNLOAD) whose end lies
further back than the server's retention are deleted, with their engine's logs, so the
database and the engine directory hold recent history only. `Retention` runs a purge on a
thread of its own, at start and then every `interval_s`; `app.create_app` starts it.
"""

from __future__ import annotations

import logging
from datetime import datetime, timedelta

from cohabit.runtime.interface import EngineRuntime
from cohabit.service.periodic import Periodic
from cohabit.store import deployments
from cohabit.store.database import Database, utcnow

log = logging.getLogger(__name__)
DAY_S = 86_400.0
PURGE_INTERVAL_S = 600.0
BATCH = 500  # records per transaction, so a first purge of a long history never holds the
# database's write lock for long


def purge(
    db: Database, runtime: EngineRuntime, *, retention_s: float, now: datetime | None = None
) -> int:
    """Delete the deployments that ended more than `retention_s` before `now`, logs first
    (a purge cut short leaves the record, and the next one finishes it); how many went."""
    cutoff = (now or utcnow()) - timedelta(seconds=retention_s)
    purged = 0
    while True:
        ids = deployments.ended_before(db, cutoff, limit=BATCH)
        for deployment_id in ids:
            try:
                runtime.discard(deployment_id)
            except Exception:  # its files stay behind; the record still goes
                log.exception("deleting the engine files of %s failed", deployment_id)
        purged += deployments.delete_ended(db, ids)
        if len(ids) < BATCH:
            return purged


class Retention:
    """Purges on a daemon thread; `retention_s` of 0 keeps everything (no thread runs)."""

    def __init__(
        self,
        db: Database,
        runtime: EngineRuntime,
        *,
        retention_s: float,
        interval_s: float = PURGE_INTERVAL_S,
    ) -> None:
        self.db = db
        self.runtime = runtime
        self.retention_s = retention_s
        self.interval_s = interval_s
        self._periodic = Periodic("cohabit-retention", self.purge_once, interval_s=interval_s)

    def start(self) -> None:
        if self.retention_s > 0:
            self._periodic.start()

    def stop(self, *, timeout_s: float = 10.0) -> None:
        self._periodic.stop(timeout_s=timeout_s)

    def purge_once(self) -> None:
        purged = purge(self.db, self.runtime, retention_s=self.retention_s)
        if purged:
            log.info("purged %d ended deployment(s) past retention", purged)
