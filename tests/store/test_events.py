"""A deployment's timeline on SQLite and PostgreSQL: events come back in the order they were
recorded, a follower resumes after the last id it saw, and the events go when the ended
deployment's record is purged (and only then)."""

from __future__ import annotations

import logging
from collections.abc import Iterator

import pytest

from cohabit.store import deployments, events
from cohabit.store.database import Database
from cohabit.store.events import EventKind
from cohabit.units import GIB
from tests.store.helpers import add_deployment, add_model, new_deployment


@pytest.fixture
def db(database_url: str) -> Iterator[Database]:
    database = Database(database_url)
    database.migrate()
    yield database
    database.dispose()


def test_timeline_in_order_and_resumable(db: Database) -> None:
    model = add_model(db)
    first = add_deployment(db, model, GIB)
    other = add_deployment(db, model, GIB)
    events.record(db, first.id, EventKind.REQUESTED, "requested 1 GiB")
    events.record(db, other.id, EventKind.REQUESTED, "another deployment's")
    placed = events.record(db, first.id, EventKind.PLACED, "gpu 0", {"gpu_index": 0})
    events.record(db, first.id, EventKind.STARTED, "pid 42", {"pid": 42})

    timeline = events.since(db, first.id)
    assert [e.kind for e in timeline] == ["requested", "placed", "started"]
    assert timeline[1].data == {"gpu_index": 0}
    assert timeline[0].at <= timeline[1].at <= timeline[2].at
    assert timeline[0].at.tzinfo is not None
    # A follower that saw up to "placed" gets only what came after.
    assert [e.kind for e in events.since(db, first.id, after=placed.id)] == ["started"]
    assert [e.kind for e in events.since(db, first.id, limit=1)] == ["requested"]
    # The last few, still oldest first.
    assert [e.kind for e in events.latest(db, first.id, limit=2)] == ["placed", "started"]
    assert [e.id for e in events.latest(db, first.id)] == [e.id for e in timeline]


def test_the_first_event_commits_with_the_deployment(
    db: Database, caplog: pytest.LogCaptureFixture
) -> None:
    """Admission's `requested` is written in the transaction that inserts the deployment, so
    a reconciler that sees the row (and writes `placed`) always finds it there first; an
    event that cannot be written is logged and the deployment is stored without it."""
    model = add_model(db)
    new = new_deployment(model, GIB)
    step = (EventKind.REQUESTED, "tiny on llamacpp: 1.00 GiB per device", {"source": "override"})
    created = deployments.create(db, new, steps=[step])
    (first,) = events.since(db, created.id)
    assert (first.kind, first.message, first.data) == ("requested", step[1], step[2])

    other = new_deployment(model, GIB)
    unstorable = (EventKind.REQUESTED, "x", {"not json": object()})
    with caplog.at_level(logging.ERROR, logger="cohabit.store.events"):
        deployments.create(db, other, steps=[unstorable])
    assert deployments.get(db, other.id).status.value == "REQUESTED"
    assert events.since(db, other.id) == []
    assert f"recording the requested event of deployment {other.id} failed" in caplog.text


def test_long_messages_are_cut(db: Database) -> None:
    model = add_model(db)
    deployment = add_deployment(db, model, GIB)
    event = events.record(db, deployment.id, EventKind.FAILED, "x" * 10_000)
    assert len(event.message) == events.MESSAGE_CHARS


def test_events_go_with_the_purged_record_only(db: Database) -> None:
    model = add_model(db)
    ended = add_deployment(db, model, GIB)
    live = add_deployment(db, model, GIB)
    for deployment in (ended, live):
        events.record(db, deployment.id, EventKind.REQUESTED, "requested")
    deployments.end(db, ended.id)
    assert deployments.delete_ended(db, [ended.id, live.id]) == 1
    assert events.since(db, ended.id) == []
    assert [e.kind for e in events.since(db, live.id)] == ["requested"]
