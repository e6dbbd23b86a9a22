"""Talks to the Hugging Face Hub through `huggingface_hub`: search, a repo's file listing with
the sizes and hashes the Hub publishes (each checked, answers.py), and one file's download into
the model store (resumed from its part with an HTTP Range request) or the shared Hugging Face
cache, confined to its folder and its listed size (landing.py), then verified.

`HF_ENDPOINT`, `HF_TOKEN`, `HF_HUB_OFFLINE` and the cache's location are read at each call
(not at import, as `huggingface_hub.constants` does), so a server started before they were
set still obeys them. Called by the service's download worker and its search routes.
"""

from __future__ import annotations

import os
from dataclasses import dataclass
from pathlib import Path
from typing import Any
from urllib.parse import urlsplit

from cohabit.hub import answers, landing
from cohabit.hub.errors import (
    Cancelled,
    FileDamaged,
    HubError,
    HubUnavailable,
    Refused,
    RepoNotFound,
)
from cohabit.hub.landing import Progress

_TRUE = {"1", "ON", "YES", "TRUE"}  # huggingface_hub.constants.ENV_VARS_TRUE_VALUES
_STREAM_BYTES = 256 * 1024  # progress (and a resumable part) grows by this much at a time
_READ_TIMEOUT_S = 60.0


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


def token(*, server: bool) -> str | bool | None:
    """What a Hub call is authorised with. `server`: the call is the server's own (its
    download worker, an admin's request), which may carry the server's credentials: HF_TOKEN,
    else whatever huggingface_hub finds on this machine (None). Otherwise no token at all
    (False: huggingface_hub utils/_headers.py `get_token_to_send` sends none, where None
    would send the machine's), so a `user` token never opens a private or gated repo with
    the server's credentials."""
    if not server:
        return False
    return os.environ.get("HF_TOKEN") or None


def ensure_online() -> None:
    """Raise HubUnavailable in offline mode (HF_HUB_OFFLINE is set): the Hub is not asked."""
    if offline():
        raise HubUnavailable("offline mode (HF_HUB_OFFLINE is set): the Hub is not asked")


def _api(*, server: bool) -> Any:
    ensure_online()
    from huggingface_hub import HfApi

    return HfApi(endpoint=endpoint(), token=token(server=server))


def search(query: str, *, limit: int, exact: bool = False, server: bool) -> list[HubRepo]:
    """Model repos whose id contains `query` (or equals it, `exact`), most downloaded first.
    Files are not listed here: `repo()` lists one repo's. `server`: see `token`."""
    api = _api(server=server)
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


def repo(repo_id: str, *, revision: str | None = None, server: bool) -> HubRepo:
    """A repo's files with sizes and hashes (`GET /api/models/{repo}[/revision/{rev}]
    ?blobs=true`), at the commit the revision names now. Every name, size, hash and the
    commit are checked here (answers.py), and the repo id is the one asked for: the Hub may
    answer another (a renamed repo, a mirror's mistake), and that never names a folder.
    `server`: see `token`. Raises BadRepoId, Refused, RepoNotFound or HubUnavailable."""
    asked = answers.repo_id(repo_id)
    api = _api(server=server)
    try:
        info = api.model_info(asked, revision=revision, files_metadata=True)
    except Exception as err:
        raise _translate(err, asked) from None
    files = tuple(
        _checked(
            HubFile(
                name=sibling.rfilename,
                size_bytes=sibling.size,
                sha256=sibling.lfs.sha256 if sibling.lfs else None,
                blob_id=sibling.blob_id,
            ),
            field=f"{asked}: siblings[{index}]",
        )
        for index, sibling in enumerate(info.siblings or ())
    )
    return HubRepo(
        repo_id=asked,
        commit=answers.commit(info.sha, field=f"{asked}: sha"),
        downloads=info.downloads,
        likes=info.likes,
        tags=tuple(info.tags or ()),
        files=files,
    )


def _checked(file: HubFile, *, field: str) -> HubFile:
    """The file as listed, each field checked; one without a hash cannot be verified."""
    checked = HubFile(
        name=answers.file_name(file.name, field=f"{field}.rfilename"),
        size_bytes=answers.size_bytes(file.size_bytes, field=f"{field}.size"),
        sha256=answers.sha256(file.sha256, field=f"{field}.lfs.sha256"),
        blob_id=answers.blob_id(file.blob_id, field=f"{field}.blobId"),
    )
    if checked.sha256 is None and checked.blob_id is None:
        raise Refused(f"{field}.blobId", f"{file.name!r} is listed without a hash to check")
    return checked


def fetch(
    repo_id: str,
    file: HubFile,
    *,
    revision: str,
    store: Path | None,
    progress: Progress,
) -> Path:
    """Download `file` (its size enforced while it streams), then check its hash.

    `store`: the model store (`<data dir>/models`); the file goes to `<store>/<repo id>/<name>`,
    a part left by an interrupted download (`<store>/.partial/<digest>.part`) is resumed
    with an HTTP Range request. None: the shared Hugging Face cache, laid out as
    huggingface_hub lays it out (`models--<org>--<name>/blobs/<hash>`, linked from
    `snapshots/<commit>/<name>`). Nothing is written, replaced or removed outside that root,
    and no link below it is followed. Raises FileDamaged (the part is removed, so a retry
    starts clean), Refused, BadRepoId, RepoNotFound or HubUnavailable.
    """
    repo_id = answers.repo_id(repo_id)
    file = _checked(file, field=f"{repo_id}: queued file")
    if offline():
        path = _already_there(repo_id, file, revision=revision, store=store)
        if path is None:
            raise HubUnavailable(
                f"{file.name}: not downloaded yet, and offline mode (HF_HUB_OFFLINE) is set"
            )
        return path
    try:
        if store is None:
            path = _fetch_to_cache(repo_id, file, revision=revision, progress=progress)
        else:
            path = _fetch_to_store(repo_id, file, revision=revision, store=store, progress=progress)
    except (HubError, Cancelled):
        raise
    except Exception as err:
        raise _translate(err, f"{repo_id}/{file.name}") from None
    progress(file.size_bytes or 0)
    return path


