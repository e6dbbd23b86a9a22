"""/api/model_files: the files registered models are made of — list, get, and the memory a
deployment of a file would need."""

from __future__ import annotations

from uuid import UUID

from fastapi import APIRouter

from cohabit.service.api.deps import Authorized, Context
from cohabit.service.api.models import file_view, memory_needed
from cohabit.service.api.schemas import GUARDED, ModelFile, answers
from cohabit.service.errors import found
from cohabit.store import catalog

router = APIRouter(
    prefix="/model_files", tags=["model_files"], dependencies=[Authorized], responses=GUARDED
)


@router.get("/", response_model=list[ModelFile])
def list_model_files(context: Context) -> list[ModelFile]:
    hubs = {model.id: model.hub for model in catalog.list_models(context.db)}
    return [file_view(f, hub=hubs.get(f.model_id)) for f in catalog.list_files(context.db)]


@router.get("/{file_id}", response_model=ModelFile, responses=answers(404))
def get_model_file(file_id: UUID, context: Context) -> ModelFile:
    record = found(lambda: catalog.get_file(context.db, str(file_id)))
    model = found(lambda: catalog.get_model(context.db, record.model_id))
    return file_view(record, hub=model.hub)


@router.get("/{file_id}/memory_usage", response_model=int, responses=answers(404))
def file_memory_usage(file_id: UUID, context: Context) -> int:
    """Bytes a deployment of this file with its model's default config would reserve."""
    record = found(lambda: catalog.get_file(context.db, str(file_id)))
    return memory_needed(context, model_id=record.model_id, file_id=record.id)
