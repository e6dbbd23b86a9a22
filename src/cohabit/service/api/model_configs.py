"""/api/model_configs: create a config for a model, list them (by model), get, replace and
delete one."""

from __future__ import annotations

from uuid import UUID

from fastapi import APIRouter, status

from cohabit.service.api.deps import AdminOnly, Authorized, Context
from cohabit.service.api.models import config_view
from cohabit.service.api.paging import CATALOG_LIMIT, Limit, Offset
from cohabit.service.api.schemas import (
    GUARDED,
    IN_USE,
    TAKEN,
    CreateModelConfig,
    ModelConfig,
    answers,
)
from cohabit.service.control.admission import check_config
from cohabit.service.errors import found
from cohabit.store import catalog
from cohabit.store.records import NewConfig

router = APIRouter(
    prefix="/model_configs", tags=["model_configs"], dependencies=[Authorized], responses=GUARDED
)


def _new(body: CreateModelConfig) -> NewConfig:
    return NewConfig(
        model_id=str(body.m_id),
        file_id=None if body.m_file_id is None else str(body.m_file_id),
        name=body.name,
        default=body.default,
        description=body.description,
        config=body.config,
        system_config=body.system_config,
    )


@router.post(
    "/",
    response_model=ModelConfig,
    status_code=status.HTTP_201_CREATED,
    responses=answers(400, 404, 422),
    dependencies=[AdminOnly],
)
def create_model_config(body: CreateModelConfig, context: Context) -> ModelConfig:
    """Checked (`admission.check_config`) before anything is written: 422 stores nothing."""
    check_config(context.db, str(body.m_id), body.config)
    return config_view(found(lambda: catalog.add_config(context.db, _new(body))))


@router.get("/", response_model=list[ModelConfig])
def list_model_configs(
    context: Context,
    model_id: UUID | None = None,
    limit: Limit = CATALOG_LIMIT,
    offset: Offset = 0,
) -> list[ModelConfig]:
    """Oldest first, a page at a time (api/paging.py)."""
    records = catalog.list_configs(
        context.db,
        model_id=None if model_id is None else str(model_id),
        limit=limit,
        offset=offset,
    )
    return [config_view(record) for record in records]


@router.get("/{config_id}", response_model=ModelConfig, responses=answers(404))
def get_model_config(config_id: UUID, context: Context) -> ModelConfig:
    return config_view(found(lambda: catalog.get_config(context.db, str(config_id))))


@router.put(
    "/{config_id}",
    response_model=ModelConfig,
    responses=answers(400, 404, 422) | TAKEN,
    dependencies=[AdminOnly],
)
def update_model_config(config_id: UUID, body: CreateModelConfig, context: Context) -> ModelConfig:
    """Replace its fields; `m_id` must be its model's. Running deployments keep their size.
    Checked as a new one is: a refused replacement leaves the stored config as it was."""
    check_config(context.db, str(body.m_id), body.config)
    return config_view(found(lambda: catalog.update_config(context.db, str(config_id), _new(body))))


@router.delete(
    "/{config_id}",
    response_model=ModelConfig,
    responses=answers(404) | IN_USE,
    dependencies=[AdminOnly],
)
def delete_model_config(config_id: UUID, context: Context) -> ModelConfig:
    """Remove it (answered as it was); 409 while an active deployment was made from it."""
    return config_view(found(lambda: catalog.delete_config(context.db, str(config_id))))
