"""Models from the Hugging Face Hub: search, a repo's files, its GGUF variants against this
fleet, download (queued for the server's worker) and download status. Reading is open to
every token; downloading is an admin action. Only an admin's requests (and the worker) reach
the Hub with the server's own credentials: a `user` token's search and listings ask it
anonymously (hub/client.py `token`)."""

from __future__ import annotations

import time
from pathlib import Path
from typing import Annotated
from uuid import UUID

from fastapi import APIRouter, Query, status

from cohabit.hub import client as hub_client
from cohabit.hub.variants import quantization_of
from cohabit.service.api.deps import AdminOnly, Authorized, Caller, Context
from cohabit.service.api.hub_schemas import (
    HubModel,
    HubModelFile,
    HubModelFileSearch,
    ModelDownloadRequest,
    ModelDownloadResult,
    ModelDownloadStatus,
    ModelSearchRequest,
    ModelSearchResponse,
    ModelSearchResult,
    VariantInfo,
    VariantList,
)
from cohabit.service.api.schemas import GUARDED, HUB_DOWN, TAKEN, answers
from cohabit.service.errors import from_hub
from cohabit.service.registry import downloads, variants
from cohabit.service.registry.catalog import HUB
from cohabit.store import catalog
from cohabit.store.database import utcnow
from cohabit.store.downloads import DONE, FAILED, UNFINISHED, DownloadRecord

router = APIRouter(
    tags=["hub"],
    dependencies=[Authorized],
    responses=GUARDED | answers(400, 404) | HUB_DOWN,
)


@router.post("/models/search/", response_model=ModelSearchResponse)
def search_models(
    body: ModelSearchRequest, context: Context, caller: Caller
) -> ModelSearchResponse:
    found = from_hub(
        lambda: hub_client.search(
            body.query, limit=body.limit, exact=body.exact, server=caller.is_admin
        )
    )
    known = {m.repo_id: m.id for m in catalog.list_models(context.db) if m.repo_id}
    results = []
    for repo in found:
        model_id = UUID(known[repo.repo_id]) if repo.repo_id in known else None
        results.append(
            ModelSearchResult(
                id=model_id,
                model=HubModel(
                    id=model_id,
                    repo_modelId=repo.repo_id,
                    name=repo.repo_id,
                    hub=HUB,
                    source_repository=f"https://huggingface.co/{repo.repo_id}",
                    sha_repository=repo.commit,
                    downloads=repo.downloads,
                    likes=repo.likes,
                    tags=list(repo.tags),
                ),
            )
        )
    return ModelSearchResponse(results=results, total_results=len(results))


@router.post("/model_files/search/", response_model=list[HubModelFile])
def search_model_files(
    body: HubModelFileSearch, context: Context, caller: Caller
) -> list[HubModelFile]:
    """The repo's files as the Hub lists them, with the hash it publishes; a file already
    downloaded here carries its local path."""
    listing = from_hub(
        lambda: hub_client.repo(body.model, revision=body.version, server=caller.is_admin)
    )
    model = catalog.find_by_repo(context.db, listing.repo_id)
    local = {f.name: f for f in model.files} if model else {}
    active = {
        r.filename: r
        for r in (downloads.statuses(context.db, [model.id]) if model else [])
        if r.status in UNFINISHED
    }
    out = []
    for file in listing.files:
        here = local.get(file.name)
        location = here.storage_location if here else None
        exists = bool(location) and Path(location or "").is_file()
        out.append(
            HubModelFile(
                id=UUID(here.id) if here else None,
                name=file.name,
                size=file.size_bytes,
                hub=HUB,
                model_id=UUID(model.id) if model else None,
                checksum=file.sha256 or file.blob_id,
                checksum_type="sha256" if file.sha256 else ("sha1" if file.blob_id else None),
                storage_type="file" if exists else None,
                storage_location=location if exists else None,
                is_downloading=file.name in active,
                download=True if here else None,
                variant=quantization_of(file.name),
            )
        )
    return out


