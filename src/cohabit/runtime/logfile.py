"""Per-deployment engine log files: rotation and reading the tail.

The engine writes straight into its log (opened for append), so the log outlives the control
plane and an adopted engine keeps logging. Rotation is therefore copy-then-truncate, as
logrotate's copytruncate does: the engine's append offset follows the truncation. The spawner
rotates at every start (a run's failure is read from its own lines only) and whenever a log
outgrows its size limit.
"""

from __future__ import annotations

import shutil
from collections import deque
from pathlib import Path

DEFAULT_MAX_BYTES = 10 * 1024 * 1024
DEFAULT_BACKUPS = 3
_READ_LIMIT_BYTES = 4 * 1024 * 1024  # a tail never needs more than the last few MiB


def backup_path(path: Path, number: int) -> Path:
    return path.with_name(f"{path.name}.{number}")


def rotate(path: Path, *, backups: int = DEFAULT_BACKUPS) -> None:
    """Shift engine.log.N up by one (dropping the oldest), copy engine.log to .1, truncate."""
    if not path.exists() or path.stat().st_size == 0:
        return
    for number in range(backups - 1, 0, -1):
        older = backup_path(path, number)
        if older.exists():
            older.replace(backup_path(path, number + 1))
    if backups > 0:
        shutil.copyfile(path, backup_path(path, 1))
    with path.open("r+b") as handle:
        handle.truncate(0)


def rotate_if_large(path: Path, *, max_bytes: int, backups: int = DEFAULT_BACKUPS) -> bool:
    """Rotate when the log is over `max_bytes`; True when it did."""
    try:
        size = path.stat().st_size
    except FileNotFoundError:
        return False
    if size <= max_bytes:
        return False
    rotate(path, backups=backups)
    return True


def _read_tail(path: Path) -> list[str]:
    try:
        with path.open("rb") as handle:
            handle.seek(0, 2)
            size = handle.tell()
            handle.seek(max(0, size - _READ_LIMIT_BYTES))
            data = handle.read()
    except FileNotFoundError:
        return []
    return data.decode("utf-8", errors="replace").splitlines()


def tail(path: Path, lines: int, *, previous: bool = True) -> list[str]:
    """The last `lines` lines of the log; with `previous`, reaching into engine.log.1 when the
    current file holds fewer (after a rotation). Failure classification passes False: a run
    is judged by its own lines."""
    if lines <= 0:
        return []
    found: deque[str] = deque(_read_tail(path), maxlen=lines)
    if previous and len(found) < lines:
        older = _read_tail(backup_path(path, 1))
        need = lines - len(found)
        found.extendleft(reversed(older[-need:]) if need else [])
    return list(found)
