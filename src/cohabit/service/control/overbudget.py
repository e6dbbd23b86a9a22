"""What happens when the meter finds an engine above its budget: an `over_budget` event on the
deployment's timeline, then its policy — `warn` (nothing more: the health entry and the
event say it), `restart` (the engine started again inside the budget it holds) or `stop`
(STOPPED, its budget released). The policy is the deploy request's `over_budget` field.
"""

from __future__ import annotations

import logging
from collections.abc import Callable
from enum import StrEnum

from cohabit.runtime.interface import EngineRuntime
from cohabit.service.control import admission as service
from cohabit.service.control import timeline
from cohabit.service.telemetry.meter import EngineReading
from cohabit.store.database import Database
from cohabit.store.events import EventKind
from cohabit.store.records import DeploymentRecord
from cohabit.units import format_gib

log = logging.getLogger(__name__)


class OverBudgetPolicy(StrEnum):
    WARN = "warn"
    RESTART = "restart"
    STOP = "stop"


def policy_of(record: DeploymentRecord) -> OverBudgetPolicy:
    """The deployment's policy; `warn` when its request did not choose (admission checked
    the value)."""
    try:
        return OverBudgetPolicy(record.request.get("over_budget") or OverBudgetPolicy.WARN)
    except ValueError:
        return OverBudgetPolicy.WARN


class OverBudget:
    """The meter's handler for an engine that went over its budget (called once per episode).
    `restart(deployment_id)` is the reconciler's; False when this process does not drive it."""

    def __init__(
        self,
        db: Database,
        runtime: EngineRuntime,
        *,
        restart: Callable[[str], bool],
        tolerance_fraction: float,
    ) -> None:
        self.db = db
        self.runtime = runtime
        self.restart = restart
        self.tolerance_fraction = tolerance_fraction

    def __call__(self, record: DeploymentRecord, reading: EngineReading) -> None:
        policy = policy_of(record)
        used = reading.used_bytes or 0
        then = {
            OverBudgetPolicy.WARN: "left running (policy warn)",
            OverBudgetPolicy.RESTART: "restarting it inside its budget (policy restart)",
            OverBudgetPolicy.STOP: "stopping it and releasing its budget (policy stop)",
        }[policy]
        message = (
            f"engine uses {format_gib(used)}, above its budget of "
            f"{format_gib(reading.budget_bytes)} (tolerance "
            f"{self.tolerance_fraction:.0%}); {then}"
        )
        log.warning("deployment %s: %s", record.id, message)
        timeline.note(
            self.db,
            record.id,
            EventKind.OVER_BUDGET,
            message,
            used_bytes=used,
            budget_bytes=reading.budget_bytes,
            tolerance_fraction=self.tolerance_fraction,
            policy=policy.value,
        )
        if policy is OverBudgetPolicy.STOP:
            reason = f"over its memory budget ({format_gib(used)} used)"
            service.stop(self.db, self.runtime, record.id, reason=reason)
        elif policy is OverBudgetPolicy.RESTART and not self.restart(record.id):
            log.warning("deployment %s is driven by another server; not restarted", record.id)
