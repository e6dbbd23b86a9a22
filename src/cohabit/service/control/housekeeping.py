"""What each reconciler pass does besides driving deployments: store the fleet when it is read
from a source that changes under us (a cluster), and sweep the runtime's engines for those
whose deployment has ended (a crash came between ending it and stopping its engine)."""

from __future__ import annotations

import logging
import time
from collections.abc import Callable

from cohabit.hardware.model import Fleet
from cohabit.runtime.interface import EngineHandle, EngineRuntime
from cohabit.store import deployments, ledger
from cohabit.store.database import Database
from cohabit.store.records import DRIVEN

log = logging.getLogger(__name__)


class Housekeeping:
    """`refresh_fleet` reads `fleet_source` at most every `fleet_refresh_s`; `sweep` looks at
    the runtime's engines at its first call and then every `sweep_interval_s`."""

    def __init__(
        self,
        db: Database,
        runtime: EngineRuntime,
        *,
        fleet_source: Callable[[], Fleet] | None,
        fleet_refresh_s: float,
        sweep_interval_s: float,
        stop_engine: Callable[[EngineHandle], None],
    ) -> None:
        self.db = db
        self.runtime = runtime
        self.fleet_source = fleet_source
        self.fleet_refresh_s = fleet_refresh_s
        self.sweep_interval_s = sweep_interval_s
        self._stop_engine = stop_engine
        self._fleet_read_at: float | None = None
        self._swept_at: float | None = None

    def refresh_fleet(self) -> None:
        """Store the source's fleet when due; a failed read keeps the stored one."""
        now = time.monotonic()
        due = self._fleet_read_at is None or now - self._fleet_read_at >= self.fleet_refresh_s
        if self.fleet_source is None or not due:
            return
        self._fleet_read_at = now
        try:
            fleet = self.fleet_source()
        except Exception:
            log.exception("reading the fleet failed; placing against the last one stored")
            return
        ledger.save_fleet(self.db, fleet)

    def sweep(self) -> None:
        """When due, stop every engine the runtime finds whose deployment has ended. Engines
        of live deployments, or of ids this database does not hold, are left alone."""
        now = time.monotonic()
        if self._swept_at is not None and now - self._swept_at < self.sweep_interval_s:
            return
        handles = self.runtime.engines()
        current = deployments.statuses(self.db, [h.deployment_id for h in handles])
        for handle in handles:
            known = current.get(handle.deployment_id)
            if known is not None and known[0] not in DRIVEN:
                status = known[0].value
                log.warning("stopping the engine of %s deployment %s", status, handle.deployment_id)
                self._stop_engine(handle)
        self._swept_at = now
