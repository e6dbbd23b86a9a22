"""Models from the Hub: turning a download request into a registered model with queued file
rows, and the worker thread that fetches them one at a time (resuming, verifying, and
pointing the model at its files when the last one lands). Rows a stopped server left running
are queued again when the worker starts. Called by the models routers and the app's lifespan.
"""

from __future__ import annotations

import logging
import threading
import time
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, replace
from pathlib import Path

from cohabit.estimate import EstimateError
from cohabit.estimate.checkpoint import load_shape
from cohabit.hub import client as hub
from cohabit.hub.client import HubFile, HubRepo
from cohabit.hub.errors import Cancelled, HubError
from cohabit.hub.variants import first_file, quantization_of, variants_of
from cohabit.service.errors import InvalidInput, found, from_hub
from cohabit.service.registry.catalog import HUB, default_config
from cohabit.service.registry.variants import pick_variant
from cohabit.store import catalog, downloads
from cohabit.store.catalog import NewFile
from cohabit.store.database import Database
from cohabit.store.downloads import DownloadRecord, NewDownload
from cohabit.store.errors import DatabaseUnavailable
from cohabit.store.records import ModelRecord

log = logging.getLogger(__name__)

# Files a model is made of; the rest of a repo (images, other frameworks' weights) stays.
_MODEL_SUFFIXES = (".safetensors", ".json", ".model", ".txt", ".jinja", ".tiktoken")
_PROGRESS_EVERY_S = 0.5
# A running row with no progress for this long belongs to a server that stopped; another
# (or the same, restarted) takes it over and resumes its part.
STALE_S = 15.0
# How long the worker waits after a fault (the database away) before it tries again.
RETRY_S = 1.0


@dataclass(frozen=True, slots=True, kw_only=True)
class DownloadAsk:
    repo_id: str
    files: tuple[str, ...] | None  # None: the chosen variant, or the whole model
    variant: str | None
    revision: str | None
    to_cache: bool


@dataclass(frozen=True, slots=True, kw_only=True)
class Queued:
    model: ModelRecord
    downloads: tuple[DownloadRecord, ...]
    already_here: tuple[str, ...]
    variant: str | None
    reason: str | None


def model_store(data_dir: Path) -> Path:
    """The model store: a repo's files go to `<data dir>/models/<org>/<name>/` (hub/client.py
    joins the repo id and file names below it, checked, and writes nothing outside it)."""
    return data_dir / "models"


def request_download(db: Database, ask: DownloadAsk, *, data_dir: Path) -> Queued:
    """List the repo, pick its files, register the model (once) and queue what is missing.
    The model's name, repo id and folder are the repo id asked for (`hub.repo` returns it, not
    the one the Hub answers). Raises NotFound (no such repo), InvalidInput (a malformed repo
    id, unknown file or variant), Conflict (another model has the repo id as its name),
    HubAnswerRefused (a listing that cannot be stored safely), HubUnreachable."""
    listing = from_hub(lambda: hub.repo(ask.repo_id, revision=ask.revision, server=True))
    by_name = {f.name: f for f in listing.files}
    variant, reason = None, None
    if ask.files:
        unknown = [name for name in ask.files if name not in by_name]
        if unknown:
            raise InvalidInput(f"{ask.repo_id} has no file {', '.join(map(repr, unknown))}")
        wanted = [by_name[name] for name in ask.files]
    else:
        wanted, variant, reason = _model_files(db, listing, ask.variant)
    gguf = any(f.name.endswith(".gguf") for f in wanted)
    # A model of another source may hold the repo id as its name: a 409 naming it.
    model = catalog.find_by_repo(db, listing.repo_id) or found(
        lambda: catalog.add_model(
            db,
            name=listing.repo_id,
            repo_id=listing.repo_id,
            hub=HUB,
            source=listing.repo_id,
            model_path=None,
            format="gguf" if gguf else "safetensors",
            description=None,
            files=[],
            default_config={"engine": "llamacpp" if gguf else "vllm"},
        )
    )
    records = catalog.add_files(
        db,
        model.id,
        [
            NewFile(
                name=f.name, size_bytes=f.size_bytes, storage_type="file", storage_location=None
            )
            for f in wanted
        ],
    )
    missing: list[NewDownload] = []
    here: list[str] = []
    for record, file in zip(records, wanted, strict=True):
        location = record.storage_location
        if (
            location
            and Path(location).is_file()
            and Path(location).stat().st_size == file.size_bytes
        ):
            here.append(file.name)
            continue
        missing.append(
            NewDownload(
                model_id=model.id,
                file_id=record.id,
                repo_id=listing.repo_id,
                revision=listing.commit or ask.revision or "main",
                filename=file.name,
                size_bytes=file.size_bytes,
                sha256=file.sha256,
                blob_id=file.blob_id,
                to_cache=ask.to_cache,
            )
        )
    queued = downloads.queue(db, missing) if missing else []
    return Queued(
        model=catalog.get_model(db, model.id),
        downloads=tuple(queued),
        already_here=tuple(here),
        variant=variant,
        reason=reason,
    )


