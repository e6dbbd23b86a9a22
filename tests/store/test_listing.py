"""The reads that run per request, on SQLite and PostgreSQL: a page of deployments (active
first, then ended newest first; with each record's revision: test_revision.py), the
deployments serving a name, and the ended ones past a moment. On SQLite the query plans of
these reads are checked too: each reaches the deployments table through an index, never by
scanning every record."""

from __future__ import annotations

import importlib.util
from collections.abc import Callable, Iterator
from datetime import timedelta
from pathlib import Path
from typing import Any

import pytest
from sqlalchemy import event, select, text

from cohabit.store import deployments
from cohabit.store.database import MIGRATIONS, Database, utcnow
from cohabit.store.records import ACTIVE, DeploymentFailure, DeploymentStatus
from cohabit.store.tables import ACTIVE_PREDICATE, DeploymentRow
from cohabit.units import GIB
from tests.store.helpers import add_deployment, add_model

S = DeploymentStatus


@pytest.fixture
def db(database_url: str) -> Iterator[Database]:
    database = Database(database_url)
    database.migrate()
    yield database
    database.dispose()


def history(db: Database, ended: int, live: int) -> tuple[list[str], list[str]]:
    """`ended` STOPPED deployments, then `live` REQUESTED ones; ids oldest first."""
    model = add_model(db)
    stopped = [add_deployment(db, model, GIB).id for _ in range(ended)]
    for deployment_id in stopped:
        deployments.end(db, deployment_id)
    active = [add_deployment(db, model, GIB).id for _ in range(live)]
    return stopped, active


def test_a_page_is_the_active_then_the_ended_newest_first(db: Database) -> None:
    stopped, active = history(db, ended=12, live=3)
    order = active + stopped[::-1]
    assert [r.id for r in deployments.page(db, limit=100)] == order
    for offset in range(len(order) + 1):
        assert [r.id for r in deployments.page(db, limit=4, offset=offset)] == order[
            offset : offset + 4
        ]
    revisions = deployments.page_revisions(db, limit=5, offset=2)
    assert [entry.id for entry in revisions] == order[2:7]
    assert [r.id for r in deployments.list_active(db)] == active


def test_serving_names_the_active_deployments_of_a_name_or_id(db: Database) -> None:
    stopped, (live,) = history(db, ended=5, live=1)
    assert [r.id for r in deployments.serving(db, "tiny")] == [live]
    assert [r.id for r in deployments.serving(db, live)] == [live]
    assert deployments.serving(db, stopped[0]) == []
    assert deployments.serving(db, "nobody") == []
    assert deployments.names(db, [live, stopped[0]]) == {
        live: ("tiny", S.REQUESTED, live, 0),
        stopped[0]: ("tiny", S.STOPPED, stopped[0], 0),
    }


def test_ended_before_counts_the_end_and_never_the_active(db: Database) -> None:
    stopped, active = history(db, ended=3, live=2)
    failed = add_deployment(db, add_model(db, "other"), GIB).id
    an_hour_ago = utcnow() - timedelta(hours=1)
    deployments.end(
        db,
        failed,
        failure=DeploymentFailure(status=S.FAILED, code="OOM", message="oom", at=an_hour_ago),
    )
    assert deployments.ended_before(db, utcnow() - timedelta(minutes=30), limit=10) == []
    later = utcnow() + timedelta(seconds=1)
    assert sorted(deployments.ended_before(db, later, limit=10)) == sorted([*stopped, failed])
    assert len(deployments.ended_before(db, later, limit=2)) == 2
    assert deployments.delete_ended(db, [*active, stopped[0]]) == 1  # active ones stay
    assert {r.id for r in deployments.list_active(db)} == set(active)


# --- query plans (SQLite) ---------------------------------------------------------------


def plans(db: Database, read: Callable[[], object]) -> list[tuple[str, list[str]]]:
    """Each SELECT `read` runs, with SQLite's plan for it."""
    statements: list[tuple[str, Any]] = []

    def capture(_conn: Any, _cursor: Any, statement: str, parameters: Any, *_: Any) -> None:
        statements.append((statement, parameters))

    event.listen(db.engine, "before_cursor_execute", capture)
    try:
        read()
    finally:
        event.remove(db.engine, "before_cursor_execute", capture)
    found = []
    with db.engine.connect() as connection:
        for statement, parameters in statements:
            if statement.lstrip().upper().startswith("SELECT"):
                plan = connection.exec_driver_sql(f"EXPLAIN QUERY PLAN {statement}", parameters)
                found.append((statement, [row[-1] for row in plan]))
    return found


