"""Sleeping reservations: a copy's reservation shrinks to its residue while its engine sleeps,
and a wake takes the whole budget back — capacity re-checked (placement/residency.py) in the
same locked transaction that writes it, as `ledger.reserve` does for a placement.

In order: `begin_sleep` (choose the level, hold the host memory level 1 parks the weights
in), then the engine's /sleep, then `settle_sleep` (the devices' budget shrinks to the
residue, only now that the engine has handed it back). To wake: `take_back` (the budget
back, or why not), then the engine's /wake_up, then `awake` (the host memory let go). A
sleep the engine refused ends with `awake` too. From `begin_sleep` to `awake` the
deployment's `sleep_level` is set: the copy does not serve (service/control/warm.py).
Where a meter measured the sleeping engine, `measure_residue` puts its figure in place of
the estimated residue.
"""

from __future__ import annotations

from dataclasses import dataclass

from sqlalchemy import select
from sqlalchemy.orm import Session

from cohabit.placement.residency import SleepLevel, WakeShortfall, sleep_level, wake_shortfall
from cohabit.placement.state import Measurement
from cohabit.store.database import Database
from cohabit.store.ledger import fleet_state
from cohabit.store.records import DeploymentStatus
from cohabit.store.tables import DeploymentRow, ReservationRow


def begin_sleep(db: Database, deployment_id: str, *, weights_bytes: int) -> SleepLevel | None:
    """Choose the level a deployment's engine sleeps at, mark it not serving, and at level 1
    hold `weights_bytes` of its node's host memory. The devices' budget stays whole until
    `settle_sleep`. None when the deployment is not DEPLOYED or holds no reservation; the
    level already chosen when it sleeps or is going to.
    """
    with db.write() as session:
        db.lock_ledger(session)
        deployment = session.get(DeploymentRow, deployment_id, with_for_update=True)
        rows = _rows(session, deployment_id)
        if deployment is None or deployment.status != DeploymentStatus.DEPLOYED or not rows:
            return None
        if deployment.sleep_level is not None:
            return SleepLevel(deployment.sleep_level)
        state = fleet_state(session)
        level = sleep_level(state, node=rows[0].node_name, weights_bytes=weights_bytes)
        deployment.sleep_level = int(level)
        if level is SleepLevel.OFFLOAD:
            rows[0].host_bytes = weights_bytes  # the node's memory, held once per engine
        return level


def settle_sleep(db: Database, deployment_id: str, *, residue_bytes: int) -> bool:
    """The engine sleeps: each device's reservation shrinks to `residue_bytes` (never grows),
    and remembers the budget a wake takes back. False when there was no sleep to settle."""
    with db.write() as session:
        db.lock_ledger(session)
        level = session.scalar(
            select(DeploymentRow.sleep_level).where(DeploymentRow.id == deployment_id)
        )
        rows = _rows(session, deployment_id)
        if level is None or not rows or rows[0].budget_bytes is not None:
            return False
        for row in rows:
            row.budget_bytes = row.reserved_bytes
            row.reserved_bytes = max(0, min(residue_bytes, row.reserved_bytes))
        return True


def awake(db: Database, deployment_id: str) -> None:
    """The engine serves again (it woke, or never went to sleep): it routes again and the
    host memory `begin_sleep` held is let go. A reservation still settled asleep (the wake
    was not taken back) is left as it is."""
    with db.write() as session:
        db.lock_ledger(session)
        rows = _rows(session, deployment_id)
        if any(row.budget_bytes is not None for row in rows):
            return
        for row in rows:
            row.host_bytes = None
        deployment = session.get(DeploymentRow, deployment_id, with_for_update=True)
        if deployment is not None:
            deployment.sleep_level = None


def take_back(
    db: Database, deployment_id: str, *, measurement: Measurement | None = None
) -> WakeShortfall | None:
    """Before a wake: the whole budget back on every device the deployment sleeps on, when
    what the others hold (and, with `measurement`, what the devices report) leaves room;
    its host memory is let go. Nothing is written when it does not fit: the shortfall says
    why. None also when the deployment does not sleep (nothing to take back). The host
    memory stays held until `awake`: the weights are there until the engine has read them."""
    with db.write() as session:
        db.lock_ledger(session)
        rows = _rows(session, deployment_id)
        if not rows or rows[0].budget_bytes is None:
            return None
        state = fleet_state(session).with_measurement(measurement)
        shortfall = wake_shortfall(state, deployment_id)
        if shortfall is not None:
            return shortfall
        for row in rows:
            row.reserved_bytes = row.budget_bytes or row.reserved_bytes
            row.budget_bytes = None
        return None


@dataclass(frozen=True, slots=True, kw_only=True)
class MeasuredResidue:
    """What `measure_residue` wrote: the device's reservation now (`residue_bytes`), from
    the engine's `measured_bytes`, against its `budget_bytes` and what was free there."""

    residue_bytes: int
    measured_bytes: int
    budget_bytes: int

    @property
    def over_budget(self) -> bool:
        """The engine asleep measures more than its whole budget: the budget is kept."""
        return self.measured_bytes > self.budget_bytes

    @property
    def short_of_room(self) -> bool:
        """It measures more than its device had free beside the others: held up to that."""
        return not self.over_budget and self.residue_bytes < self.measured_bytes


def measure_residue(
    db: Database, deployment_id: str, *, measured_bytes: int
) -> MeasuredResidue | None:
    """A sleeping engine on one device, measured by the meter: its reservation there becomes
    `measured_bytes` — never more than its budget, and never more than its device has free
    beside the others (the capacity check of a placement, in the same locked transaction).
    None when it does not sleep, or sleeps on several devices (the meter's figure is one
    sum over them: each keeps the estimate), or measures nothing — a live engine holds its
    CUDA context, so a 0 is a driver that lists none of its processes (in a container, other
    pids): the estimate stays. Llama-3.1-8B estimated at 868,220,928 bytes asleep and
    measured at 650 MiB: 681,574,400 bytes held from then on."""
    if measured_bytes <= 0:
        return None
    with db.write() as session:
        db.lock_ledger(session)
        rows = _rows(session, deployment_id)
        budget = rows[0].budget_bytes if len(rows) == 1 else None
        if budget is None:
            return None
        row = rows[0]
        wanted = min(measured_bytes, budget)
        if wanted > row.reserved_bytes:
            state = fleet_state(session)
            key = (row.node_name, row.gpu_index, row.partition_index)
            slot = next((s for s in state.slots if s.key == key), None)
            if slot is not None and not slot.exclusive:  # an exclusive slot is its alone
                wanted = min(wanted, row.reserved_bytes + state.free_bytes()[slot.position])
        row.reserved_bytes = wanted
        return MeasuredResidue(
            residue_bytes=wanted, measured_bytes=measured_bytes, budget_bytes=budget
        )


def sleep_levels(db: Database) -> dict[str, SleepLevel]:
    """Every deployment whose engine sleeps (its reservation settled), with its level."""
    with db.read() as session:
        found = session.execute(
            select(DeploymentRow.id, DeploymentRow.sleep_level)
            .join(ReservationRow, ReservationRow.deployment_id == DeploymentRow.id)
            .where(ReservationRow.budget_bytes.is_not(None))
            .where(DeploymentRow.sleep_level.is_not(None))
            .distinct()
        )
        return {deployment: SleepLevel(level) for deployment, level in found if level}


def _rows(session: Session, deployment_id: str) -> list[ReservationRow]:
    return list(
        session.scalars(
            select(ReservationRow)
            .where(ReservationRow.deployment_id == deployment_id)
            .order_by(ReservationRow.id)
        )
    )