def _model_files(
    db: Database, listing: HubRepo, variant_name: str | None
) -> tuple[list[HubFile], str | None, str | None]:
    """A GGUF repo: one variant's files (asked for by name, or the default choice). Other
    repos: the files a model is made of."""
    sizes = {f.name: f.size_bytes for f in listing.files}
    variants = variants_of(sizes)
    by_name = {f.name: f for f in listing.files}
    if variants:
        if variant_name:
            chosen = next((v for v in variants if v.name == variant_name.upper()), None)
            if chosen is None:
                names = ", ".join(v.name for v in variants)
                raise InvalidInput(
                    f"{listing.repo_id} has no variant {variant_name!r} (it has {names})"
                )
            return [by_name[n] for n in chosen.files], chosen.name, "asked for"
        choice = pick_variant(db, listing, variants)
        return [by_name[n] for n in choice.variant.files], choice.variant.name, choice.reason
    if variant_name:
        raise InvalidInput(f"{listing.repo_id} has no GGUF variants; give no variant")
    wanted = [f for f in listing.files if f.name.endswith(_MODEL_SUFFIXES)]
    if not wanted:
        raise InvalidInput(f"{listing.repo_id} has no model files (safetensors or GGUF)")
    return wanted, None, None


class Downloader:
    """One worker thread fetching queued files in order. `wake()` after queueing."""

    def __init__(self, db: Database, *, data_dir: Path) -> None:
        self._db = db
        self._data_dir = data_dir
        self._stop = threading.Event()
        self._wake = threading.Event()
        self._thread: threading.Thread | None = None

    def start(self) -> None:
        self._thread = threading.Thread(target=self._loop, name="cohabit-downloads", daemon=True)
        self._thread.start()

    def stop(self, *, timeout_s: float = 10.0) -> None:
        """The file being fetched stops at its next chunk and goes back to the queue; the next
        start resumes it from the part on disk."""
        self._stop.set()
        self._wake.set()
        if self._thread is not None:
            self._thread.join(timeout_s)

    def wake(self) -> None:
        self._wake.set()

    def _loop(self) -> None:
        """Fetch what is queued, in order, until stopped. A fault (the database away for a
        while) is logged and the worker goes on after `RETRY_S`: a file it was fetching is
        resumed once its lease runs out (`requeue_stale`)."""
        checked = -STALE_S
        while not self._stop.is_set():
            try:
                if time.monotonic() - checked >= STALE_S / 3:
                    checked = time.monotonic()
                    requeued = downloads.requeue_stale(self._db, lease_s=STALE_S)
                    if requeued:
                        log.info("resuming %d download(s) a stopped server left", requeued)
                row = downloads.next_queued(self._db)
                if row is None:
                    self._wake.wait(timeout=1.0)
                    self._wake.clear()
                    continue
                self._fetch(row)
            except DatabaseUnavailable as err:
                log.warning("downloads: %s; trying again in %.0f s", err, RETRY_S)
                self._stop.wait(RETRY_S)
            except Exception:  # the worker must go on: queued files would wait forever
                log.exception("downloads: a step failed; trying again in %.0f s", RETRY_S)
                self._stop.wait(RETRY_S)

    def _fetch(self, row: DownloadRecord) -> None:
        last = [0.0]

        def progress(done_bytes: int) -> None:
            if self._stop.is_set():
                raise Cancelled  # the server is stopping
            now = time.monotonic()
            if now - last[0] >= _PROGRESS_EVERY_S:
                last[0] = now
                downloads.progress(self._db, row.id, done_bytes)

        file = HubFile(
            name=row.filename, size_bytes=row.size_bytes, sha256=row.sha256, blob_id=row.blob_id
        )
        store = None if row.to_cache else model_store(self._data_dir)
        try:
            path = hub.fetch(
                row.repo_id, file, revision=row.revision, store=store, progress=progress
            )
        except Cancelled:
            downloads.requeue(self._db, row.id)  # the next start resumes it from its part
            return
        except HubError as err:
            log.warning("download of %s from %s failed: %s", row.filename, row.repo_id, err)
            downloads.finish(self._db, row.id, path=None, error=str(err))
            return
        catalog.set_file_location(self._db, row.file_id, str(path))
        # The model is pointed before its last file reads done, so a client that waits for
        # the downloads finds it deployable; and once more after, when another server's
        # worker finished the model's other file meanwhile.
        pointed = self._point_model(row.model_id, finishing={row.id: str(path)})
        downloads.finish(self._db, row.id, path=str(path), error=None)
        if not pointed:
            self._point_model(row.model_id)

    def _point_model(self, model_id: str, finishing: Mapping[str, str] | None = None) -> bool:
        """Once none of the model's files is still coming (`finishing`: download id → path of
        those about to be recorded done), point it at what an engine loads: the newest GGUF
        variant's first file, or the folder of a safetensors model. Whether it did."""
        about_done = finishing or {}
        rows = [
            replace(r, status=downloads.DONE, path=about_done[r.id]) if r.id in about_done else r
            for r in downloads.for_models(self._db, [model_id])
        ]
        if any(r.status in downloads.UNFINISHED for r in rows):
            return False
        done = [r for r in rows if r.status == downloads.DONE and r.path]
        if not done:
            return False
        gguf = sorted(
            (r for r in done if quantization_of(r.filename)), key=lambda r: r.requested_at
        )
        paths = {r.filename: r.path or "" for r in done}
        if gguf:
            newest = quantization_of(gguf[-1].filename)
            files = {
                r.filename: r.size_bytes for r in gguf if quantization_of(r.filename) == newest
            }
            path = paths[first_file(variants_of(files)[0])]
            model_format = "gguf"
        else:
            path = str(Path(paths[done[0].filename]).parent)
            model_format = "safetensors"
        try:
            shape = load_shape(path)
        except EstimateError as err:
            log.warning("model %s downloaded but its metadata cannot be read: %s", model_id, err)
            return True  # nothing to point at, now or after
        catalog.set_model_path(
            self._db,
            model_id,
            model_path=path,
            format=model_format,
            config=default_config(shape, model_format),
        )
        return True


def statuses(db: Database, model_ids: Sequence[str]) -> list[DownloadRecord]:
    return downloads.for_models(db, model_ids)
