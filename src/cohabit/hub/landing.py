"""Where a file from the Hub lands on disk, confined below one root (the model store, or a repo's
folder in the Hugging Face cache): folders made without following a link, parts under names of
our own, bytes written up to the listed size and never past it, and nothing removed but our
own parts. Used by client.py; every name joined here was checked by answers.py first."""

from __future__ import annotations

import hashlib
import os
import stat
from collections.abc import Callable, Iterable
from pathlib import Path
from typing import Any

from cohabit.hub.errors import FileDamaged, Refused

_CHUNK_BYTES = 8 * 1024 * 1024

Progress = Callable[[int], None]  # bytes of the file on disk so far; may raise Cancelled


def folder(root: Path, relative: str, *, what: str) -> Path:
    """`root/relative` as a folder, made where missing. The root is the owner's to place (a
    data dir may well be a link); below it no link is followed and nothing else is taken
    for a folder."""
    root.mkdir(parents=True, exist_ok=True)
    path = root
    for segment in relative.split("/") if relative else ():
        path = path / segment
        try:
            os.mkdir(path)
        except FileExistsError:
            mode = os.lstat(path).st_mode
            if stat.S_ISLNK(mode):
                raise Refused(what, f"{path} is a symbolic link; it is not followed") from None
            if not stat.S_ISDIR(mode):
                raise Refused(what, f"{path} is in the way (not a folder)") from None
    return path


def regular_file(path: Path, *, what: str) -> bool:
    """Whether a plain file is at `path` (never read through a link); a link or a folder in
    its place is refused, not replaced."""
    try:
        mode = os.lstat(path).st_mode
    except FileNotFoundError:
        return False
    if stat.S_ISLNK(mode):
        raise Refused(what, f"{path} is a symbolic link; it is not followed or replaced")
    if not stat.S_ISREG(mode):
        raise Refused(what, f"{path} is in the way (not a plain file)")
    return True


def part_name(*identity: str) -> str:
    """A part's file name: a digest of what names the file (repo, name, hash, size), so an
    interrupted download finds its part again and no header or listed name is ever in it."""
    return hashlib.sha256("\0".join(identity).encode()).hexdigest() + ".part"


def write_part(
    part: Path,
    chunks: Iterable[bytes],
    *,
    start_bytes: int,
    size_bytes: int,
    name: str,
    progress: Progress,
) -> None:
    """Append `chunks` to `part` from `start_bytes` (0: a fresh part), stopping at the listed
    `size_bytes`: a body that runs past it fails the file and its part is removed."""
    flags = os.O_WRONLY | os.O_CREAT | os.O_NOFOLLOW | (os.O_APPEND if start_bytes else os.O_TRUNC)
    done = start_bytes
    progress(done)
    with os.fdopen(os.open(part, flags, 0o644), "wb") as out:
        for chunk in chunks:
            if len(chunk) > size_bytes - done:
                out.close()
                discard(part)
                raise FileDamaged(
                    name, f"the Hub sent more than the {size_bytes} bytes it lists; stopped there"
                )
            out.write(chunk)
            done += len(chunk)
            progress(done)


def verify(
    path: Path, *, name: str, size_bytes: int, sha256: str | None, blob_id: str | None
) -> None:
    """The size and the hash the Hub published: the LFS sha256 or, for small files, the git
    blob sha1 (`sha1("blob <size>\\0" + content)`). Raises FileDamaged; removes nothing."""
    size = os.lstat(path).st_size
    if size != size_bytes:
        raise FileDamaged(name, f"{size} bytes on disk, the Hub lists {size_bytes}")
    if sha256:
        digest = _digest(path, hashlib.sha256())
        if digest != sha256:
            raise FileDamaged(name, f"sha256 {digest} does not match the Hub's {sha256}")
    elif blob_id:
        digest = _digest(path, hashlib.sha1(f"blob {size}\0".encode(), usedforsecurity=False))
        if digest != blob_id:
            raise FileDamaged(name, f"git blob sha1 {digest} does not match the Hub's {blob_id}")


def discard(part: Path) -> None:
    """Remove one of our parts (never a link's target: unlink removes the link itself)."""
    part.unlink(missing_ok=True)


def _digest(path: Path, hasher: Any) -> str:
    with os.fdopen(os.open(path, os.O_RDONLY | os.O_NOFOLLOW), "rb") as handle:
        while chunk := handle.read(_CHUNK_BYTES):
            hasher.update(chunk)
    return str(hasher.hexdigest())
