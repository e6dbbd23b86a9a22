"""Bodies of the Hub routes (search, file search, download, download status, variants), in
the shapes the `kamiwaza-sdk` client validates (its schemas/models/model_search.py,
downloads.py and model_file.py); `variant`, `hf_cache` and the variants listing are ours."""

from __future__ import annotations

from datetime import datetime
from typing import Any
from uuid import UUID

from pydantic import BaseModel, ConfigDict, Field


class ModelSearchRequest(BaseModel):
    model_config = ConfigDict(extra="ignore")

    query: str = Field(min_length=1)
    hubs_to_search: list[str] | None = None
    exact: bool = False
    limit: int = Field(default=100, ge=1, le=1000)


class HubModel(BaseModel):
    """A repo found on the Hub; `id` is set when it is registered here already."""

    id: UUID | None
    repo_modelId: str  # noqa: N815 - the wire name
    name: str
    hub: str
    source_repository: str
    sha_repository: str | None
    private: bool = False
    m_files: list[dict[str, Any]] = Field(default_factory=list)
    downloads: int | None
    likes: int | None
    tags: list[str]


class ModelSearchResult(BaseModel):
    id: UUID | None
    model: HubModel


class ModelSearchResponse(BaseModel):
    results: list[ModelSearchResult]
    total_results: int


class HubModelFileSearch(BaseModel):
    model_config = ConfigDict(extra="ignore")

    hub: str = "HubsHf"
    model: str = Field(min_length=1)
    version: str | None = None


class HubModelFile(BaseModel):
    """One file of a Hub repo; `storage_location` only when it is downloaded here."""

    model_config = ConfigDict(populate_by_name=True, serialize_by_alias=True)

    id: UUID | None
    name: str
    size: int | None
    hub: str
    m_id: UUID | None = Field(alias="model_id")
    checksum: str | None
    checksum_type: str | None  # sha256 (LFS) or sha1 (git blob)
    storage_type: str | None
    storage_location: str | None
    is_downloading: bool
    download: bool | None
    variant: str | None


class ModelDownloadRequest(BaseModel):
    model_config = ConfigDict(extra="ignore")

    model: str = Field(min_length=1)
    version: str | None = None
    hub: str | None = None
    files_to_download: list[str] | None = None
    variant: str | None = None  # a GGUF quantization (Q4_K_M); default: the fleet's choice
    hf_cache: bool = False  # into the shared Hugging Face cache instead of the model store


class ModelDownloadResult(BaseModel):
    result: bool
    message: str
    model_id: UUID
    variant: str | None
    reason: str | None
    files: list[str]
    already_downloaded: list[str]


class ModelDownloadStatus(BaseModel):
    id: UUID
    m_id: UUID
    name: str
    is_downloading: bool
    download_percentage: int | None
    download_elapsed: str | None
    download_remaining: str | None
    download_throughput: str | None
    download: bool
    dl_requested_at: datetime | None
    storage_location: str | None
    download_node: str | None
    download_speed: float | None
    download_eta: int | None
    size: int | None
    downloaded_bytes: int
    status: str  # queued | running | done | failed
    error: str | None


class VariantInfo(BaseModel):
    name: str
    files: list[str]
    size: int
    estimates: dict[str, int]  # engine → bytes per device
    fits: bool


class VariantList(BaseModel):
    repo_id: str
    revision: str | None
    variants: list[VariantInfo]
    chosen: str
    reason: str
    largest_free_bytes: int
