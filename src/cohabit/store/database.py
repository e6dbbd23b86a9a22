"""Opening the database: engine, sessions, SQLite's write lock, PostgreSQL's ledger lock and
the Alembic upgrade every start runs. The service holds one `Database` per process.

SQLite: WAL, a busy timeout, and `BEGIN IMMEDIATE` for every writing transaction, so that two
processes never both read the ledger, then both write it. PostgreSQL: writers that touch the
ledger lock the node rows first (`lock_ledger`).
"""

from __future__ import annotations

from collections.abc import Iterator
from contextlib import contextmanager
from datetime import UTC, datetime
from pathlib import Path
from typing import Any

from alembic import command
from alembic.config import Config
from sqlalchemy import create_engine, event, select, text
from sqlalchemy.engine import Engine, Result
from sqlalchemy.exc import SQLAlchemyError
from sqlalchemy.orm import Session

from cohabit.store.errors import DatabaseUnavailable
from cohabit.store.tables import NodeRow

MIGRATIONS = Path(__file__).parent / "migrations"
SQLITE_BUSY_TIMEOUT_MS = 60_000
_MIGRATION_LOCK_KEY = 0x636F6861  # "coha": one advisory lock id for schema upgrades


def sqlite_url(data_dir: Path) -> str:
    """The default database: a SQLite file in the data directory."""
    return f"sqlite:///{data_dir / 'cohabit.db'}"


def affected(result: Result[Any]) -> int:
    """Rows an UPDATE or DELETE touched (guarded updates read this to know who won)."""
    return int(getattr(result, "rowcount", 0) or 0)


def utcnow() -> datetime:
    return datetime.now(UTC)


def aware(moment: datetime | None) -> datetime | None:
    """SQLite hands timestamps back without a zone; every timestamp we write is UTC."""
    if moment is None or moment.tzinfo is not None:
        return moment
    return moment.replace(tzinfo=UTC)


class Database:
    """An engine plus the two kinds of transaction the repositories use."""

    def __init__(self, url: str) -> None:
        self.url = url
        self.is_sqlite = url.startswith("sqlite")
        try:
            if self.is_sqlite:
                self.engine = create_engine(
                    url, connect_args={"check_same_thread": False, "timeout": 60}
                )
                _sqlite_setup(self.engine)
            else:
                self.engine = create_engine(url, pool_pre_ping=True, pool_size=10)
        except (SQLAlchemyError, ImportError, ValueError) as err:
            raise DatabaseUnavailable(f"cannot open database {_safe(url)}: {err}") from None
        self._writer = self.engine.execution_options(cohabit_write=True)

    @contextmanager
    def read(self) -> Iterator[Session]:
        with Session(self.engine, expire_on_commit=False) as session, session.begin():
            yield session

    @contextmanager
    def write(self) -> Iterator[Session]:
        """A transaction that may write; on SQLite it holds the database's write lock from its
        first statement (BEGIN IMMEDIATE) to commit."""
        with Session(self._writer, expire_on_commit=False) as session, session.begin():
            yield session

    def lock_ledger(self, session: Session) -> None:
        """Serialize ledger writers: re-check capacity and insert reservations under this lock.
        SQLite's BEGIN IMMEDIATE already holds the only write lock there is."""
        if not self.is_sqlite:
            session.execute(select(NodeRow.name).order_by(NodeRow.name).with_for_update())

    def migrate(self) -> None:
        """Bring the schema to the newest migration; safe when several processes start at once."""
        config = Config()
        config.set_main_option("script_location", str(MIGRATIONS))
        try:
            with self._writer.begin() as connection:
                if not self.is_sqlite:
                    connection.execute(
                        text("SELECT pg_advisory_xact_lock(:key)"), {"key": _MIGRATION_LOCK_KEY}
                    )
                config.attributes["connection"] = connection
                command.upgrade(config, "head")
        except SQLAlchemyError as err:
            raise DatabaseUnavailable(
                f"cannot bring database {_safe(self.url)} up to date: {err}"
            ) from None

    def ping(self) -> bool:
        try:
            with self.engine.connect() as connection:
                connection.execute(text("SELECT 1"))
        except SQLAlchemyError:
            return False
        return True

    def dispose(self) -> None:
        self.engine.dispose()


def _sqlite_setup(engine: Engine) -> None:
    """The SQLAlchemy recipe for real transactions on pysqlite: turn off the driver's own
    BEGIN and emit ours, IMMEDIATE for writers."""

    @event.listens_for(engine, "connect")
    def _connect(dbapi_connection: Any, _record: Any) -> None:
        dbapi_connection.isolation_level = None
        cursor = dbapi_connection.cursor()
        cursor.execute("PRAGMA journal_mode=WAL")
        cursor.execute(f"PRAGMA busy_timeout={SQLITE_BUSY_TIMEOUT_MS}")
        cursor.execute("PRAGMA foreign_keys=ON")
        cursor.execute("PRAGMA synchronous=NORMAL")
        cursor.close()

    @event.listens_for(engine, "begin")
    def _begin(connection: Any) -> None:
        immediate = connection.get_execution_options().get("cohabit_write", False)
        connection.exec_driver_sql("BEGIN IMMEDIATE" if immediate else "BEGIN")


def _safe(url: str) -> str:
    """The URL without its password, for messages."""
    head, sep, tail = url.partition("@")
    if not sep or "://" not in head:
        return url
    scheme, _, userinfo = head.partition("://")
    return f"{scheme}://{userinfo.split(':')[0]}:***@{tail}"
