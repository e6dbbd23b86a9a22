"""/api/models: register a model (local path or Hugging Face repo id), list, get, delete, its
configs and the memory it needs."""

from __future__ import annotations

from typing import Annotated, Any
from uuid import UUID

from fastapi import APIRouter, Query, status

from cohabit.service.api.deps import AdminOnly, Authorized, Context
from cohabit.service.api.paging import CATALOG_LIMIT, Limit, Offset
from cohabit.service.api.schemas import (
    GUARDED,
    IN_USE,
    CreateModel,
    ErrorMessage,
    Model,
    ModelConfig,
    ModelFile,
    ModelRemoved,
    answers,
)
from cohabit.service.control import admission
from cohabit.service.errors import found
from cohabit.service.registry.catalog import Registration, register_model, remove_model
from cohabit.store import catalog
from cohabit.store.records import ModelConfigRecord, ModelFileRecord, ModelRecord

router = APIRouter(prefix="/models", tags=["models"], dependencies=[Authorized], responses=GUARDED)


# 409 of registering: another model has the name, once normalised (docs/models.md#names).
NAME_TAKEN: dict[int | str, dict[str, Any]] = {
    409: {"model": ErrorMessage, "description": "Another model has that name; names its id."}
}


@router.post(
    "/",
    response_model=Model,
    status_code=status.HTTP_201_CREATED,
    responses=answers(400) | NAME_TAKEN,
    dependencies=[AdminOnly],
)
def create_model(body: CreateModel, context: Context) -> Model:
    """201 with the model; 422 for a name that is not visible text (naming the character
    and where it is), 409 for one another model has (naming that model's id)."""
    path, path_loc = _path_of(body)
    registration = Registration(
        name=body.name,
        path=path,
        path_loc=path_loc,
        repo_id=body.repo_modelId,
        description=body.description,
    )
    model = register_model(context.db, registration)
    return model_view(model, catalog.list_configs(context.db, model_id=model.id))


@router.get("/", response_model=list[Model])
def list_models(
    context: Context,
    load_files: bool = False,
    limit: Limit = CATALOG_LIMIT,
    offset: Offset = 0,
) -> list[Model]:
    """Oldest registration first, a page at a time (api/paging.py)."""
    del load_files  # files are always included; they are a few rows
    models = catalog.list_models(context.db, limit=limit, offset=offset)
    defaults: dict[str, list[ModelConfigRecord]] = {}
    for config in catalog.list_configs(
        context.db, model_ids=[model.id for model in models], default_only=True
    ):
        defaults.setdefault(config.model_id, []).append(config)
    return [model_view(model, defaults.get(model.id, [])) for model in models]


@router.get("/{model_id}", response_model=Model, responses=answers(404))
def get_model(model_id: UUID, context: Context) -> Model:
    model: ModelRecord = found(lambda: catalog.get_model(context.db, str(model_id)))
    return model_view(model, catalog.list_configs(context.db, model_id=model.id, default_only=True))


@router.get("/{model_id}/configs", response_model=list[ModelConfig], responses=answers(404))
def get_model_configs(
    model_id: UUID,
    context: Context,
    default: Annotated[bool, Query()] = False,
    limit: Limit = CATALOG_LIMIT,
    offset: Offset = 0,
) -> list[ModelConfig]:
    found(lambda: catalog.get_model(context.db, str(model_id)))
    records = catalog.list_configs(
        context.db, model_id=str(model_id), default_only=default, limit=limit, offset=offset
    )
    return [config_view(record) for record in records]


@router.delete(
    "/{model_id}",
    response_model=ModelRemoved,
    responses=answers(404) | IN_USE,
    dependencies=[AdminOnly],
)
def delete_model(
    model_id: UUID, context: Context, delete_files: Annotated[bool, Query()] = False
) -> ModelRemoved:
    """Remove the model, its configs and its ended deployments; 409 while one is active.
    Files stay unless `delete_files=true`, and then only those under the data directory."""
    removal = remove_model(
        context.db, str(model_id), delete_files=delete_files, data_dir=context.settings.data_dir
    )
    return ModelRemoved(
        id=model_id,
        deleted=True,
        deployments_removed=removal.deployments_removed,
        files_deleted=list(removal.files_deleted),
        files_kept=list(removal.files_kept),
        files_kept_reason=removal.kept_reason,
    )


@router.get("/{model_id}/memory_usage", response_model=int, responses=answers(404))
def memory_usage(model_id: UUID, context: Context) -> int:
    """Bytes a deployment of its default config would reserve per device (the estimate)."""
    return memory_needed(context, model_id=str(model_id))


def memory_needed(context: Context, *, model_id: str, file_id: str | None = None) -> int:
    request = admission.DeployRequest(
        model_id=model_id,
        config_id=None,
        file_id=file_id,
        engine_name=None,
        vram_allocation=None,
        force_cpu=False,
        body={},
    )
    return admission.size(context.db, request).requested_bytes


def _path_of(body: CreateModel) -> tuple[str | None, tuple[str | int, ...]]:
    """The local path to register, and where in the body it came from (for a 422's loc)."""
    if body.path:
        return body.path, ("body", "path")
    for index, file in enumerate(body.m_files):
        if file.storage_type in (None, "file") and file.storage_location:
            return file.storage_location, ("body", "m_files", index, "storage_location")
    return _local_source(body.source_repository), ("body", "source_repository")


def _local_source(source: str | None) -> str | None:
    """`source_repository` names a local path when it starts like one."""
    if source and source.startswith(("/", "./", "~", "file://")):
        return source.removeprefix("file://")
    return None


def model_view(model: ModelRecord, configs: list[ModelConfigRecord]) -> Model:
    default = next((c for c in configs if c.default), None)
    return Model(
        id=UUID(model.id),
        repo_modelId=model.repo_id,
        name=model.name,
        source_repository=model.source,
        hub=model.hub,
        description=model.description,
        format=model.format,
        model_path=model.model_path,
        m_files=[file_view(f, hub=model.hub) for f in model.files],
        default_config=None if default is None else dict(default.config),
        created_timestamp=model.created_at,
        modified_timestamp=model.modified_at,
    )


def file_view(record: ModelFileRecord, *, hub: str | None) -> ModelFile:
    return ModelFile(
        id=UUID(record.id),
        name=record.name,
        size=record.size_bytes,
        storage_type=record.storage_type,
        storage_location=record.storage_location,
        hub=hub,
        model_id=UUID(record.model_id),
        created_timestamp=record.created_at,
    )


def config_view(record: ModelConfigRecord) -> ModelConfig:
    return ModelConfig(
        id=UUID(record.id),
        m_id=UUID(record.model_id),
        m_file_id=None if record.file_id is None else UUID(record.file_id),
        name=record.name,
        default=record.default,
        description=record.description,
        config=dict(record.config),
        system_config=dict(record.system_config),
        created_at=record.created_at,
        modified_at=record.modified_at,
    )
