"""Faults of the database itself, at the store: a write it refuses (a full disk on SQLite, a
read-only PostgreSQL) is DatabaseUnavailable and what `health()` says until a write changes a
row again, and one it cannot be reached at all is `unavailable` with the reason; a damaged
SQLite file and a database a newer cohabit wrote are refused before anything is written; a
deployment whose model went meanwhile is RecordNotFound."""

from __future__ import annotations

from collections.abc import Callable
from pathlib import Path

import pytest
from alembic.script import ScriptDirectory
from sqlalchemy import text

from cohabit.hardware.model import Fleet, Gpu, Node, Vendor
from cohabit.store import catalog, deployments, ledger, migrations
from cohabit.store.database import Database
from cohabit.store.errors import DatabaseUnavailable, RecordNotFound
from cohabit.units import GIB
from tests.store.faults import (
    FUTURE_REVISION,
    Unwritable,
    damage_a_page,
    from_the_future,
    unwritable,
)
from tests.store.helpers import add_model, new_deployment

__all__ = ["unwritable"]

T4 = Fleet(
    nodes=(
        Node(
            name="node-a",
            gpus=(Gpu(index=0, vendor=Vendor.NVIDIA, product="Tesla T4", memory_bytes=16 * GIB),),
        ),
    )
)


def test_a_refused_write_is_database_unavailable_and_health_says_so(
    unwritable: Unwritable,
) -> None:
    db = Database(unwritable.url)
    db.migrate()
    ledger.save_fleet(db, T4)
    first = add_model(db, "first")
    assert db.health().status == "ok"
    unwritable.stop_writes()
    with pytest.raises(DatabaseUnavailable, match=unwritable.reason) as refused:
        add_model(db, "second")
    assert str(refused.value).startswith("cannot write to database ")
    health = db.health()
    assert (health.status, health.since is not None) == ("failing", True)
    assert health.reason is not None and unwritable.reason in health.reason
    # What was stored is still there to read.
    assert [model.id for model in catalog.list_models(db)] == [first[0]]
    unwritable.allow_writes()
    with db.write():
        pass  # a commit that changed nothing shows nothing: SQLite commits it on a full disk
    assert db.health().status == "failing"
    add_model(db, "second")
    assert db.health().status == "ok"
    db.dispose()


def _not_a_database(path: Path) -> None:
    path.write_bytes(b"cohabit.db is not this text file " * 200)


@pytest.mark.parametrize(
    ("damage", "found"),
    [
        (damage_a_page, "database disk image is malformed"),
        (_not_a_database, "file is not a database"),
    ],
    ids=["damaged-page", "not-a-database"],
)
def test_a_damaged_sqlite_file_is_refused_before_anything_is_written(
    tmp_path: Path, damage: Callable[[Path], None], found: str
) -> None:
    path = tmp_path / "cohabit.db"
    db = Database(f"sqlite:///{path}")
    db.migrate()
    ledger.save_fleet(db, T4)
    add_model(db)
    db.dispose()  # the last connection folds the write-ahead log into the file
    damage(path)
    before = path.read_bytes()
    db = Database(f"sqlite:///{path}")
    with pytest.raises(DatabaseUnavailable) as refused:
        db.migrate()
    message = str(refused.value)
    assert message.startswith(f"database file {path} is damaged (")
    assert found in message
    assert message.endswith(
        "restore it from a backup, or move it aside to start with an empty database"
    )
    db.dispose()
    assert path.read_bytes() == before


def test_a_database_a_newer_cohabit_wrote_is_refused_untouched(database_url: str) -> None:
    db = Database(database_url)
    db.migrate()
    from_the_future(database_url)
    with pytest.raises(DatabaseUnavailable) as refused:
        db.migrate()
    message = str(refused.value)
    assert f"was written by a newer cohabit: its schema revision {FUTURE_REVISION!r}" in message
    newest = ScriptDirectory(str(Path(migrations.__file__).parent)).get_current_head()
    assert newest is not None and f"the newest here is {newest!r}" in message
    assert "\n" not in message
    with db.engine.connect() as connection:
        stored = connection.scalar(text("SELECT version_num FROM alembic_version"))
    assert stored == FUTURE_REVISION
    db.dispose()


def test_a_deployment_whose_model_went_meanwhile_is_record_not_found(database_url: str) -> None:
    """Admission read the model, then it was deleted before the insert: the foreign key
    refuses the row, and the store says which model is gone."""
    db = Database(database_url)
    db.migrate()
    model = add_model(db)
    catalog.delete_model(db, model[0])
    with pytest.raises(RecordNotFound, match=f"model {model[0]} not found"):
        deployments.create(db, new_deployment(model, GIB))
    assert deployments.list_active(db) == []
    db.dispose()


def test_a_database_that_cannot_be_reached_is_unavailable_with_the_reason(
    tmp_path: Path,
) -> None:
    db = Database(f"sqlite:///{tmp_path / 'no-such-folder' / 'cohabit.db'}")
    health = db.health()
    assert (health.status, health.reason) == ("unavailable", "unable to open database file")
    db.dispose()
