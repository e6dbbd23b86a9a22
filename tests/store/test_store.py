"""The store on SQLite and PostgreSQL: migrations, the fleet round trip, reservations that
re-check capacity, deployments that end (and release) exactly once, and reconciler leases."""

from __future__ import annotations

import gc
import sqlite3
from collections.abc import Iterator
from datetime import timedelta
from pathlib import Path
from typing import Any

import pytest
from sqlalchemy import inspect, text

from cohabit.hardware.fleetfile import load_fleet
from cohabit.hardware.model import Fleet, Gpu, Node, Notice, NoticeCode, Vendor
from cohabit.placement.decision import Placement
from cohabit.placement.reasons import NoFit, NoFitReason
from cohabit.placement.request import PlacementRequest
from cohabit.store import deployments, events, ledger
from cohabit.store.database import Database, utcnow
from cohabit.store.errors import RecordNotFound
from cohabit.store.records import DeploymentFailure, DeploymentStatus
from cohabit.store.tables import DeploymentRow
from cohabit.units import GIB
from tests.conftest import FIXTURES
from tests.store.helpers import add_deployment, add_model, upgrade_to

S = DeploymentStatus
T4 = Fleet(
    nodes=(
        Node(
            name="node-a",
            gpus=(Gpu(index=0, vendor=Vendor.NVIDIA, product="Tesla T4", memory_bytes=16 * GIB),),
            notices=(Notice(code=NoticeCode.PARTIAL_DISCOVERY, message="no uuid label"),),
        ),
    )
)


@pytest.fixture
def db(database_url: str) -> Iterator[Database]:
    database = Database(database_url)
    database.migrate()
    ledger.save_fleet(database, T4)
    yield database
    database.dispose()


def deploying(db: Database, size_bytes: int, owner: str = "me") -> str:
    record = add_deployment(db, add_model(db), size_bytes)
    assert deployments.claim(db, owner=owner, lease_s=30)
    assert deployments.advance(db, record.id, owner=owner, allowed=[S.REQUESTED], to=S.DEPLOYING)
    return record.id


def reserve(
    db: Database, deployment_id: str, size_bytes: int, owner: str = "me"
) -> Placement | NoFit | None:
    request = PlacementRequest(name=deployment_id, vram_bytes=size_bytes)
    return ledger.reserve(db, deployment_id=deployment_id, owner=owner, request=request)


def test_migrations_create_every_table_and_run_twice(database_url: str) -> None:
    db = Database(database_url)
    db.migrate()
    db.migrate()
    tables = set(inspect(db.engine).get_table_names())
    assert {
        "models",
        "model_files",
        "model_configs",
        "deployments",
        "reservations",
        "nodes",
    } <= tables
    db.dispose()


def test_upgrading_an_older_database_keeps_every_row_it_held(database_url: str) -> None:
    """From the schema before copies (0010): migration 0011 rebuilds the deployments table on
    SQLite (a copy, then a drop); the events that go with a deployment by cascade, and the
    reservations that point at it, must still be there after, as the deployment is."""
    db = Database(database_url)
    upgrade_to(db, "revision")
    when = "2026-01-01 00:00:00+00:00"
    with db.engine.begin() as connection:
        for statement in (
            "INSERT INTO models (id, name, source, format, created_at, modified_at) "
            "VALUES ('m', 'tiny', '/models/tiny.gguf', 'gguf', :when, :when)",
            "INSERT INTO deployments (id, model_id, config_id, model_name, engine, status, "
            "request, requested_bytes, tensor_parallel, requested_at) "
            "VALUES ('d', 'm', 'c', 'tiny', 'llamacpp', 'DEPLOYED', '{}', 1, 1, :when)",
            "INSERT INTO reservations (deployment_id, node_name, reserved_bytes, created_at) "
            "VALUES ('d', 'node-a', 1, :when)",
            "INSERT INTO events (deployment_id, at, kind, message) "
            "VALUES ('d', :when, 'requested', 'admitted')",
        ):
            connection.execute(text(statement), {"when": when})
    db.migrate()
    with db.engine.connect() as connection:
        counts = {
            table: connection.scalar(text(f"SELECT count(*) FROM {table}"))
            for table in ("models", "deployments", "reservations", "events")
        }
    assert counts == {"models": 1, "deployments": 1, "reservations": 1, "events": 1}
    assert [event.message for event in events.since(db, "d")] == ["admitted"]
    db.dispose()


@pytest.mark.parametrize(
    "fleet",
    [T4, load_fleet(FIXTURES / "fleets" / "issue_example.yaml")],
    ids=["t4-with-notice", "issue-example"],
)
def test_fleet_round_trips_through_the_nodes_table(db: Database, fleet: Fleet) -> None:
    ledger.save_fleet(db, fleet)
    assert ledger.current_state(db).fleet == fleet


