"""A box for downloads from a hostile Hub: a data dir whose model store already holds links
pointing outside it, a sibling tree outside the store (files, a part-named file, a link), a
Hugging Face cache; a snapshot of everything a download must not touch; and one download
attempt made as the service makes it (list the repo asked for, fetch each listed file into
the store or the cache, and each file as an older server may have queued it unchecked)."""

from __future__ import annotations

import hashlib
import os
import stat
from dataclasses import dataclass, field
from pathlib import Path

import pytest

from cohabit.hub import client
from cohabit.hub.client import HubFile
from cohabit.hub.errors import HubError

ASKED = "evil-org/model-GGUF"
COMMIT = "3b1f0a9e8d7c6b5a4f3e2d1c0b9a8f7e6d5c4b3a"
VICTIM = b"the user's own data"  # 19 bytes a listing names with its size and a wrong hash
# The folders a download may write in: the store, the asked repo's cache folder and the
# cache's lock folder. Everything else in the box is compared before and after.
ROOTS = ("data/models/", f"hf/hub/models--{ASKED.replace('/', '--')}/", "hf/hub/.locks/")
# Links planted in the store; they are compared too: never replaced, removed or followed.
PLANTED = (f"data/models/{ASKED}/victim.gguf", f"data/models/{ASKED}/linked")


def plant(box: Path) -> None:
    outside = box / "outside"
    (outside / "sub").mkdir(parents=True)
    (outside / "victim.bin").write_bytes(VICTIM)
    (outside / "state.part").write_bytes(b"a file named as a part is")
    (outside / "sub" / "keep.gguf").write_bytes(b"GGUF and more")
    (outside / "escape").symlink_to(outside / "victim.bin")
    (box / "data").mkdir()
    (box / "data" / "settings.txt").write_bytes(b"not the store's")
    repo = box / "data" / "models" / ASKED
    repo.mkdir(parents=True)
    (repo / "victim.gguf").symlink_to(outside / "victim.bin")
    (repo / "linked").symlink_to(outside / "sub", target_is_directory=True)
    (box / "hf" / "hub").mkdir(parents=True)


def snapshot(box: Path, *, skip: tuple[str, ...] = ()) -> dict[str, tuple[object, ...]]:
    """Every path outside the roots and `skip` (and each planted link) with what it is: a
    folder, a file and its bytes' hash, or a link and where it points."""
    seen: dict[str, tuple[object, ...]] = {}
    for folder, dirs, files in os.walk(box, followlinks=False):
        for name in dirs + files:
            path = Path(folder) / name
            relative = path.relative_to(box).as_posix()
            if (relative + "/").startswith(ROOTS + skip) and relative not in PLANTED:
                continue
            mode = os.lstat(path).st_mode
            if stat.S_ISLNK(mode):
                seen[relative] = ("link", os.readlink(path))
            elif stat.S_ISDIR(mode):
                seen[relative] = ("folder",)
            else:
                seen[relative] = ("file", hashlib.sha256(path.read_bytes()).hexdigest())
    return seen


@dataclass
class Attempt:
    """What one download attempt met: each refusal or failure (never another exception)."""

    listed: client.HubRepo | None = None
    errors: list[HubError] = field(default_factory=list)
    peak_bytes: int = 0

    def progress(self, done_bytes: int) -> None:
        self.peak_bytes = max(self.peak_bytes, done_bytes)


def download(
    box: Path, queued: tuple[HubFile, ...] = (), *, commit: str = COMMIT, to_cache: bool = False
) -> Attempt:
    """List the repo asked for and fetch its files as the service's worker does (its rows
    carry the listing's repo id and commit), then fetch `queued` files as given."""
    attempt = Attempt()
    try:
        attempt.listed = client.repo(ASKED, server=True)
    except HubError as err:
        attempt.errors.append(err)
    rows = (
        [(attempt.listed.repo_id, f, attempt.listed.commit or "main") for f in attempt.listed.files]
        if attempt.listed
        else []
    )
    rows += [(ASKED, f, commit) for f in queued]
    for repo_id, file, revision in rows:
        try:
            fetch(box, repo_id, file, revision=revision, to_cache=to_cache, attempt=attempt)
        except HubError as err:
            attempt.errors.append(err)
    return attempt


def fetch(
    box: Path, repo_id: str, file: HubFile, *, revision: str, to_cache: bool, attempt: Attempt
) -> Path:
    """One file, as service/registry/downloads.py's worker fetches a row."""
    return client.fetch(
        repo_id,
        file,
        revision=revision,
        store=None if to_cache else box / "data" / "models",
        progress=attempt.progress,
    )


def use_cache_of(box: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("HF_HUB_CACHE", str(box / "hf" / "hub"))
