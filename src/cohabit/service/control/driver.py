"""The reconciler as the loop's parts act through it: the one place that moves a deployment
it drives, starts and stops engines, and places what it has taken.

The parts (copies.py, room.py, autoscale.py, lifetime.py) decide, then ask for these acts;
they are typed against this protocol, not against the reconciler, so none of them imports
reconciler.py and the reconciler imports each of them (docs/design.md).
"""

from __future__ import annotations

from collections.abc import Callable, Iterable
from typing import Any, Protocol

from cohabit.placement.decision import Placement
from cohabit.placement.request import PlacementRequest
from cohabit.placement.state import Measurement
from cohabit.runtime.interface import EngineHandle, handle_from_json
from cohabit.service.control import timeline
from cohabit.service.telemetry.activity import Activity
from cohabit.store.database import Database
from cohabit.store.events import EventKind
from cohabit.store.records import DeploymentRecord, DeploymentStatus


class Driver(Protocol):
    """What `Reconciler` offers its parts (see the module)."""

    db: Database
    owner: str  # this process's claim on the deployments it drives
    lease_s: float
    activity: Activity  # the gateway's view of each deployment's traffic
    # The meter's latest figures, which placement must not count on, when a meter runs.
    measurement: Callable[[], Measurement | None]

    def wake(self) -> None:
        """Run the next pass now."""

    def wanted(self, record: DeploymentRecord) -> PlacementRequest:
        """What the deployment asks of the fleet (InvalidInput when it cannot be asked)."""
        ...

    def advance(
        self,
        deployment_id: str,
        allowed: Iterable[DeploymentStatus],
        to: DeploymentStatus,
        values: dict[str, object] | None = None,
    ) -> bool:
        """One guarded move of a deployment this process drives; False when it was not in
        `allowed` (or not this process's) any more."""
        ...

    def launch(
        self,
        record: DeploymentRecord,
        placement: Placement,
        *,
        allowed: Iterable[DeploymentStatus],
        to: DeploymentStatus = ...,
    ) -> None:
        """Start the deployment's engine inside `placement`, moving it to `to`."""

    def unload(self, deployment_id: str, *, reason: str) -> bool:
        """Unload a DEPLOYED deployment with no request in flight here."""
        ...

    def load(self, deployment_id: str) -> bool:
        """Load an unloaded deployment, or wake a sleeping copy; True when on its way."""
        ...

    def place_taken(self, record: DeploymentRecord) -> None:
        """Place a deployment this process has just taken off the queue."""

    def retry_later(self, deployment_id: str) -> None:
        """Back to REQUESTED with no driver: the next pass places it afresh."""

    def contained(self, deployment_id: str, step: Callable[[], object]) -> None:
        """Run one step for a deployment; a fault ends that deployment alone."""

    def forget(self, deployment_id: str) -> EngineHandle | None:
        """Stop watching the deployment's engine here; its handle."""
        ...

    def restart(self, deployment_id: str) -> bool:
        """Stop the engine of a deployment this process drives and start it again inside
        the budget it holds; False when it drives none."""
        ...

    def stop_engine(self, handle: EngineHandle) -> None:
        """Stop an engine; a fault is logged, never raised."""


def stop_ended(
    driver: Driver, record: DeploymentRecord, kind: EventKind, message: str, **data: Any
) -> None:
    """After `record`'s end (or unload) is written: its event on the timeline, then its
    engine stopped (the handle this process holds, else the stored one). The event comes
    first, so whoever sees the engine gone finds why on the timeline."""
    timeline.note(driver.db, record.id, kind, message, **data)
    handle = driver.forget(record.id) or handle_from_json(record.engine_handle)
    driver.stop_engine(handle or EngineHandle(deployment_id=record.id))
