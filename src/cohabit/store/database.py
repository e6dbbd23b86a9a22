"""Opening the database: engine, sessions, SQLite's write lock, PostgreSQL's ledger lock and
the check and Alembic upgrade every start runs. The service holds one `Database` per process.
A fault of the database's own (disk full, read-only, locked, unreachable, damaged) leaves a
session as `DatabaseUnavailable`, and a failed write is what `health()` reports until a
write succeeds again.

SQLite: WAL, a busy timeout, and `BEGIN IMMEDIATE` for every writing transaction, so that two
processes never both read the ledger, then both write it. PostgreSQL: writers that touch the
ledger lock the node rows first (`lock_ledger`).
"""

from __future__ import annotations

import threading
import weakref
from collections.abc import Iterator
from contextlib import contextmanager
from dataclasses import dataclass
from datetime import UTC, datetime
from pathlib import Path
from typing import Any

from alembic import command
from alembic.config import Config
from alembic.runtime.migration import MigrationContext
from alembic.script import ScriptDirectory
from sqlalchemy import Connection, create_engine, event, select, text
from sqlalchemy.engine import Engine, Result
from sqlalchemy.exc import DBAPIError, OperationalError, SQLAlchemyError
from sqlalchemy.orm import Session

from cohabit import __version__
from cohabit.store.errors import DatabaseUnavailable
from cohabit.store.tables import NodeRow

MIGRATIONS = Path(__file__).parent / "migrations"
SQLITE_BUSY_TIMEOUT_MS = 60_000
_MIGRATION_LOCK_KEY = 0x636F6861  # "coha": one advisory lock id for schema upgrades
# What the database answers when the fault is its own, not the statement's or the request's
# (a constraint, a value, a missing table, a bug: those leave a session as they are). SQLite's
# result codes (sqlite.org/rescode.html; the extended ones start with these): disk full,
# read-only, locked out, I/O, damaged, not a database, cannot open, no memory.
_SQLITE_FAULTS = frozenset(
    {
        "SQLITE_FULL",
        "SQLITE_READONLY",
        "SQLITE_BUSY",
        "SQLITE_LOCKED",
        "SQLITE_IOERR",
        "SQLITE_CORRUPT",
        "SQLITE_NOTADB",
        "SQLITE_CANTOPEN",
        "SQLITE_PERM",
        "SQLITE_NOMEM",
        "SQLITE_PROTOCOL",
    }
)
# PostgreSQL's SQLSTATEs (postgresql.org/docs/current/errcodes-appendix.html): connection (08),
# read-only transaction (25006), rollbacks to retry (40), insufficient resources such as a
# full disk (53), lock not available (55P03), operator intervention such as a shutdown (57),
# system and internal errors (58, XX).
_POSTGRES_FAULTS = ("08", "25006", "40", "53", "55P03", "57", "58", "XX")
_CHANGES = ("INSERT", "UPDATE", "DELETE")
_QUICK_CHECK_LINES = 3  # of PRAGMA quick_check's report, in the message


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


