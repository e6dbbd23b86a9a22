"""What the Hub answers, checked before any of it reaches a path or a disk: a listing's commit,
file names, sizes and hashes, and repo ids as users write them. Pure; client.py calls it where
it reads a listing and again before it fetches a file (rows queued earlier are checked too).
"""

from __future__ import annotations

import re
import unicodedata

from cohabit.hub.errors import BadRepoId, Refused

# Twenty times the Hub's limit of 50 GB per file (huggingface.co/docs/hub/storage-limits): a
# larger size is no file the Hub holds, and would only size a sparse header file absurdly.
MAX_FILE_BYTES = 2**40
_SEGMENT_BYTES = 255  # NAME_MAX of Linux file systems: a longer segment cannot be created
_NAME_BYTES = 1024
_COMMIT = re.compile(r"[0-9a-f]{40}")
_SHA256 = re.compile(r"[0-9a-f]{64}")
_SHA1 = _COMMIT


def repo_id(text: str) -> str:
    """`org/name` or `name` as the Hub allows it (huggingface_hub utils/_validators.py
    `validate_repo_id`: word characters, `-`, `_`, `.`, starting and ending with a word
    character, no `--` or `..`); so it names at most two folders, neither hidden nor `..`."""
    from huggingface_hub.utils._validators import validate_repo_id

    try:
        validate_repo_id(text)
    except ValueError:
        raise BadRepoId(
            f"{_show(text)} is not a Hub repo id (org/name: letters, digits, '-', '_' or '.', "
            "starting and ending with a letter or digit, no '--' or '..')"
        ) from None
    for part in text.split("/"):
        if len(part.encode()) > _SEGMENT_BYTES:
            raise BadRepoId(f"{_show(text)} is not a Hub repo id: a part is over 255 bytes")
    return text


def commit(value: object, *, field: str = "sha") -> str:
    """A commit id as the Hub writes it: 40 lower-case hex digits."""
    if not isinstance(value, str) or not _COMMIT.fullmatch(value):
        raise Refused(field, f"{_show(value)} is not a commit id (40 hex digits)")
    return value


def file_name(value: object, *, field: str) -> str:
    """A listed file name, to be joined below the repo's folder: a relative POSIX path of
    non-empty segments, none `.` or `..`, no backslash, no control character (NUL among
    them), each segment a name a file system can hold."""
    if not isinstance(value, str) or not value:
        raise Refused(field, f"{_show(value)} is not a file name")
    problem = _name_problem(value)
    if problem is not None:
        raise Refused(
            field, f"{_show(value)} {problem}; a file name must stay inside the repo's folder"
        )
    return value


def size_bytes(value: object, *, field: str) -> int:
    if type(value) is not int or not 0 <= value <= MAX_FILE_BYTES:
        raise Refused(field, f"{_show(value)} is not a file size (0 to 2**40 bytes)")
    return value


def sha256(value: object, *, field: str) -> str | None:
    if value is None:
        return None
    if not isinstance(value, str) or not _SHA256.fullmatch(value):
        raise Refused(field, f"{_show(value)} is not a sha256 (64 lower-case hex digits)")
    return value


def blob_id(value: object, *, field: str) -> str | None:
    if value is None:
        return None
    if not isinstance(value, str) or not _SHA1.fullmatch(value):
        raise Refused(field, f"{_show(value)} is not a git blob id (40 lower-case hex digits)")
    return value


def _name_problem(name: str) -> str | None:
    if name.startswith("/"):
        return "is absolute"
    if "\\" in name:
        return "holds a backslash"
    # Cc: NUL, the C0 and C1 controls and DEL; Cs: a lone surrogate JSON can carry and no
    # file system name can hold.
    odd = next((c for c in name if unicodedata.category(c) in ("Cc", "Cs")), None)
    if odd is not None:
        return f"holds the control character {odd!r}"
    if len(name.encode()) > _NAME_BYTES:
        return f"is over {_NAME_BYTES} bytes"
    for segment in name.split("/"):
        if not segment:
            return "has an empty segment ('//' or a trailing '/')"
        if segment in (".", ".."):
            return f"has a {segment!r} segment"
        if len(segment.encode()) > _SEGMENT_BYTES:
            return f"has a segment over {_SEGMENT_BYTES} bytes"
    return None


def _show(value: object) -> str:
    """The value as a message shows it: repr (control characters escaped), cut short."""
    text = repr(value)
    return text if len(text) <= 80 else text[:77] + "..."
