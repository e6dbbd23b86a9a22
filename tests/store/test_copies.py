"""A deployment's copies as rows of their own, on SQLite and PostgreSQL: admitted together,
listed as one deployment, each active row seen by the reconciler, ended together with every
budget released, and purged together once ended."""

from __future__ import annotations

from collections.abc import Iterator

import pytest

from cohabit.hardware.model import Fleet, Gpu, Node, Vendor
from cohabit.placement.request import PlacementRequest
from cohabit.store import catalog, copies, deployments, ledger
from cohabit.store.database import Database
from cohabit.store.errors import Conflict
from cohabit.store.records import DeploymentStatus, Scaling
from cohabit.units import GIB
from tests.store.helpers import add_deployment, add_model

S = DeploymentStatus
TWO_CARDS = Fleet(
    nodes=(
        Node(
            name="node-a",
            gpus=tuple(
                Gpu(index=i, vendor=Vendor.NVIDIA, product="Tesla T4", memory_bytes=16 * GIB)
                for i in range(2)
            ),
        ),
    )
)


@pytest.fixture
def db(database_url: str) -> Iterator[Database]:
    database = Database(database_url)
    database.migrate()
    ledger.save_fleet(database, TWO_CARDS)
    yield database
    database.dispose()


def test_a_deployment_of_three_copies_is_three_rows_listed_as_one(db: Database) -> None:
    model = add_model(db)
    single = add_deployment(db, model, GIB)
    triple = add_deployment(db, model, GIB, scaling=Scaling(starting_copies=3, max_copies=4))
    rows = deployments.copies_of(db, triple.id)
    assert [(r.copy_of, r.copy_index) for r in rows] == [
        (None, 0),
        (triple.id, 1),
        (triple.id, 2),
    ]
    assert rows[0].id == triple.id and len({r.id for r in rows}) == 3
    assert all(r.status is S.REQUESTED and r.scaling == triple.scaling for r in rows)
    assert all(r.deployment_id == triple.id for r in rows)
    # Users see two deployments; the reconciler sees four rows.
    assert [r.id for r in deployments.page(db, limit=10)] == [single.id, triple.id]
    assert [e.id for e in deployments.page_revisions(db, limit=10)] == [single.id, triple.id]
    assert [e.copied for e in deployments.page_revisions(db, limit=10)] == [False, True]
    assert [r.id for r in deployments.list_all(db)] == [single.id, triple.id]
    assert len(deployments.list_all(db, copies=True)) == 4
    assert {r.id for r in deployments.list_active(db)} == {single.id} | {r.id for r in rows}
    assert deployments.copies_of(db, "nope") == []


def test_ending_a_deployment_ends_every_copy_and_releases_every_budget(db: Database) -> None:
    model = add_model(db)
    record = add_deployment(db, model, 6 * GIB, scaling=Scaling(starting_copies=2))
    rows = deployments.copies_of(db, record.id)
    # Only copy 0 is claimed: its copy waits to be placed with it, in one reservation.
    assert [r.id for r in deployments.claim(db, owner="me", lease_s=30)] == [record.id]
    assert deployments.advance(db, record.id, owner="me", allowed=[S.REQUESTED], to=S.DEPLOYING)
    requests = [PlacementRequest(name=row.id, vram_bytes=6 * GIB) for row in rows]
    placed = copies.reserve(db, deployment_id=record.id, owner="me", requests=requests, lease_s=30)
    assert isinstance(placed, list)
    assert [p.placement.gpu_indices for p in placed] == [[0], [1]]  # spread over the cards
    assert [(r.status, r.claimed_by) for r in deployments.copies_of(db, record.id)] == [
        (S.DEPLOYING, "me")
    ] * 2
    # Taken: the same copies cannot be reserved again (by this owner or another).
    assert (
        copies.reserve(db, deployment_id=record.id, owner="me", requests=requests, lease_s=30)
        is None
    )
    assert {r.deployment_id for r in ledger.reservations(db)} == {r.id for r in rows}
    ended = copies.end_all(db, record.id, values=deployments.stop_values())
    assert [r.id for r in ended] == [r.id for r in rows]
    assert all(r.status is S.DEPLOYING for r in ended)
    assert ledger.reservations(db) == []
    assert {r.status for r in deployments.copies_of(db, record.id)} == {S.STOPPED}
    assert copies.end_all(db, record.id, values=deployments.stop_values()) == []


def test_ended_copies_are_purged_with_their_deployment(db: Database) -> None:
    model = add_model(db)
    record = add_deployment(db, model, GIB, scaling=Scaling(starting_copies=3))
    rows = deployments.copies_of(db, record.id)
    # While one copy is active, the deployment stays (its copies point at it).
    assert deployments.end(db, record.id) is not None
    assert deployments.delete_ended(db, [record.id]) == 0
    copies.end_all(db, record.id, values=deployments.stop_values())
    assert deployments.delete_ended(db, [record.id]) == 3
    assert all(deployments.copies_of(db, r.id) == [] for r in rows)


def test_a_model_with_copies_counts_one_deployment(db: Database) -> None:
    model = add_model(db)
    record = add_deployment(db, model, GIB, scaling=Scaling(starting_copies=2))
    with pytest.raises(Conflict, match="has 1 active deployment"):
        catalog.delete_model(db, model[0])
    copies.end_all(db, record.id, values=deployments.stop_values())
    _, removed = catalog.delete_model(db, model[0])
    assert removed == 1