@dataclass(frozen=True, slots=True, kw_only=True)
class DatabaseHealth:
    """The database as `/serving/health` shows it: "ok"; "failing" while the last write that
    failed has had no successful one after it (`reason`: the database's words, `since`: the
    first of those failures); "unavailable" when it cannot be reached at all."""

    status: str
    reason: str | None = None
    since: datetime | None = None


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
        # Once disposed, a connection given back late (by a thread that was still in a
        # transaction) is closed at once rather than left in the discarded pool for the
        # collector (on PostgreSQL a warning, and a server session held open until then).
        self._disposed = threading.Event()
        _close_when_disposed(self.engine, self._disposed)
        # Let go without `dispose()`, it still closes its pooled connections when collected.
        weakref.finalize(self, _dispose, self.engine, self._disposed)
        self._writer = self.engine.execution_options(cohabit_write=True)
        self.where = (self.engine.url.database or url) if self.is_sqlite else _safe(url)
        self._write_fault: tuple[str, datetime] | None = None  # (reason, since)
        # Whether this thread's current write changed a row: only such a commit shows that
        # the database takes writes again (on a full disk SQLite commits a transaction that
        # changed nothing).
        self._changed = threading.local()
        _note_changes(self.engine, self._changed)

    @contextmanager
    def read(self) -> Iterator[Session]:
        """A transaction that reads. Raises DatabaseUnavailable for a fault of the database's."""
        try:
            with Session(self.engine, expire_on_commit=False) as session, session.begin():
                yield session
        except DBAPIError as err:
            if not _is_fault(err):
                raise
            raise DatabaseUnavailable(f"cannot read database {self.where}: {_reason(err)}") from err

    @contextmanager
    def write(self) -> Iterator[Session]:
        """A transaction that may write; on SQLite it holds the database's write lock from its
        first statement (BEGIN IMMEDIATE) to commit. Raises DatabaseUnavailable for a fault of
        the database's, and keeps it for `health()` until a write changes a row again."""
        self._changed.rows = False
        try:
            with Session(self._writer, expire_on_commit=False) as session, session.begin():
                yield session
        except DBAPIError as err:
            if not _is_fault(err):
                raise
            reason = _reason(err)
            fault = self._write_fault
            self._write_fault = (reason, utcnow() if fault is None else fault[1])
            raise DatabaseUnavailable(f"cannot write to database {self.where}: {reason}") from err
        if self._changed.rows:
            self._write_fault = None

    def lock_ledger(self, session: Session) -> None:
        """Serialize ledger writers: re-check capacity and insert reservations under this lock.
        SQLite's BEGIN IMMEDIATE already holds the only write lock there is."""
        if not self.is_sqlite:
            session.execute(select(NodeRow.name).order_by(NodeRow.name).with_for_update())

    def migrate(self) -> None:
        """Check a SQLite file for damage (`check`), then bring the schema to the newest
        migration; safe when several processes start at once. A database whose revision this
        code does not know (a newer cohabit wrote it) is refused, untouched."""
        self.check()
        config = Config()
        config.set_main_option("script_location", str(MIGRATIONS))
        try:
            with (
                self._writer.connect() as connection,
                _sqlite_keys_off(connection),
                connection.begin(),
            ):
                if not self.is_sqlite:
                    connection.execute(
                        text("SELECT pg_advisory_xact_lock(:key)"), {"key": _MIGRATION_LOCK_KEY}
                    )
                self._refuse_newer(connection, ScriptDirectory.from_config(config))
                config.attributes["connection"] = connection
                command.upgrade(config, "head")
                if self.is_sqlite:
                    _refuse_dangling(connection)
        except SQLAlchemyError as err:
            raise DatabaseUnavailable(
                f"cannot bring database {self.where} up to date: {_reason(err)}"
            ) from None

    def check(self) -> None:
        """SQLite's `PRAGMA quick_check`: every page of the file read once (milliseconds for
        a catalog's worth of rows), so a damaged file is refused at start, not found by the
        first request that reads the bad page. PostgreSQL checks its own pages."""
        if not self.is_sqlite:
            return
        try:
            with self.engine.connect() as connection:
                report = [str(row[0]) for row in connection.exec_driver_sql("PRAGMA quick_check")]
        except OperationalError as err:  # no such folder, no permission: not damage
            raise DatabaseUnavailable(
                f"cannot open database {self.where}: {_reason(err)}"
            ) from None
        except DBAPIError as err:  # not a database at all, or its first page damaged
            report = [_reason(err)]
        if report != ["ok"]:
            problems = "; ".join(line.strip() for line in report[:_QUICK_CHECK_LINES])
            raise DatabaseUnavailable(
                f"database file {self.where} is damaged ({problems}): restore it from a "
                "backup, or move it aside to start with an empty database"
            )

    def _refuse_newer(self, connection: Connection, script: ScriptDirectory) -> None:
        known = {revision.revision for revision in script.walk_revisions()}
        stored = MigrationContext.configure(connection).get_current_heads()
        unknown = sorted(set(stored) - known)
        if unknown:
            raise DatabaseUnavailable(
                f"database {self.where} was written by a newer cohabit: its schema revision "
                f"{unknown[0]!r} is not one cohabit {__version__} knows (the newest here is "
                f"{script.get_current_head()!r}); run a cohabit at least as new as the one "
                "that wrote it, or give this one another database"
            )

    def health(self) -> DatabaseHealth:
        """`unavailable` when a connection cannot run `SELECT 1`, else `failing` while a
        failed write has no successful one after it, else `ok`."""
        try:
            with self.engine.connect() as connection:
                connection.execute(text("SELECT 1"))
        except SQLAlchemyError as err:
            return DatabaseHealth(status="unavailable", reason=_reason(err))
        fault = self._write_fault
        if fault is not None:
            return DatabaseHealth(status="failing", reason=fault[0], since=fault[1])
        return DatabaseHealth(status="ok")

    def dispose(self) -> None:
        _dispose(self.engine, self._disposed)


