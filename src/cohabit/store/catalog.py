"""Model, model-file and model-config rows: the catalog the deploy path reads from. The
service's catalog module decides what to register; this stores and reads it, and keeps
model names unique (`name_key`)."""

from __future__ import annotations

import hashlib
import unicodedata
import uuid
from collections.abc import Collection, Mapping, Sequence
from dataclasses import dataclass
from datetime import datetime
from typing import Any

from sqlalchemy import delete, func, select, update
from sqlalchemy.exc import IntegrityError
from sqlalchemy.orm import Session

from cohabit.store.database import Database, affected, aware, utcnow
from cohabit.store.errors import Conflict, NameTaken, RecordNotFound
from cohabit.store.records import (
    ACTIVE,
    NAME_CHARS,
    ModelConfigRecord,
    ModelFileRecord,
    ModelRecord,
    NewConfig,
)
from cohabit.store.tables import (
    DeploymentRow,
    ModelConfigRow,
    ModelFileRow,
    ModelRow,
    ReservationRow,
)


def suffixed_name(stem: str, suffix: str) -> str:
    """A name made from another (`<model> default`): `stem` cut so that the whole fits the
    name column, whatever length the name it came from had."""
    return f"{stem[: max(0, NAME_CHARS - len(suffix))]}{suffix}"[:NAME_CHARS]


def name_key(name: str) -> str:
    """What makes two model names one: NFKC, case folded, NFKC again (Unicode's
    NFKC_Casefold but for the ignorable characters, which names may not hold), so `Tiny`,
    `TINY` and the full-width `ｔｉｎｙ` are one name; stored as its SHA-256 (hex), since the
    folded text can be many times the name's length (NFKC spells U+FDFA in 18 characters)
    and a unique index's entries must stay small. Migration 0012 holds a copy."""
    folded = unicodedata.normalize("NFKC", unicodedata.normalize("NFKC", name).casefold())
    return hashlib.sha256(folded.encode("utf-8", "surrogatepass")).hexdigest()


@dataclass(frozen=True, slots=True, kw_only=True)
class NewFile:
    name: str
    size_bytes: int | None
    storage_type: str
    storage_location: str | None


def add_model(
    db: Database,
    *,
    name: str,
    repo_id: str | None,
    hub: str | None,
    source: str,
    model_path: str | None,
    format: str,
    description: str | None,
    files: Sequence[NewFile],
    default_config: Mapping[str, Any],
) -> ModelRecord:
    """Insert a model, its files and its default config in one transaction. Raises NameTaken
    when another model's name has the same `name_key`."""
    now = utcnow()
    model_id = str(uuid.uuid4())
    key = name_key(name)
    try:
        with db.write() as session:
            _refuse_taken(session, name, key)
            session.add(
                ModelRow(
                    id=model_id,
                    name=name,
                    name_key=key,
                    repo_id=repo_id,
                    hub=hub,
                    source=source,
                    model_path=model_path,
                    format=format,
                    description=description,
                    created_at=now,
                    modified_at=now,
                )
            )
            session.flush()
            for item in files:
                session.add(
                    ModelFileRow(
                        id=str(uuid.uuid4()),
                        model_id=model_id,
                        name=item.name,
                        size_bytes=item.size_bytes,
                        storage_type=item.storage_type,
                        storage_location=item.storage_location,
                        created_at=now,
                    )
                )
            session.add(
                ModelConfigRow(
                    id=str(uuid.uuid4()),
                    model_id=model_id,
                    file_id=None,
                    name=suffixed_name(name, " default"),
                    is_default=True,
                    description="made from the model's metadata at registration",
                    config=dict(default_config),
                    system_config={},
                    created_at=now,
                    modified_at=None,
                )
            )
    except IntegrityError:
        # Registered at the same moment by another transaction (on PostgreSQL; SQLite's write
        # lock lets one writer at a time read and insert): the unique index refused this one.
        with db.read() as session:
            _refuse_taken(session, name, key)
        raise
    return get_model(db, model_id)


def _refuse_taken(session: Session, name: str, key: str) -> None:
    holder = session.execute(
        select(ModelRow.id, ModelRow.name).where(ModelRow.name_key == key)
    ).first()
    if holder is not None:
        raise NameTaken(name, holder_id=holder.id, holder_name=holder.name)


def get_model(db: Database, model_id: str) -> ModelRecord:
    with db.read() as session:
        row = session.get(ModelRow, model_id)
        if row is None:
            raise RecordNotFound("model", model_id)
        files = session.scalars(
            select(ModelFileRow)
            .where(ModelFileRow.model_id == model_id)
            .order_by(ModelFileRow.name)
        ).all()
        return _model(row, files)


