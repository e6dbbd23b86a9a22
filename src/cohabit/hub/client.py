"""Talks to the Hugging Face Hub through `huggingface_hub`: search, a repo's file listing with
the sizes and hashes the Hub publishes, and one file's download into the model store (or the
shared Hugging Face cache), resumed from its `.incomplete` part and then verified.

`HF_ENDPOINT`, `HF_TOKEN` and `HF_HUB_OFFLINE` are read at each call (not at import, as
`huggingface_hub.constants` does), so a server started before they were set still obeys them.
Called by the service's download worker and its search routes.
"""

from __future__ import annotations

import hashlib
import os
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from cohabit.hub.errors import FileDamaged, HubUnavailable, RepoNotFound

_TRUE = {"1", "ON", "YES", "TRUE"}  # huggingface_hub.constants.ENV_VARS_TRUE_VALUES
_CHUNK_BYTES = 8 * 1024 * 1024

Progress = Callable[[int], None]  # bytes of the file on disk so far


@dataclass(frozen=True, slots=True, kw_only=True)
class HubFile:
    """One file of a repo as the Hub lists it. `sha256` is the LFS object's hash (large
    files); `blob_id` the git blob's sha1 (every file)."""

    name: str
    size_bytes: int | None
    sha256: str | None
    blob_id: str | None


@dataclass(frozen=True, slots=True, kw_only=True)
class HubRepo:
    repo_id: str
    commit: str | None
    downloads: int | None
    likes: int | None
    tags: tuple[str, ...]
    files: tuple[HubFile, ...]


def offline() -> bool:
    return os.environ.get("HF_HUB_OFFLINE", "").upper() in _TRUE


def endpoint() -> str | None:
    return os.environ.get("HF_ENDPOINT") or None


def _token() -> str | None:
    return os.environ.get("HF_TOKEN") or None


def _api() -> Any:
    if offline():
        raise HubUnavailable("offline mode (HF_HUB_OFFLINE is set): the Hub is not asked")
    from huggingface_hub import HfApi

    return HfApi(endpoint=endpoint(), token=_token())


def search(query: str, *, limit: int, exact: bool = False) -> list[HubRepo]:
    """Model repos whose id contains `query` (or equals it, `exact`), most downloaded first.
    Files are not listed here: `repo()` lists one repo's."""
    api = _api()
    try:
        found = list(api.list_models(search=query, limit=limit, sort="downloads"))
    except Exception as err:
        raise _translate(err, query) from None
    repos = [
        HubRepo(
            repo_id=info.id,
            commit=info.sha,
            downloads=info.downloads,
            likes=info.likes,
            tags=tuple(info.tags or ()),
            files=(),
        )
        for info in found
    ]
    return [r for r in repos if r.repo_id.lower() == query.lower()] if exact else repos


def repo(repo_id: str, *, revision: str | None = None) -> HubRepo:
    """A repo's files with sizes and hashes (`GET /api/models/{repo}[/revision/{rev}]
    ?blobs=true`), at the commit the revision names now."""
    api = _api()
    try:
        info = api.model_info(repo_id, revision=revision, files_metadata=True)
    except Exception as err:
        raise _translate(err, repo_id) from None
    files = tuple(
        HubFile(
            name=sibling.rfilename,
            size_bytes=sibling.size,
            sha256=sibling.lfs.sha256 if sibling.lfs else None,
            blob_id=sibling.blob_id,
        )
        for sibling in info.siblings or ()
    )
    return HubRepo(
        repo_id=info.id,
        commit=info.sha,
        downloads=info.downloads,
        likes=info.likes,
        tags=tuple(info.tags or ()),
        files=files,
    )


