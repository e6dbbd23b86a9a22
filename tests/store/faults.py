"""Databases that fail the way they do in production, for the fault tests: a
SQLite file on a small file system of its own (tmpfs) that fills up, so the kernel answers
ENOSPC and SQLite "database or disk is full"; and a PostgreSQL database switched to read-only
with its sessions ended, as a failover to a standby leaves it ("cannot execute … in a
read-only transaction"). Mounting needs root (CAP_SYS_ADMIN), which the tests run as. And
a SQLite file with a damaged page, and a database marked with a revision from a newer
cohabit."""

from __future__ import annotations

import errno
import sqlite3
import subprocess
import time
import uuid
from collections.abc import Iterator
from contextlib import contextmanager
from dataclasses import dataclass, field
from pathlib import Path

import pytest
from sqlalchemy import create_engine, text

from tests.store.databases import KINDS, fresh_database_url, postgres_server_url

FUTURE_REVISION = "from_the_future"
DISK_BYTES = 16 * 1024 * 1024  # room for the migrated schema and its write-ahead log
_PAGE = 4096


def damage_a_page(path: Path) -> None:
    """Overwrite the head of the downloads table's root page in the SQLite file at `path`
    (closed): a page no start of the server reads."""
    with sqlite3.connect(path) as connection:
        (root,) = connection.execute(
            "SELECT rootpage FROM sqlite_master WHERE name = 'downloads'"
        ).fetchone()
        (page_bytes,) = connection.execute("PRAGMA page_size").fetchone()
    with path.open("r+b") as file:
        file.seek((root - 1) * page_bytes)
        file.write(b"\xff" * 64)


def from_the_future(url: str) -> None:
    """Mark the migrated database at `url` as a newer cohabit would leave it."""
    engine = create_engine(url)
    with engine.begin() as connection:
        connection.execute(text(f"UPDATE alembic_version SET version_num = '{FUTURE_REVISION}'"))
    engine.dispose()


@contextmanager
def small_disk(path: Path, size_bytes: int = DISK_BYTES) -> Iterator[Path]:
    """A tmpfs of `size_bytes` mounted at `path` for the block; unmounted after it."""
    path.mkdir(parents=True, exist_ok=True)
    subprocess.run(
        ["mount", "-t", "tmpfs", "-o", f"size={size_bytes},mode=0700", "tmpfs", str(path)],
        check=True,
        capture_output=True,
    )
    try:
        yield path
    finally:
        subprocess.run(["umount", "--lazy", str(path)], check=True, capture_output=True)


def fill(disk: Path) -> Path:
    """Write a file on `disk` until the kernel says ENOSPC; returns it (remove it to free
    the space)."""
    filler = disk / f"filler-{uuid.uuid4().hex[:8]}"
    with filler.open("wb", buffering=0) as out:
        try:
            while True:
                out.write(b"\0" * _PAGE)
        except OSError as err:
            if err.errno != errno.ENOSPC:
                raise
    return filler


def checkpoint(database: Path) -> None:
    """Fold SQLite's write-ahead log into the file and empty it, so that the next commit has
    to grow it (on a full disk, it cannot). Retried while a reader holds the log."""
    with sqlite3.connect(database, timeout=60) as connection:
        for _ in range(600):
            busy, log_frames, _done = connection.execute(
                "PRAGMA wal_checkpoint(TRUNCATE)"
            ).fetchone()
            if not busy and log_frames == 0:
                return
    raise AssertionError(f"the write-ahead log of {database} could not be emptied")


@dataclass(kw_only=True)
class Unwritable:
    """A database `url` that `stop_writes()` turns into one that refuses writes, with the
    words the database then uses (`reason`), until `allow_writes()`."""

    kind: str
    url: str
    reason: str
    disk: Path | None = None
    fillers: list[Path] = field(default_factory=list)

    def stop_writes(self) -> None:
        if self.disk is not None:
            checkpoint(self.disk / "cohabit.db")
            self.fillers.append(fill(self.disk))
        else:
            self._postgres("SET default_transaction_read_only = on")

    def allow_writes(self) -> None:
        if self.disk is not None:
            while self.fillers:
                self.fillers.pop().unlink()
        else:
            self._postgres("RESET default_transaction_read_only")

    def _postgres(self, setting: str) -> None:
        """Change the database's setting and end its sessions, waiting until they are gone:
        the server's pool connects again (pool_pre_ping) and gets it, as after a failover."""
        import psycopg

        name = self.url.rpartition("/")[2]
        admin = postgres_server_url().replace("postgresql+psycopg://", "postgresql://", 1)
        with psycopg.connect(admin, autocommit=True) as connection:
            connection.execute(f'ALTER DATABASE "{name}" {setting}')
            # In the select list, not the WHERE clause: there the planner may call it on
            # every session of the server before the other conditions are checked.
            ended = [
                pid
                for pid, _ in connection.execute(
                    "SELECT pid, pg_terminate_backend(pid) FROM pg_stat_activity "
                    "WHERE datname = %s AND pid <> pg_backend_pid()",
                    (name,),
                )
            ]
            deadline = time.monotonic() + 60
            while connection.execute(
                "SELECT count(*) FROM pg_stat_activity WHERE pid = ANY(%s)", (ended,)
            ).fetchone() != (0,):
                assert time.monotonic() < deadline, f"sessions {ended} did not end"
                time.sleep(0.05)


@pytest.fixture(params=KINDS)
def unwritable(request: pytest.FixtureRequest, tmp_path: Path) -> Iterator[Unwritable]:
    """A fresh database of each kind that the test can stop from taking writes."""
    if request.param == "sqlite":
        with small_disk(tmp_path / "disk") as disk:
            yield Unwritable(
                kind="sqlite",
                url=f"sqlite:///{disk / 'cohabit.db'}",
                reason="database or disk is full",
                disk=disk,
            )
        return
    for url in fresh_database_url("postgresql", tmp_path):
        yield Unwritable(kind="postgresql", url=url, reason="read-only transaction")
