"""The gateway's route table (service/gateway/proxy.py): the ready engines of each active
deployment — every copy's (store/copyset.py), so that the gateway's least-in-flight pick
spreads requests over them — and the deployments that serve each model name, held in this
process's memory so that a request reads no database. Copies are not routes of their own:
a deployment routes while any copy serves, its traffic is counted under its id, and a
copy's id routes to its deployment.

It is the store's active deployments, read again every `refresh_s` by a task of the app
(one index read of the few active rows, off the event loop), so a change made by any server
process sharing the database — a deployment that became DEPLOYED, one stopped — is seen
here within `refresh_s` plus the read's own time. Requests wait on the table, not on the
database: one for an id or a name the table does not know makes it read again first (a
deployment created a moment ago is found), and so does one whose engine refused the
connection (one stopped a moment ago); concurrent callers share one read.
"""

from __future__ import annotations

import asyncio
import logging
import math
import time
from collections.abc import Callable, Iterable, Mapping
from dataclasses import dataclass
from datetime import datetime
from types import MappingProxyType

from cohabit.runtime.interface import handle_from_json
from cohabit.store import copyset, deployments
from cohabit.store.database import Database
from cohabit.store.records import NO_FIT_ERROR, DeploymentRecord, DeploymentStatus

log = logging.getLogger(__name__)

# On their way to serving without anyone asking: admitted, being placed, engine starting.
STARTING = frozenset(
    {DeploymentStatus.REQUESTED, DeploymentStatus.DEPLOYING, DeploymentStatus.INITIALIZING}
)


@dataclass(frozen=True, slots=True, kw_only=True)
class Target:
    """An active deployment as the gateway routes to it."""

    deployment_id: str
    model_name: str
    status: DeploymentStatus  # as shown (copyset.status_of): DEPLOYED while a copy serves
    engines: tuple[str, ...]  # base URLs of its copies' ready engines; empty while none serves
    since: datetime  # deployed (else requested): the order among those of one name
    # UNLOADED because its last load found no room: when that NoFit was recorded, and it.
    no_room: tuple[datetime, str] | None = None

    @property
    def starting(self) -> bool:
        """On its way to serving by itself (else, with no engine, it has to be loaded)."""
        return self.status in STARTING or self.status is DeploymentStatus.DEPLOYED


@dataclass(frozen=True, slots=True, kw_only=True)
class Snapshot:
    by_id: Mapping[str, Target]  # deployment id, and each copy's id → the deployment
    by_name: Mapping[str, tuple[Target, ...]]  # served name, and id → oldest first
    taken_at: float  # time.monotonic() when its read began


EMPTY = Snapshot(by_id=MappingProxyType({}), by_name=MappingProxyType({}), taken_at=-math.inf)


def snapshot_of(records: Iterable[DeploymentRecord], *, taken_at: float) -> Snapshot:
    """The table of the active rows `records` (copies included, as `list_active` reads them)."""
    groups = copyset.by_deployment(records)
    targets = sorted(
        (_target(deployment_id, copies) for deployment_id, copies in groups.items()),
        key=lambda t: (t.since, t.deployment_id),
    )
    by_id: dict[str, Target] = {}
    by_name: dict[str, list[Target]] = {}
    for target in targets:
        by_id[target.deployment_id] = target
        by_name.setdefault(target.model_name, []).append(target)
        if target.deployment_id != target.model_name:
            by_name.setdefault(target.deployment_id, []).append(target)
    for target in targets:  # after the deployments: an id is never both
        for copy in groups[target.deployment_id]:
            by_id.setdefault(copy.id, target)
    return Snapshot(
        by_id=MappingProxyType(by_id),
        by_name=MappingProxyType({name: tuple(found) for name, found in by_name.items()}),
        taken_at=taken_at,
    )


def _target(deployment_id: str, copies: list[DeploymentRecord]) -> Target:
    """`copies`: the deployment's active rows, copy 0 (when active) first."""
    engines: list[str] = []
    for copy in copyset.serving(copies):
        handle = handle_from_json(copy.engine_handle)
        if handle is not None and handle.base_url:
            engines.append(handle.base_url.rstrip("/"))
    first = copies[0]
    status = copyset.status_of(copies)
    no_room = None
    if status is DeploymentStatus.UNLOADED and first.last_error_code == NO_FIT_ERROR:
        no_room = (first.last_error_at or first.requested_at, first.last_error_message or "")
    return Target(
        deployment_id=deployment_id,
        model_name=first.model_name,
        status=status,
        engines=tuple(engines),
        since=first.deployed_at or first.requested_at,
        no_room=no_room,
    )


class RouteTable:
    """The current `Snapshot`, and the reads that renew it (see the module docstring)."""

    def __init__(
        self,
        db: Database,
        *,
        refresh_s: float,
        settled: Callable[[float], None] = lambda _began: None,
    ) -> None:
        self.db = db
        self.refresh_s = refresh_s
        self.settled = settled  # told when each read that began then is the current one
        self.snapshot = EMPTY
        self._reading: asyncio.Future[None] | None = None

    async def fresh(self, newer_than: float) -> Snapshot:
        """A snapshot read no earlier than `newer_than` (time.monotonic()): the current one
        when it is, else the read under way when it began late enough, else a new read.
        Raises what the read raised (the database unreachable)."""
        while self.snapshot.taken_at < newer_than:
            reading = self._reading
            if reading is None:
                reading = self._reading = asyncio.ensure_future(self._read())
            await asyncio.shield(reading)
        return self.snapshot

    async def _read(self) -> None:
        started = time.monotonic()
        try:
            records = await asyncio.to_thread(deployments.list_active, self.db)
        finally:
            self._reading = None
        if started > self.snapshot.taken_at:
            self.snapshot = snapshot_of(records, taken_at=started)
            self.settled(started)

    async def keep_current(self) -> None:
        """Read the table every `refresh_s` until cancelled; a failed read is logged and the
        last table kept (requests for what it does not know read again themselves)."""
        while True:
            try:
                await self.fresh(time.monotonic())
            except Exception:
                log.exception("reading the gateway's route table failed")
            await asyncio.sleep(self.refresh_s)