def test_seed_t4_example_two_fit_the_third_does_not(db: Database) -> None:
    first, second, third = (deploying(db, 6 * GIB) for _ in range(3))
    placed = [reserve(db, first, 6 * GIB), reserve(db, second, 6 * GIB)]
    assert all(isinstance(p, Placement) and p.node == "node-a" for p in placed)
    refused = reserve(db, third, 6 * GIB)
    assert isinstance(refused, NoFit)
    assert refused.reason is NoFitReason.INSUFFICIENT_CAPACITY
    assert refused.largest_free_bytes == 4 * GIB
    held = ledger.reservations(db)
    assert sorted(r.deployment_id for r in held) == sorted([first, second])
    record = deployments.get(db, first)
    assert record.placement is not None
    assert (record.placement.node_name, record.placement.gpu_index) == ("node-a", 0)
    assert record.placement.notices == ("PartialDiscovery",)


@pytest.mark.parametrize(
    ("owner", "status_first"),
    [("someone-else", None), ("me", S.STOPPED)],
    ids=["not-the-owner", "stopped-before-reserving"],
)
def test_reserve_writes_nothing_for_a_deployment_it_does_not_drive(
    db: Database, owner: str, status_first: S | None
) -> None:
    deployment_id = deploying(db, GIB)
    if status_first is S.STOPPED:
        assert deployments.end(db, deployment_id) is not None
    assert reserve(db, deployment_id, GIB, owner=owner) is None
    assert ledger.reservations(db) == []


def test_end_releases_exactly_once(db: Database) -> None:
    deployment_id = deploying(db, 6 * GIB)
    assert isinstance(reserve(db, deployment_id, 6 * GIB), Placement)
    failure = DeploymentFailure(status=S.FAILED, code="OOM", message="CUDA out of memory")
    before = deployments.end(db, deployment_id, failure=failure)
    assert before is not None and before.status is S.DEPLOYING
    assert deployments.end(db, deployment_id) is None  # a later stop changes nothing
    record = deployments.get(db, deployment_id)
    assert (record.status, record.last_error_code) == (S.FAILED, "OOM")
    assert record.last_error_at is not None and record.released_at is not None
    assert ledger.reservations(db) == []


def test_unknown_deployment_is_not_found(db: Database) -> None:
    with pytest.raises(RecordNotFound, match="deployment nope not found"):
        deployments.get(db, "nope")


def test_a_lease_is_won_once_and_taken_over_when_it_runs_out(db: Database) -> None:
    record = add_deployment(db, add_model(db), GIB)
    assert [r.id for r in deployments.claim(db, owner="a", lease_s=600)] == [record.id]
    assert deployments.claim(db, owner="b", lease_s=30) == []
    with db.write() as session:  # a's lease runs out (as if 600 s went by without renewal)
        row = session.get(DeploymentRow, record.id)
        assert row is not None
        row.claimed_until = utcnow() - timedelta(seconds=1)
    taken = deployments.claim(db, owner="b", lease_s=30)
    assert [(r.id, r.claimed_by) for r in taken] == [(record.id, "b")]
    # "a" lost it: its guarded updates no longer apply.
    assert not deployments.advance(db, record.id, owner="a", allowed=[S.REQUESTED], to=S.DEPLOYING)


def test_database_path_that_cannot_exist_is_one_clear_error(tmp_path: Path) -> None:
    from cohabit.store.errors import DatabaseUnavailable

    blocker = tmp_path / "file"
    blocker.write_text("")
    db = Database(f"sqlite:///{blocker / 'sub' / 'cohabit.db'}")
    with pytest.raises(DatabaseUnavailable, match="cannot open database"):
        db.migrate()


def test_a_database_let_go_without_dispose_closes_its_pooled_connections(
    database_url: str,
) -> None:
    """A Database dropped without `dispose()` (a caller's slip, or a test that failed before
    its cleanup) closes the connections its pool holds once it is collected, rather than
    leaving them to the driver's own finalizer (on PostgreSQL a warning, and a server session
    held open until then)."""
    database = Database(database_url)
    with database.engine.connect() as connection:
        connection.execute(text("SELECT 1"))
        pooled = connection.connection.dbapi_connection
    assert pooled is not None and not _closed(pooled)
    del database, connection
    gc.collect()
    assert _closed(pooled)


def test_a_connection_given_back_after_dispose_is_closed(database_url: str) -> None:
    """A connection still checked out when `dispose()` runs (a thread that had not finished
    its transaction when the service stopped) is closed when it is given back, not left open
    in the pool `dispose()` discarded until the collector finds it."""
    database = Database(database_url)
    with database.engine.connect() as connection:
        connection.execute(text("SELECT 1"))
        held = connection.connection.dbapi_connection
        database.dispose()
        assert held is not None and not _closed(held)
    assert _closed(held)


def _closed(connection: Any) -> bool:
    """Whether a driver connection (psycopg or sqlite3) is closed."""
    closed = getattr(connection, "closed", None)
    if closed is not None:
        return bool(closed)
    try:
        connection.execute("SELECT 1")
    except sqlite3.ProgrammingError:
        return True
    return False