def _fetch_to_store(
    repo_id: str, file: HubFile, *, revision: str, store: Path, progress: Progress
) -> Path:
    here = _store_path(store, repo_id, file)
    if landing.regular_file(here, what=file.name) and _intact(here, file):
        return here
    part = landing.folder(store, ".partial", what=file.name) / landing.part_name(
        repo_id, file.name, file.sha256 or file.blob_id or "", str(file.size_bytes)
    )
    _download(repo_id, file, revision=revision, part=part, progress=progress)
    landing.regular_file(here, what=file.name)  # what is in the way now is not replaced
    os.replace(part, here)
    return here


def _fetch_to_cache(repo_id: str, file: HubFile, *, revision: str, progress: Progress) -> Path:
    """Into the shared cache with the hash the listing published (and the download matched)
    as the blob's name, where huggingface_hub's hf_hub_download names it by the ETag header,
    and behind its lock (`.locks/<repo folder>/<hash>.lock`) so the two never write one
    blob at once (huggingface_hub file_download.py `_hf_hub_download_to_cache_dir`)."""
    from huggingface_hub.utils._fixes import WeakFileLock

    commit = answers.commit(revision, field="revision")
    root, blob, pointer = _cache_paths(repo_id, file, commit=commit)
    locks = landing.folder(cache_dir(), f".locks/{root.name}", what=file.name)
    with WeakFileLock(locks / f"{blob.name}.lock"):
        if not (landing.regular_file(blob, what=file.name) and _intact(blob, file)):
            part = blob.with_name(blob.name + ".incomplete")
            landing.regular_file(part, what=file.name)
            _download(repo_id, file, revision=commit, part=part, progress=progress)
            os.replace(part, blob)
    if pointer.is_symlink() or landing.regular_file(pointer, what=file.name):
        pointer.unlink()  # the cache's own pointer, inside its snapshot folder
    pointer.symlink_to(os.path.relpath(blob, pointer.parent))
    return pointer


def _download(
    repo_id: str, file: HubFile, *, revision: str, part: Path, progress: Progress
) -> None:
    """Stream the file into `part` (resumed from what it holds with an HTTP Range request),
    at most its listed size, then check it; a damaged part is removed."""
    from huggingface_hub import get_hf_file_metadata, get_session, hf_hub_url, hf_raise_for_status
    from huggingface_hub.utils._headers import build_hf_headers

    size = file.size_bytes or 0
    there = landing.regular_file(part, what=file.name)
    done = os.lstat(part).st_size if there else 0
    if done > size:
        done = 0
    if done < size or not there:  # a complete part is only checked (an empty file is asked)
        url = hf_hub_url(repo_id, file.name, revision=revision, endpoint=endpoint())
        meta = get_hf_file_metadata(url, token=token(server=True))  # the worker's own
        headers = build_hf_headers(token=token(server=True))
        # the bytes as stored: a compressed body is neither decoded nor counted as the file
        headers["Accept-Encoding"] = "identity"
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
            landing.write_part(
                part,
                response.iter_raw(_STREAM_BYTES),
                start_bytes=done,
                size_bytes=size,
                name=file.name,
                progress=progress,
            )
    try:
        _verify(part, file)
    except FileDamaged:
        landing.discard(part)
        raise


def _store_path(store: Path, repo_id: str, file: HubFile) -> Path:
    parent, _, base = f"{repo_id}/{file.name}".rpartition("/")
    return landing.folder(store, parent, what=file.name) / base


def _cache_paths(repo_id: str, file: HubFile, *, commit: str) -> tuple[Path, Path, Path]:
    """The repo's cache folder (its root), the blob and the snapshot's pointer to it."""
    from huggingface_hub.file_download import repo_folder_name

    root = cache_dir() / repo_folder_name(repo_id=repo_id, repo_type="model")
    blob = landing.folder(root, "blobs", what=file.name) / (file.sha256 or file.blob_id or "")
    parent, _, base = f"snapshots/{commit}/{file.name}".rpartition("/")
    return root, blob, landing.folder(root, parent, what=file.name) / base


def _intact(path: Path, file: HubFile) -> bool:
    """Whether a copy already there is the Hub's file; one that is not stays until a
    verified download replaces it."""
    try:
        _verify(path, file)
    except FileDamaged:
        return False
    return True


def _verify(path: Path, file: HubFile) -> None:
    landing.verify(
        path,
        name=file.name,
        size_bytes=file.size_bytes or 0,
        sha256=file.sha256,
        blob_id=file.blob_id,
    )


def _already_there(
    repo_id: str, file: HubFile, *, revision: str, store: Path | None
) -> Path | None:
    """Offline: the copy downloaded before, checked; None when there is none."""
    if store is not None:
        path = _store_path(store, repo_id, file)
        if not landing.regular_file(path, what=file.name):
            return None
        _verify(path, file)
        return path
    _root, blob, pointer = _cache_paths(
        repo_id, file, commit=answers.commit(revision, field="revision")
    )
    if not landing.regular_file(blob, what=file.name):
        return None
    _verify(blob, file)
    linked = pointer.is_symlink() and os.path.realpath(pointer) == os.path.realpath(blob)
    return pointer if linked else blob


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