def fetch(
    repo_id: str,
    file: HubFile,
    *,
    revision: str,
    store_dir: Path | None,
    progress: Progress,
) -> Path:
    """Download `file` (resuming its `.incomplete` part), then check its size and hash.

    `store_dir`: the repo's folder in the model store; None: the shared Hugging Face cache.
    Raises FileDamaged (the damaged copy is removed, so a retry starts clean), RepoNotFound
    or HubUnavailable.
    """
    from huggingface_hub import hf_hub_download

    if offline():
        path = _already_there(repo_id, file, revision=revision, store_dir=store_dir)
        if path is None:
            raise HubUnavailable(
                f"{file.name}: not downloaded yet, and offline mode (HF_HUB_OFFLINE) is set"
            )
        return path
    try:
        path = Path(
            hf_hub_download(
                repo_id,
                file.name,
                revision=revision,
                local_dir=store_dir,
                endpoint=endpoint(),
                token=_token(),
                tqdm_class=_bar_reporting_to(progress),
            )
        )
    except Exception as err:
        raise _translate(err, f"{repo_id}/{file.name}") from None
    verify(path, file)
    progress(path.stat().st_size)
    return path


def verify(path: Path, file: HubFile) -> None:
    """The size and the hash the Hub published: the LFS sha256 or, for small files, the git
    blob sha1 (`sha1("blob <size>\\0" + content)`). A mismatch removes the file."""
    size = path.stat().st_size
    if file.size_bytes is not None and size != file.size_bytes:
        _discard(path)
        raise FileDamaged(file.name, f"{size} bytes on disk, the Hub lists {file.size_bytes}")
    if file.sha256:
        digest = _digest(path, hashlib.sha256())
        if digest != file.sha256:
            _discard(path)
            raise FileDamaged(
                file.name, f"sha256 {digest} does not match the Hub's {file.sha256}"
            )
    elif file.blob_id:
        digest = _digest(path, hashlib.sha1(f"blob {size}\0".encode(), usedforsecurity=False))
        if digest != file.blob_id:
            _discard(path)
            raise FileDamaged(
                file.name, f"git blob sha1 {digest} does not match the Hub's {file.blob_id}"
            )


def _already_there(
    repo_id: str, file: HubFile, *, revision: str, store_dir: Path | None
) -> Path | None:
    from huggingface_hub import hf_hub_download

    try:
        path = Path(
            hf_hub_download(
                repo_id,
                file.name,
                revision=revision,
                local_dir=store_dir,
                local_files_only=True,
            )
        )
    except Exception:  # every kind means "not in the local copy"
        return None
    verify(path, file)
    return path


def _digest(path: Path, hasher: Any) -> str:
    with path.open("rb") as handle:
        while chunk := handle.read(_CHUNK_BYTES):
            hasher.update(chunk)
    return str(hasher.hexdigest())


def _discard(path: Path) -> None:
    # In the cache the file is a link to its blob: the blob is what must go.
    target = path.resolve()
    path.unlink(missing_ok=True)
    target.unlink(missing_ok=True)


def _bar_reporting_to(progress: Progress) -> type:
    """A silent tqdm class whose count (it starts at the resumed size) goes to `progress`."""
    from huggingface_hub.utils import tqdm

    class _Bar(tqdm):  # type: ignore[misc]
        def __init__(self, *args: Any, **kwargs: Any) -> None:
            kwargs["disable"] = True
            super().__init__(*args, **kwargs)
            self._done = int(kwargs.get("initial") or 0)
            progress(self._done)

        def update(self, n: float | None = 1) -> bool | None:
            self._done += int(n or 0)
            progress(self._done)
            return None

    return _Bar


def _translate(err: Exception, what: str) -> Exception:
    from huggingface_hub.errors import (
        EntryNotFoundError,
        OfflineModeIsEnabled,
        RepositoryNotFoundError,
        RevisionNotFoundError,
    )

    if isinstance(err, HubUnavailable | FileDamaged):
        return err
    if isinstance(err, OfflineModeIsEnabled):
        return HubUnavailable(f"{what}: offline mode (HF_HUB_OFFLINE) is set")
    if isinstance(err, RepositoryNotFoundError | RevisionNotFoundError | EntryNotFoundError):
        return RepoNotFound(f"{what}: not found on the Hub ({type(err).__name__})")
    return HubUnavailable(f"{what}: the Hub could not be reached: {err}")