def list_models(db: Database, *, limit: int | None = None, offset: int = 0) -> list[ModelRecord]:
    """Oldest registration first; `limit`/`offset` take one page (None: all)."""
    query = select(ModelRow).order_by(ModelRow.created_at, ModelRow.id).offset(offset)
    files_query = select(ModelFileRow).order_by(ModelFileRow.name)
    with db.read() as session:
        rows = session.scalars(query.limit(limit)).all()
        if limit is not None:  # a page: only its models' files
            files_query = files_query.where(ModelFileRow.model_id.in_([row.id for row in rows]))
        files = session.scalars(files_query).all()
    by_model: dict[str, list[ModelFileRow]] = {}
    for item in files:
        by_model.setdefault(item.model_id, []).append(item)
    return [_model(row, by_model.get(row.id, [])) for row in rows]


def add_config(db: Database, new: NewConfig) -> ModelConfigRecord:
    """Insert a config; a new default takes the flag from the model's other configs."""
    get_model(db, new.model_id)
    now = utcnow()
    config_id = str(uuid.uuid4())
    with db.write() as session:
        if new.default:
            _take_default(session, new.model_id, now)
        row = ModelConfigRow(
            id=config_id,
            model_id=new.model_id,
            file_id=new.file_id,
            name=new.name,
            is_default=new.default,
            description=new.description,
            config=dict(new.config),
            system_config=dict(new.system_config),
            created_at=now,
            modified_at=None,
        )
        session.add(row)
        session.flush()
        return _config(row)


def get_config(db: Database, config_id: str) -> ModelConfigRecord:
    with db.read() as session:
        return _config(_config_row(session, config_id))


def list_configs(
    db: Database,
    *,
    model_id: str | None = None,
    model_ids: Collection[str] | None = None,
    default_only: bool = False,
    limit: int | None = None,
    offset: int = 0,
) -> list[ModelConfigRecord]:
    """Oldest first, of one model (`model_id`), of some (`model_ids`) or of all; `limit`/
    `offset` take one page (None: all)."""
    query = select(ModelConfigRow).order_by(ModelConfigRow.created_at, ModelConfigRow.id)
    if model_id is not None:
        query = query.where(ModelConfigRow.model_id == model_id)
    if model_ids is not None:
        query = query.where(ModelConfigRow.model_id.in_(list(model_ids)))
    if default_only:
        query = query.where(ModelConfigRow.is_default.is_(True))
    query = query.offset(offset).limit(limit)
    with db.read() as session:
        return [_config(row) for row in session.scalars(query)]


def update_config(db: Database, config_id: str, new: NewConfig) -> ModelConfigRecord:
    """Replace a config's fields (it stays with its model); a new default takes the flag from
    the model's other configs. Deployments keep the sizes they were admitted with."""
    now = utcnow()
    with db.write() as session:
        row = _config_row(session, config_id)
        if row.model_id != new.model_id:
            raise Conflict(
                f"model config {config_id} belongs to model {row.model_id}, not {new.model_id}"
            )
        if new.default:
            _take_default(session, row.model_id, now)
        row.file_id = new.file_id
        row.name = new.name
        row.is_default = new.default
        row.description = new.description
        row.config = dict(new.config)
        row.system_config = dict(new.system_config)
        row.modified_at = now
        session.flush()
        return _config(row)


def delete_config(db: Database, config_id: str) -> ModelConfigRecord:
    """Remove a config. Raises Conflict while an active deployment was made from it."""
    with db.write() as session:
        row = _config_row(session, config_id)
        active = _active_deployments(session, DeploymentRow.config_id == config_id)
        if active:
            raise Conflict(
                f"model config {config_id} is used by {active} active deployment(s): "
                "stop them first"
            )
        record = _config(row)
        session.delete(row)
        return record


def delete_model(db: Database, model_id: str) -> tuple[ModelRecord, int]:
    """Remove a model with its files' rows, its configs and its ended deployments (returned:
    the model as it was, and how many deployments went). Raises Conflict while it has an
    active deployment. Files on disk are the caller's to remove."""
    model = get_model(db, model_id)
    try:
        with db.write() as session:
            active = _active_deployments(session, DeploymentRow.model_id == model_id)
            if active:
                raise Conflict(
                    f"model {model_id} has {active} active deployment(s): stop them first"
                )
            ended = select(DeploymentRow.id).where(DeploymentRow.model_id == model_id)
            session.execute(delete(ReservationRow).where(ReservationRow.deployment_id.in_(ended)))
            # The copies first (they point at their deployment), then the deployments.
            mine = DeploymentRow.model_id == model_id
            session.execute(delete(DeploymentRow).where(mine, DeploymentRow.copy_of.is_not(None)))
            removed = affected(session.execute(delete(DeploymentRow).where(mine)))
            session.execute(delete(ModelConfigRow).where(ModelConfigRow.model_id == model_id))
            session.execute(delete(ModelFileRow).where(ModelFileRow.model_id == model_id))
            session.execute(delete(ModelRow).where(ModelRow.id == model_id))
    except IntegrityError:
        # A deployment admitted between the check and the delete still points at it.
        raise Conflict(f"model {model_id} was deployed meanwhile: stop it first") from None
    return model, removed


