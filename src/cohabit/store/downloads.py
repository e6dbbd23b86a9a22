"""Download rows: what was asked from the Hub, how far each file got, how it ended. The
service's download worker drives them; the status routes read them."""

from __future__ import annotations

import uuid
from collections.abc import Sequence
from dataclasses import dataclass
from datetime import datetime, timedelta

from sqlalchemy import or_, select, update

from cohabit.store.database import Database, aware, utcnow
from cohabit.store.tables import DownloadRow

QUEUED, RUNNING, DONE, FAILED = "queued", "running", "done", "failed"
UNFINISHED = (QUEUED, RUNNING)


@dataclass(frozen=True, slots=True, kw_only=True)
class NewDownload:
    """One file asked from the Hub."""

    model_id: str
    file_id: str
    repo_id: str
    revision: str
    filename: str
    size_bytes: int | None
    sha256: str | None
    blob_id: str | None
    to_cache: bool


@dataclass(frozen=True, slots=True, kw_only=True)
class DownloadRecord(NewDownload):
    """A download as stored: what was asked, and how far it got."""

    id: str
    status: str
    done_bytes: int
    error: str | None
    path: str | None
    requested_at: datetime
    started_at: datetime | None
    finished_at: datetime | None


def queue(db: Database, new: Sequence[NewDownload]) -> list[DownloadRecord]:
    """Queue files; a file already queued or running keeps its row (asking twice is one
    download)."""
    now = utcnow()
    with db.write() as session:
        rows: list[DownloadRow] = []
        for item in new:
            active = session.scalars(
                select(DownloadRow).where(
                    DownloadRow.file_id == item.file_id, DownloadRow.status.in_(UNFINISHED)
                )
            ).first()
            if active is None:
                active = DownloadRow(
                    id=str(uuid.uuid4()),
                    model_id=item.model_id,
                    file_id=item.file_id,
                    repo_id=item.repo_id,
                    revision=item.revision,
                    filename=item.filename,
                    size_bytes=item.size_bytes,
                    sha256=item.sha256,
                    blob_id=item.blob_id,
                    to_cache=item.to_cache,
                    status=QUEUED,
                    done_bytes=0,
                    requested_at=now,
                )
                session.add(active)
            rows.append(active)
        session.flush()
        return [_record(row) for row in rows]


def requeue_stale(db: Database, *, lease_s: float) -> int:
    """Rows left running by a server that stopped (no progress for `lease_s`) go back to the
    queue; a row another live server is fetching keeps moving, so it stays."""
    cutoff = utcnow() - timedelta(seconds=lease_s)
    with db.write() as session:
        result = session.execute(
            update(DownloadRow)
            .where(
                DownloadRow.status == RUNNING,
                or_(DownloadRow.heartbeat_at.is_(None), DownloadRow.heartbeat_at < cutoff),
            )
            .values(status=QUEUED)
        )
        return int(result.rowcount or 0)  # type: ignore[attr-defined]


def next_queued(db: Database) -> DownloadRecord | None:
    """Take the oldest queued row (it becomes running)."""
    with db.write() as session:
        row = session.scalars(
            select(DownloadRow)
            .where(DownloadRow.status == QUEUED)
            .order_by(DownloadRow.requested_at, DownloadRow.id)
            .limit(1)
            # Servers sharing a PostgreSQL database never take the same row (SQLite's one
            # write lock already serializes them).
            .with_for_update(skip_locked=True)
        ).first()
        if row is None:
            return None
        row.status = RUNNING
        row.started_at = row.started_at or utcnow()
        row.heartbeat_at = utcnow()
        row.error = None
        session.flush()
        return _record(row)


def requeue(db: Database, download_id: str) -> None:
    """A download its server let go of (stopping): queued again, its part kept."""
    with db.write() as session:
        session.execute(
            update(DownloadRow)
            .where(DownloadRow.id == download_id, DownloadRow.status == RUNNING)
            .values(status=QUEUED)
        )


def progress(db: Database, download_id: str, done_bytes: int) -> None:
    with db.write() as session:
        session.execute(
            update(DownloadRow)
            .where(DownloadRow.id == download_id)
            .values(done_bytes=done_bytes, heartbeat_at=utcnow())
        )


def finish(db: Database, download_id: str, *, path: str | None, error: str | None) -> None:
    with db.write() as session:
        row = session.get(DownloadRow, download_id)
        if row is None:
            return  # its model was deleted meanwhile
        row.status = FAILED if error else DONE
        row.error = error
        row.path = path
        row.finished_at = utcnow()
        if path is not None and row.size_bytes is not None:
            row.done_bytes = row.size_bytes


def for_models(db: Database, model_ids: Sequence[str]) -> list[DownloadRecord]:
    """The latest row of each file of these models."""
    with db.read() as session:
        rows = session.scalars(
            select(DownloadRow)
            .where(DownloadRow.model_id.in_(model_ids))
            .order_by(DownloadRow.requested_at, DownloadRow.id)
        ).all()
    latest: dict[str, DownloadRow] = {}
    for row in rows:
        latest[row.file_id] = row
    return [_record(row) for row in latest.values()]


def get(db: Database, download_id: str) -> DownloadRecord | None:
    with db.read() as session:
        row = session.get(DownloadRow, download_id)
        return None if row is None else _record(row)


def _record(row: DownloadRow) -> DownloadRecord:
    return DownloadRecord(
        id=row.id,
        model_id=row.model_id,
        file_id=row.file_id,
        repo_id=row.repo_id,
        revision=row.revision,
        filename=row.filename,
        size_bytes=row.size_bytes,
        sha256=row.sha256,
        blob_id=row.blob_id,
        to_cache=row.to_cache,
        status=row.status,
        done_bytes=row.done_bytes,
        error=row.error,
        path=row.path,
        requested_at=aware(row.requested_at) or utcnow(),
        started_at=aware(row.started_at),
        finished_at=aware(row.finished_at),
    )
