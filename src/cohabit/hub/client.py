"""Talks to the Hugging Face Hub through `huggingface_hub`: search, a repo's file listing with
the sizes and hashes the Hub publishes, and one file's download into the model store (resumed
from its part with an HTTP Range request) or the shared Hugging Face cache, then verified.

`HF_ENDPOINT`, `HF_TOKEN`, `HF_HUB_OFFLINE` and the cache's location are read at each call
(not at import, as `huggingface_hub.constants` does), so a server started before they were
set still obeys them. Called by the service's download worker and its search routes.
"""

from __future__ import annotations

import hashlib
import os
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from typing import Any
from urllib.parse import urlsplit

from cohabit.hub.errors import Cancelled, FileDamaged, HubError, HubUnavailable, RepoNotFound

_TRUE = {"1", "ON", "YES", "TRUE"}  # huggingface_hub.constants.ENV_VARS_TRUE_VALUES
_CHUNK_BYTES = 8 * 1024 * 1024
_STREAM_BYTES = 256 * 1024  # progress (and a resumable part) grows by this much at a time
_READ_TIMEOUT_S = 60.0

Progress = Callable[[int], None]  # bytes of the file on disk so far; may raise Cancelled


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


def cache_dir() -> Path:
    """The shared Hugging Face cache, found as huggingface_hub's constants.py finds it:
    HF_HUB_CACHE, else HUGGINGFACE_HUB_CACHE, else HF_HOME/hub (HF_HOME defaulting to
    $XDG_CACHE_HOME/huggingface, then ~/.cache/huggingface)."""
    given = os.environ.get("HF_HUB_CACHE") or os.environ.get("HUGGINGFACE_HUB_CACHE")
    if given:
        return Path(os.path.expandvars(given)).expanduser()
    xdg = os.environ.get("XDG_CACHE_HOME") or str(Path("~/.cache").expanduser())
    home = os.environ.get("HF_HOME") or os.path.join(xdg, "huggingface")
    return Path(os.path.expandvars(home)).expanduser() / "hub"


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
    """Download `file`, then check its size and hash.

    `store_dir`: the repo's folder in the model store, where a part left by an interrupted
    download (`.partial/<name>.<etag>.part`) is resumed with an HTTP Range request. None: the
    shared Hugging Face cache, through `hf_hub_download` (huggingface_hub 2.x downloads to a
    per-process temporary file and drops it when interrupted, so there a download restarts).
    Raises FileDamaged (the damaged copy is removed, so a retry starts clean), RepoNotFound
    or HubUnavailable.
    """
    if offline():
        path = _already_there(repo_id, file, revision=revision, store_dir=store_dir)
        if path is None:
            raise HubUnavailable(
                f"{file.name}: not downloaded yet, and offline mode (HF_HUB_OFFLINE) is set"
            )
        return path
    try:
        if store_dir is None:
            path = _fetch_to_cache(repo_id, file, revision=revision, progress=progress)
        else:
            path = _fetch_to_store(
                repo_id, file, revision=revision, folder=store_dir, progress=progress
            )
    except (HubError, Cancelled):
        raise
    except Exception as err:
        raise _translate(err, f"{repo_id}/{file.name}") from None
    progress(path.stat().st_size)
    return path


def _fetch_to_store(
    repo_id: str, file: HubFile, *, revision: str, folder: Path, progress: Progress
) -> Path:
    from huggingface_hub import get_hf_file_metadata, get_session, hf_hub_url, hf_raise_for_status
    from huggingface_hub.utils._headers import build_hf_headers

    target = folder / file.name
    if target.is_file() and target.stat().st_size == file.size_bytes:
        verify(target, file)  # raises (and removes it) when it is not the Hub's file
        return target
    url = hf_hub_url(repo_id, file.name, revision=revision, endpoint=endpoint())
    meta = get_hf_file_metadata(url, token=_token())
    part = folder / ".partial" / f"{file.name}.{meta.etag}.part"
    part.parent.mkdir(parents=True, exist_ok=True)
    done = part.stat().st_size if part.exists() else 0
    headers = build_hf_headers(token=_token())
    if urlsplit(meta.location).netloc != urlsplit(url).netloc:
        headers.pop("authorization", None)  # a CDN's signed URL: the token stays home
    if done:
        headers["Range"] = f"bytes={done}-"
    with get_session().stream(
        "GET", meta.location, headers=headers, follow_redirects=True, timeout=_READ_TIMEOUT_S
    ) as response:
        hf_raise_for_status(response)
        if done and response.status_code != 206:  # the server ignored the range: start over
            done = 0
        progress(done)
        with part.open("ab" if done else "wb") as out:
            for chunk in response.iter_bytes(_STREAM_BYTES):
                out.write(chunk)
                done += len(chunk)
                progress(done)
    verify(part, file)
    target.parent.mkdir(parents=True, exist_ok=True)
    part.replace(target)
    return target


def _fetch_to_cache(repo_id: str, file: HubFile, *, revision: str, progress: Progress) -> Path:
    from huggingface_hub import hf_hub_download

    path = Path(
        hf_hub_download(
            repo_id,
            file.name,
            revision=revision,
            cache_dir=cache_dir(),
            endpoint=endpoint(),
            token=_token(),
            tqdm_class=_bar_reporting_to(progress),
        )
    )
    verify(path, file)
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
            raise FileDamaged(file.name, f"sha256 {digest} does not match the Hub's {file.sha256}")
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

    if store_dir is not None:
        path = store_dir / file.name
        if not path.is_file():
            return None
    else:
        try:
            path = Path(
                hf_hub_download(
                    repo_id,
                    file.name,
                    revision=revision,
                    cache_dir=cache_dir(),
                    local_files_only=True,
                )
            )
        except Exception:  # every kind means "not in the local cache"
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
    from huggingface_hub.utils.tqdm import tqdm

    class _Bar(tqdm):
        def __init__(self, *args: Any, **kwargs: Any) -> None:
            kwargs["disable"] = True
            super().__init__(*args, **kwargs)  # type: ignore[no-untyped-call]
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