def _dispose(engine: Engine, disposed: threading.Event) -> None:
    disposed.set()
    engine.dispose()


def _close_when_disposed(engine: Engine, disposed: threading.Event) -> None:
    """Close a connection checked in after `dispose()`: the pool it goes back to is the one
    `dispose()` emptied and let go, which would never close it."""

    @event.listens_for(engine, "checkin")
    def _checkin(dbapi_connection: Any, _record: Any) -> None:
        if disposed.is_set() and dbapi_connection is not None:
            dbapi_connection.close()


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


@contextmanager
def _sqlite_keys_off(connection: Connection) -> Iterator[None]:
    """SQLite's foreign keys off while a migration runs, as Alembic's batch mode asks: it
    rebuilds a table by copying it and dropping the old one, and with the keys on that drop
    deletes the rows that point at it by cascade (a deployment's events) or fails on those
    that cannot go (its reservations). The pragma is ignored inside a transaction, so it is
    sent on the driver's connection before the migration's begins."""
    driver = connection.connection.dbapi_connection
    if connection.dialect.name != "sqlite" or driver is None:
        yield
        return
    driver.execute("PRAGMA foreign_keys=OFF")
    try:
        yield
    finally:
        driver.execute("PRAGMA foreign_keys=ON")


def _refuse_dangling(connection: Connection) -> None:
    """With the keys off, what the migrations left is checked before it is committed."""
    dangling = connection.exec_driver_sql("PRAGMA foreign_key_check").all()
    if dangling:
        table, rowid, parent, _key = dangling[0]
        raise DatabaseUnavailable(
            f"the schema upgrade would leave {len(dangling)} row(s) pointing at nothing (the "
            f"first: {table} row {rowid}, in {parent}); nothing was changed"
        )


def _note_changes(engine: Engine, changed: threading.local) -> None:
    """Mark this thread's write as having changed a row once an INSERT, UPDATE or DELETE
    touched one (a rowcount of -1 is the driver not knowing: counted)."""

    @event.listens_for(engine, "after_cursor_execute")
    def _after(
        _connection: Any, cursor: Any, statement: str, _params: Any, _context: Any, _many: bool
    ) -> None:
        if cursor.rowcount != 0 and statement.lstrip()[:6].upper() in _CHANGES:
            changed.rows = True


def _is_fault(err: DBAPIError) -> bool:
    """Whether the database failed the statement for a reason of its own (above)."""
    original = err.orig
    sqlite_code = getattr(original, "sqlite_errorname", None)
    if sqlite_code is not None:
        return "_".join(str(sqlite_code).split("_")[:2]) in _SQLITE_FAULTS
    sqlstate = getattr(original, "sqlstate", None)
    if sqlstate is not None:
        return str(sqlstate).startswith(_POSTGRES_FAULTS)
    # No code at all: the driver could not reach the server (or its connection broke).
    return err.connection_invalidated or isinstance(err, OperationalError)


def _reason(err: SQLAlchemyError) -> str:
    """The driver's own words (`database or disk is full`), without SQLAlchemy's SQL, its
    parameters and its link: one line."""
    original = getattr(err, "orig", None) or err
    lines = str(original).strip().splitlines()
    return lines[0] if lines else type(original).__name__


def _safe(url: str) -> str:
    """The URL without its password, for messages."""
    head, sep, tail = url.partition("@")
    if not sep or "://" not in head:
        return url
    scheme, _, userinfo = head.partition("://")
    return f"{scheme}://{userinfo.split(':')[0]}:***@{tail}"