@router.get("/models/variants/", response_model=VariantList)
def list_variants(
    context: Context,
    caller: Caller,
    repo_id: Annotated[str, Query(min_length=1)],
    revision: str | None = None,
) -> VariantList:
    """Every GGUF variant with its size and each engine's estimate, and the default choice."""
    server = caller.is_admin
    listing = from_hub(lambda: hub_client.repo(repo_id, revision=revision, server=server))
    table = variants.table(context.db, listing, server=server)
    free_bytes, _ = variants.largest_free(context.db)
    return VariantList(
        repo_id=table.repo_id,
        revision=table.revision,
        variants=[
            VariantInfo(
                name=row.variant.name,
                files=list(row.variant.files),
                size=row.variant.size_bytes,
                estimates=row.needed_bytes,
                fits=row.needed_bytes.get(variants.CHOICE_ENGINE, row.variant.size_bytes)
                <= free_bytes,
            )
            for row in table.rows
        ],
        chosen=table.choice.variant.name,
        reason=table.choice.reason,
        largest_free_bytes=free_bytes,
    )


@router.post(
    "/models/download/",
    response_model=ModelDownloadResult,
    status_code=status.HTTP_202_ACCEPTED,
    responses=TAKEN,  # another model has the repo id as its name
    dependencies=[AdminOnly],
)
def download_model(body: ModelDownloadRequest, context: Context) -> ModelDownloadResult:
    ask = downloads.DownloadAsk(
        repo_id=body.model,
        files=tuple(body.files_to_download) if body.files_to_download else None,
        variant=body.variant,
        revision=body.version,
        to_cache=body.hf_cache,
    )
    queued = downloads.request_download(context.db, ask, data_dir=context.settings.data_dir)
    context.downloader.wake()
    names = [d.filename for d in queued.downloads]
    message = f"downloading {len(names)} file(s)" if names else "all requested files are downloaded"
    return ModelDownloadResult(
        result=True,
        message=message,
        model_id=UUID(queued.model.id),
        variant=queued.variant,
        reason=queued.reason,
        files=names,
        already_downloaded=list(queued.already_here),
    )


@router.get("/model_files/download_status/", response_model=list[ModelDownloadStatus])
def download_status(
    context: Context, model_ids: Annotated[list[UUID], Query()]
) -> list[ModelDownloadStatus]:
    records = downloads.statuses(context.db, [str(m) for m in model_ids])
    return [_status(record) for record in records]


def _status(record: DownloadRecord) -> ModelDownloadStatus:
    size = record.size_bytes
    done = record.done_bytes
    elapsed_s = None
    if record.started_at is not None:
        end = record.finished_at or utcnow()
        elapsed_s = max((end - record.started_at).total_seconds(), 0.0)
    speed = done / elapsed_s if elapsed_s and record.status != DONE else None
    eta = int((size - done) / speed) if speed and size else None
    percentage = min(100, int(done * 100 / size)) if size else None
    return ModelDownloadStatus(
        id=UUID(record.file_id),
        m_id=UUID(record.model_id),
        name=record.filename,
        is_downloading=record.status in UNFINISHED,
        download_percentage=100 if record.status == DONE else percentage,
        download_elapsed=None if elapsed_s is None else _clock(elapsed_s),
        download_remaining=None if eta is None else _clock(eta),
        download_throughput=None if speed is None else f"{speed / 2**20:.2f} MiB/s",
        download=record.status != FAILED,
        dl_requested_at=record.requested_at if record.status in UNFINISHED else None,
        storage_location=record.path,
        download_node=None,
        download_speed=speed,
        download_eta=eta,
        size=size,
        downloaded_bytes=done,
        status=record.status,
        error=record.error,
    )


def _clock(seconds: float) -> str:
    """MM:SS, as the reference's download_elapsed (HH:MM:SS past an hour)."""
    whole = int(seconds)
    return time.strftime("%H:%M:%S" if whole >= 3600 else "%M:%S", time.gmtime(whole))
