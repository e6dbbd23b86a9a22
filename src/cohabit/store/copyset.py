"""A deployment as its copies make it: copy 0 is the deployment's own row, the others are
rows with `copy_of` set to its id (store/records.py). The route table (routing.py), the
API's view (api/serving.py), /metrics and the web page see a deployment through these, so
that it serves, and shows DEPLOYED, while any copy serves.
"""

from __future__ import annotations

from collections.abc import Iterable, Sequence

from cohabit.store.records import ACTIVE, DeploymentRecord, DeploymentStatus

# The active statuses, furthest along first: the one a deployment shows when none of its
# copies serves (one copy starting while another waits in the queue is starting).
_FURTHEST_FIRST = (
    DeploymentStatus.DEPLOYED,
    DeploymentStatus.INITIALIZING,
    DeploymentStatus.DEPLOYING,
    DeploymentStatus.REQUESTED,
    DeploymentStatus.QUEUED,
    DeploymentStatus.UNLOADED,
)
_RANK = {status: rank for rank, status in enumerate(_FURTHEST_FIRST)}


def by_deployment(records: Iterable[DeploymentRecord]) -> dict[str, list[DeploymentRecord]]:
    """The rows under their deployment's id, copy 0 first, then by copy index; deployments
    in the order their first row came."""
    groups: dict[str, list[DeploymentRecord]] = {}
    for record in records:
        groups.setdefault(record.deployment_id, []).append(record)
    for copies in groups.values():
        copies.sort(key=lambda c: c.copy_index)
    return groups


def status_of(copies: Sequence[DeploymentRecord]) -> DeploymentStatus:
    """The deployment's status as shown: DEPLOYED while any copy serves, else the furthest
    along of its active copies, else (it has ended) copy 0's — the first of `copies`."""
    active = [c.status for c in copies if c.status in ACTIVE]
    if active:
        return min(active, key=_RANK.__getitem__)
    return copies[0].status


def serving(copies: Iterable[DeploymentRecord]) -> list[DeploymentRecord]:
    """The copies that serve now: DEPLOYED with an engine, awake (copy 0 stays DEPLOYED,
    with no engine, while its failed engine starts again beside a serving copy; a sleeping
    one keeps its engine, which a request must wake first)."""
    return [
        c
        for c in copies
        if c.status is DeploymentStatus.DEPLOYED
        and c.engine_handle is not None
        and c.sleep_level is None
    ]


def active(copies: Iterable[DeploymentRecord]) -> list[DeploymentRecord]:
    """The copies that have not ended: the deployment's copies now."""
    return [c for c in copies if c.status in ACTIVE]
