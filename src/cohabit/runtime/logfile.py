"""Per-deployment engine log files: writing within a size cap, rotation and reading the tail.

An engine never writes its log itself: its output goes through a pipe to its log writer
(`runtime/logwriter.py`), the one process that appends to `engine.log`, through
`CappedLog`, which rotates before any write would take the file past its cap. So the log
files together never hold more than (backups + 1) × max_bytes, however fast the engine
writes. The spawner also rotates at every start, before that run's writer opens the file
(a run's failure is read from its own lines only).
"""

from __future__ import annotations

import contextlib
import os
from collections import deque
from pathlib import Path

DEFAULT_MAX_BYTES = 10 * 1024 * 1024
DEFAULT_BACKUPS = 3
_READ_LIMIT_BYTES = 4 * 1024 * 1024  # a tail never needs more than the last few MiB


def backup_path(path: Path, number: int) -> Path:
    return path.with_name(f"{path.name}.{number}")


def rotate(path: Path, *, backups: int = DEFAULT_BACKUPS) -> None:
    """Shift engine.log.N up by one (dropping the oldest) and move engine.log to .1; the next
    write starts a new engine.log. Only the log's one writer (or the spawner, before a run's
    writer starts) may call this: a process still appending to the old file would go on
    writing into the backup."""
    if not path.exists() or path.stat().st_size == 0:
        return
    for number in range(backups - 1, 0, -1):
        older = backup_path(path, number)
        if older.exists():
            older.replace(backup_path(path, number + 1))
    if backups > 0:
        path.replace(backup_path(path, 1))
    else:
        path.unlink()


class CappedLog:
    """Appends to a log file that never grows past `max_bytes`: a write that would take it
    past is cut at the last line end that fits, the file rotated and the rest written to the
    new one (a line longer than a whole file is split). Lines therefore stay whole across
    rotations, and each file holds at most `max_bytes`.

    A write that fails (disk full, the folder removed) loses that data and the file is
    opened again on the next write: an engine's output is never held back for its log.
    """

    def __init__(self, path: Path, *, max_bytes: int, backups: int) -> None:
        if max_bytes < 1 or backups < 0:
            raise ValueError(f"log cap of {max_bytes} bytes and {backups} backups is not one")
        self.path = path
        self.max_bytes = max_bytes
        self.backups = backups
        self._fd: int | None = None
        self._size = 0

    def write(self, data: bytes) -> None:
        while data:
            fd = self._fd if self._fd is not None else self._open()
            if fd is None:
                return
            room = self.max_bytes - self._size
            if len(data) <= room:
                take = len(data)
            else:
                take = data.rfind(b"\n", 0, room) + 1
                if take == 0 and self._size == 0:
                    take = room  # one line longer than a whole file
            if take and not self._append(fd, data[:take]):
                return
            data = data[take:]
            if data and self._rotate() is None:
                return

    def close(self) -> None:
        if self._fd is not None:
            with contextlib.suppress(OSError):
                os.close(self._fd)
            self._fd = None

    def _open(self) -> int | None:
        """The file opened for appending (rotated first when it is already over the cap: one
        written under a larger cap); None when it cannot be."""
        try:
            self._fd = os.open(self.path, os.O_WRONLY | os.O_APPEND | os.O_CREAT, 0o644)
            self._size = os.fstat(self._fd).st_size
        except OSError:
            self.close()
            return None
        return self._fd if self._size <= self.max_bytes else self._rotate()

    def _append(self, fd: int, data: bytes) -> bool:
        view = memoryview(data)
        try:
            while view:
                written = os.write(fd, view)
                self._size += written
                view = view[written:]
        except OSError:
            self.close()
            return False
        return True

    def _rotate(self) -> int | None:
        """Rotate and open the new file; None when either fails."""
        self.close()
        try:
            rotate(self.path, backups=self.backups)
            self._fd = os.open(self.path, os.O_WRONLY | os.O_APPEND | os.O_CREAT, 0o644)
            self._size = os.fstat(self._fd).st_size
        except OSError:
            self.close()
            return None
        return self._fd


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
