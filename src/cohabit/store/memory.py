"""The meter's last memory sample, kept with each deployment: bytes its engine used, when,
and since when it is over its budget. The service's meter writes them every pass; the API
and `cohabit ps` read them from the deployment's record.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass
from datetime import datetime

from sqlalchemy import update

from cohabit.store.database import Database
from cohabit.store.records import ACTIVE
from cohabit.store.tables import DeploymentRow


@dataclass(frozen=True, slots=True, kw_only=True)
class MemorySample:
    used_bytes: int
    at: datetime
    over_budget_since: datetime | None = None


def save_samples(db: Database, samples: Mapping[str, MemorySample]) -> None:
    """Store each deployment's sample, in one transaction; ended deployments keep theirs."""
    if not samples:
        return
    active = [status.value for status in ACTIVE]
    with db.write() as session:
        for deployment_id, sample in samples.items():
            session.execute(
                update(DeploymentRow)
                .where(DeploymentRow.id == deployment_id)
                .where(DeploymentRow.status.in_(active))
                .values(
                    memory_used_bytes=sample.used_bytes,
                    memory_sampled_at=sample.at,
                    over_budget_since=sample.over_budget_since,
                )
            )
