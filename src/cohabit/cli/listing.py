"""Deployments as `cohabit ps` lists them: the server's JSON read field by field, with the SDK's
defaults, into plain values. `ps` reads its one list without the SDK's pydantic models, whose
import alone takes longer than the whole command may (docs/cli.md). The fields keep the names
`sdk.Deployment` gives them, so a helper that reads a few (`remote.where`, `ps.copies`) takes
either."""

from __future__ import annotations

from dataclasses import dataclass
from datetime import datetime
from typing import Any

from cohabit.sdk.statuses import ACTIVE_STATUSES


@dataclass(frozen=True, slots=True, kw_only=True)
class ListedCopy:
    """A copy with a started engine (`sdk.ModelInstance`), as `ps --verbose` shows it."""

    status: str
    host_name: str | None
    container_id: str | None
    extra_details: dict[str, Any]


@dataclass(frozen=True, slots=True, kw_only=True)
class Listed:
    record: dict[str, Any]  # the whole record as the server sent it (`ps --json`)
    id: str
    m_id: str
    m_name: str | None
    status: str
    copies: int | None
    ready_copies: int | None
    node_name: str | None
    gpu_index: int | None
    gpu_indices: list[int]
    partition: str | None
    hardware_class: str | None
    sharing_class: str | None
    allocated_bytes: int | None
    allocated_capacity_gb: int | None
    memory_used_bytes: int | None
    health_details: dict[str, Any] | None
    last_used_at: datetime | None
    last_error_code: str | None
    queue_position: int | None  # its place in the queue while QUEUED (from `no_fit`)
    loading: dict[str, Any] | None  # while it loads: its phase now and for how long (`loading`)
    endpoint: str | None
    access_path: str | None
    instances: list[ListedCopy]

    @property
    def is_active(self) -> bool:
        """Not ended: placed, on its way, or UNLOADED (routable, loaded on demand)."""
        return self.status.upper() in ACTIVE_STATUSES


def listed(record: dict[str, Any]) -> Listed:
    """One deployment of `GET /serving/deployments`; KeyError, TypeError or ValueError for a
    record that is not one."""
    get = record.get
    return Listed(
        record=record,
        id=str(record["id"]),
        m_id=str(record["m_id"]),
        m_name=get("m_name"),
        status=str(get("status", "UNINITIALIZED")),
        copies=get("copies"),
        ready_copies=get("ready_copies"),
        node_name=get("node_name"),
        gpu_index=get("gpu_index"),
        gpu_indices=list(get("gpu_indices") or ()),
        partition=get("partition"),
        hardware_class=get("hardware_class"),
        sharing_class=get("sharing_class"),
        allocated_bytes=get("allocated_bytes"),
        allocated_capacity_gb=get("allocated_capacity_gb"),
        memory_used_bytes=get("memory_used_bytes"),
        health_details=get("health_details"),
        last_used_at=_time(get("last_used_at")),
        last_error_code=get("last_error_code"),
        queue_position=(get("no_fit") or {}).get("queue_position"),
        loading=get("loading"),
        endpoint=get("endpoint"),
        access_path=get("access_path"),
        instances=[_copy(instance) for instance in get("instances") or ()],
    )


def _copy(record: dict[str, Any]) -> ListedCopy:
    return ListedCopy(
        status=str(record.get("status", "UNINITIALIZED")),
        host_name=record.get("host_name"),
        container_id=record.get("container_id"),
        extra_details=dict(record.get("extra_details") or {}),
    )


def _time(value: str | None) -> datetime | None:
    return None if value is None else datetime.fromisoformat(value)