def unbounded_scans(db: Database, read: Callable[[], object]) -> list[str]:
    """Plan lines that visit every deployment: a SCAN of the table, or of an index in a
    statement that has no LIMIT to stop it (an ordered walk that stops at the page's end is
    fine), or a page (LIMIT) of more than the active deployments sorted after its rows were
    found: an index chosen for the filter rather than the order reads every row the filter
    lets through (the copies' index once took `copy_of IS NULL`, true of every deployment,
    that way). Sorting the active ones, few by nature, is fine."""
    bad = []
    for statement, lines in plans(db, read):
        paged = "LIMIT" in statement.upper() and "FROM deployments" in statement
        paged = paged and f"deployments.{ACTIVE_PREDICATE}" not in statement
        if paged and any("TEMP B-TREE FOR ORDER BY" in line for line in lines):
            bad.append(f"{'; '.join(lines)}  <-  {' '.join(statement.split())}")
        for line in lines:
            if "deployments" not in line or not line.startswith("SCAN"):
                continue
            if "ix_deployments_active" in line:
                continue  # the partial index holds the active deployments only
            if "USING" not in line or "LIMIT" not in statement.upper():
                bad.append(f"{line}  <-  {' '.join(statement.split())}")
    return bad


def test_the_active_index_covers_what_the_queries_ask() -> None:
    """The partial index's predicate (schema and the migration that last made it) is the one
    the reads write."""
    (path,) = (MIGRATIONS / "versions").glob("*_queue.py")
    spec = importlib.util.spec_from_file_location("queue", path)
    assert spec is not None and spec.loader is not None
    migration = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(migration)
    spelled = ", ".join(f"'{status.value}'" for status in sorted(ACTIVE))
    assert f"status IN ({spelled})" == ACTIVE_PREDICATE == migration.ACTIVE
    with Database("sqlite://").engine.connect() as connection:
        rendered = str(
            select(DeploymentRow.id)
            .where(deployments._active())
            .compile(connection, compile_kwargs={"render_postcompile": True})
        )
    assert f"deployments.{ACTIVE_PREDICATE}" in rendered


READS: dict[str, Callable[[Database], object]] = {
    "default-page": lambda db: deployments.page(db, limit=100),
    "later-page": lambda db: deployments.page(db, limit=10, offset=200),
    "page-revisions": lambda db: deployments.page_revisions(db, limit=100),
    "serving-a-name": lambda db: deployments.serving(db, "tiny"),
    "active": deployments.list_active,
    "copy-revisions": lambda db: deployments.copy_revisions(db, ["a", "b"]),
    "active-copies": lambda db: deployments.active_copies(db, ["a", "b"]),
    "ended-before": lambda db: deployments.ended_before(
        db, utcnow() - timedelta(days=7), limit=500
    ),
}


def copy_ended(db: Database, times: int) -> None:
    """`times` more copies of every ended record, new ids (a SQLite bulk copy, for scale)."""
    columns = [column.name for column in DeploymentRow.__table__.columns]
    copied = ", ".join("lower(hex(randomblob(16)))" if c == "id" else c for c in columns)
    with db.engine.begin() as connection:
        connection.execute(
            text(
                "WITH RECURSIVE n(i) AS "
                f"(SELECT 1 UNION ALL SELECT i + 1 FROM n WHERE i < {times}) "
                f"INSERT INTO deployments ({', '.join(columns)}) SELECT {copied} "
                "FROM deployments, n WHERE status = 'STOPPED'"
            )
        )


@pytest.mark.parametrize("analyzed", [False, True], ids=["as-deployed", "analyzed"])
@pytest.mark.parametrize("name", sorted(READS))
def test_per_request_reads_never_scan_every_record(
    tmp_path: Path, name: str, analyzed: bool
) -> None:
    db = Database(f"sqlite:///{tmp_path / 'plans.db'}")
    db.migrate()
    history(db, ended=20, live=3)
    copy_ended(db, 200)  # 4,000 ended records
    if analyzed:  # the planner then knows how few records are active
        with db.engine.begin() as connection:
            connection.execute(text("ANALYZE"))
    assert plans(db, lambda: READS[name](db))
    assert unbounded_scans(db, lambda: READS[name](db)) == []
    db.dispose()


def test_the_check_sees_a_scan(tmp_path: Path) -> None:
    """Without the indexes on status and served name, routing by name would scan: the check
    says so."""
    db = Database(f"sqlite:///{tmp_path / 'plans.db'}")
    db.migrate()
    history(db, ended=20, live=1)
    with db.engine.begin() as connection:
        connection.execute(text("DROP INDEX ix_deployments_model_name_status"))
        connection.execute(text("DROP INDEX ix_deployments_status"))
        connection.execute(text("DROP INDEX ix_deployments_active"))
    db.dispose()
    db = Database(f"sqlite:///{tmp_path / 'plans.db'}")
    assert unbounded_scans(db, lambda: deployments.serving(db, "tiny"))
    db.dispose()