def get_file(db: Database, file_id: str) -> ModelFileRecord:
    with db.read() as session:
        row = session.get(ModelFileRow, file_id)
        if row is None:
            raise RecordNotFound("model file", file_id)
        return _file(row)


def list_files(db: Database) -> list[ModelFileRecord]:
    with db.read() as session:
        rows = session.scalars(
            select(ModelFileRow).order_by(ModelFileRow.created_at, ModelFileRow.id)
        )
        return [_file(row) for row in rows]


def _config_row(session: Session, config_id: str) -> ModelConfigRow:
    row = session.get(ModelConfigRow, config_id)
    if row is None:
        raise RecordNotFound("model config", config_id)
    return row


def _take_default(session: Session, model_id: str, now: datetime) -> None:
    """Clear the default flag of the model's configs (one is about to take it)."""
    session.execute(
        update(ModelConfigRow)
        .where(ModelConfigRow.model_id == model_id, ModelConfigRow.is_default.is_(True))
        .values(is_default=False, modified_at=now)
    )


def _active_deployments(session: Session, where: Any) -> int:
    """How many active deployments match (a deployment's copies count once, as it)."""
    query = (
        select(func.count())
        .select_from(DeploymentRow)
        .where(where)
        .where(DeploymentRow.copy_of.is_(None))
    )
    return int(
        session.scalar(query.where(DeploymentRow.status.in_([s.value for s in ACTIVE]))) or 0
    )


def _file(row: ModelFileRow) -> ModelFileRecord:
    return ModelFileRecord(
        id=row.id,
        model_id=row.model_id,
        name=row.name,
        size_bytes=row.size_bytes,
        storage_type=row.storage_type,
        storage_location=row.storage_location,
        created_at=aware(row.created_at) or utcnow(),
    )


def _model(row: ModelRow, files: Sequence[ModelFileRow]) -> ModelRecord:
    return ModelRecord(
        id=row.id,
        name=row.name,
        repo_id=row.repo_id,
        hub=row.hub,
        source=row.source,
        model_path=row.model_path,
        format=row.format,
        description=row.description,
        created_at=aware(row.created_at) or utcnow(),
        modified_at=aware(row.modified_at) or utcnow(),
        files=tuple(_file(item) for item in files),
    )


def _config(row: ModelConfigRow) -> ModelConfigRecord:
    return ModelConfigRecord(
        id=row.id,
        model_id=row.model_id,
        file_id=row.file_id,
        name=row.name,
        default=row.is_default,
        description=row.description,
        config=dict(row.config),
        system_config=dict(row.system_config),
        created_at=aware(row.created_at) or utcnow(),
        modified_at=aware(row.modified_at),
    )


def add_files(db: Database, model_id: str, files: Sequence[NewFile]) -> list[ModelFileRecord]:
    """Files a model did not list yet (a download of another variant); names already listed
    are returned as they are."""
    now = utcnow()
    with db.write() as session:
        have = {
            row.name: row
            for row in session.scalars(
                select(ModelFileRow).where(ModelFileRow.model_id == model_id)
            )
        }
        out: list[ModelFileRow] = []
        for item in files:
            row = have.get(item.name)
            if row is None:
                row = ModelFileRow(
                    id=str(uuid.uuid4()),
                    model_id=model_id,
                    name=item.name,
                    size_bytes=item.size_bytes,
                    storage_type=item.storage_type,
                    storage_location=item.storage_location,
                    created_at=now,
                )
                session.add(row)
            out.append(row)
        session.flush()
        return [_file(row) for row in out]


def set_file_location(db: Database, file_id: str, location: str | None) -> None:
    with db.write() as session:
        session.execute(
            update(ModelFileRow)
            .where(ModelFileRow.id == file_id)
            .values(storage_location=location, storage_type="file")
        )


def set_model_path(
    db: Database, model_id: str, *, model_path: str, format: str, config: Mapping[str, Any]
) -> None:
    """Point a model at what its engine loads once its files are here, and refresh the
    default config made from its metadata."""
    now = utcnow()
    with db.write() as session:
        session.execute(
            update(ModelRow)
            .where(ModelRow.id == model_id)
            .values(model_path=model_path, format=format, modified_at=now)
        )
        session.execute(
            update(ModelConfigRow)
            .where(ModelConfigRow.model_id == model_id, ModelConfigRow.is_default.is_(True))
            .values(config=dict(config), modified_at=now)
        )


def find_by_repo(db: Database, repo_id: str) -> ModelRecord | None:
    with db.read() as session:
        row = session.scalars(
            select(ModelRow).where(ModelRow.repo_id == repo_id).order_by(ModelRow.created_at)
        ).first()
        model_id = None if row is None else row.id
    return None if model_id is None else get_model(db, model_id)
