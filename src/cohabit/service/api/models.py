"""/api/models: register a model (local path or Hugging Face repo id), list, get, its configs."""

from __future__ import annotations

from typing import Annotated
from uuid import UUID

from fastapi import APIRouter, Query, status

from cohabit.service.api.deps import Authorized, Context
from cohabit.service.api.paging import CATALOG_LIMIT, Limit, Offset
from cohabit.service.api.schemas import CreateModel, Model, ModelConfig, ModelFile
from cohabit.service.catalog import Registration, register_model
from cohabit.service.errors import found
from cohabit.store import catalog
from cohabit.store.records import ModelConfigRecord, ModelRecord

router = APIRouter(prefix="/models", tags=["models"], dependencies=[Authorized])


@router.post("/", response_model=Model, status_code=status.HTTP_201_CREATED)
def create_model(body: CreateModel, context: Context) -> Model:
    local_files = [f for f in body.m_files if f.storage_type in (None, "file")]
    local = next((f.storage_location for f in local_files if f.storage_location), None)
    registration = Registration(
        name=body.name,
        path=body.path or local or _local_source(body.source_repository),
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


@router.get("/{model_id}", response_model=Model)
def get_model(model_id: UUID, context: Context) -> Model:
    model: ModelRecord = found(lambda: catalog.get_model(context.db, str(model_id)))
    return model_view(model, catalog.list_configs(context.db, model_id=model.id, default_only=True))


@router.get("/{model_id}/configs", response_model=list[ModelConfig])
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
        m_files=[
            ModelFile(
                id=UUID(f.id),
                name=f.name,
                size=f.size_bytes,
                storage_type=f.storage_type,
                storage_location=f.storage_location,
                hub=model.hub,
                model_id=UUID(model.id),
                created_timestamp=f.created_at,
            )
            for f in model.files
        ],
        default_config=None if default is None else dict(default.config),
        created_timestamp=model.created_at,
        modified_timestamp=model.modified_at,
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
