"""Model names are unique once normalised, in the database too: which names are one
(`name_key`), the store refusing a taken one and naming its holder, the unique index holding
without the store's check, two registrations at the same moment on PostgreSQL, and the
migration that brings in the index renaming the later of an old database's duplicates."""

from __future__ import annotations

import importlib.util
import threading
import uuid
from collections.abc import Iterator
from datetime import UTC, datetime, timedelta
from pathlib import Path
from types import ModuleType

import pytest
from sqlalchemy import func, insert, select, text
from sqlalchemy.exc import IntegrityError

from cohabit.store import catalog
from cohabit.store.catalog import name_key
from cohabit.store.database import MIGRATIONS, Database
from cohabit.store.errors import NameTaken
from cohabit.store.tables import DeploymentRow, ModelConfigRow, ModelRow
from tests.service.server import wait_for
from tests.store.databases import fresh_database_url
from tests.store.helpers import add_model, upgrade_to


@pytest.mark.parametrize(
    ("one", "other"),
    [
        ("tiny", "Tiny"),
        ("tiny", "TINY"),
        ("tiny", "\uff54\uff49\uff4e\uff59"),  # full-width ｔｉｎｙ
        ("file-7b", "\ufb01le-7b"),  # the ﬁ ligature
        ("strasse", "STRASSE"),
        ("straße", "STRASSE"),  # ß folds to ss
        ("café", "cafe\u0301"),  # é composed, and e with a combining acute
        ("Ångström", "\u212bngstr\u00f6m"),  # the Ångström sign is the letter Å
        ("llama 3", "llama\u00a03"),  # a no-break space inside is a space
        ("x²", "x2"),  # NFKC: a superscript two is a two
    ],
)
def test_names_that_are_one(one: str, other: str) -> None:
    assert name_key(one) == name_key(other)


@pytest.mark.parametrize(
    ("one", "other"),
    [
        ("tiny", "tiny2"),
        ("tiny", "ti ny"),
        ("tiny", "t\u0456ny"),  # Cyrillic і: a look-alike from another script stays apart
        ("llama-3", "llama_3"),
    ],
)
def test_names_that_are_not_one(one: str, other: str) -> None:
    assert name_key(one) != name_key(other)


def _migration(name: str) -> ModuleType:
    (path,) = (MIGRATIONS / "versions").glob(f"*_{name}.py")
    spec = importlib.util.spec_from_file_location(name, path)
    assert spec is not None and spec.loader is not None
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


def test_the_migration_keys_names_as_the_store_does() -> None:
    migration = _migration("model_names")
    names = ["tiny", "Tiny", "\uff54iny", "straße", "\ufdfa" * 255, "Llama-3.1-8B", ""]
    assert [migration.name_key(name) for name in names] == [name_key(name) for name in names]


def test_a_taken_name_is_refused_naming_the_model_that_has_it(database_url: str) -> None:
    db = Database(database_url)
    db.migrate()
    holder, _ = add_model(db, "Tiny")
    with pytest.raises(NameTaken) as refused:
        add_model(db, "\uff54\uff49\uff4e\uff59")
    assert refused.value.holder_id == holder
    assert str(refused.value) == (
        f"model name '\uff54\uff49\uff4e\uff59' is taken by model {holder} as 'Tiny'"
    )
    assert [model.id for model in catalog.list_models(db)] == [holder]
    db.dispose()


def test_the_database_holds_names_unique_without_the_stores_check(database_url: str) -> None:
    db = Database(database_url)
    db.migrate()
    add_model(db, "tiny")
    now = datetime.now(UTC)
    with pytest.raises(IntegrityError), db.write() as session:
        session.add(
            ModelRow(
                id=str(uuid.uuid4()),
                name="TINY",
                name_key=name_key("TINY"),
                source="/models/TINY.gguf",
                format="gguf",
                created_at=now,
                modified_at=now,
            )
        )
    db.dispose()


@pytest.fixture
def postgres_url(tmp_path: Path) -> Iterator[str]:
    """An empty PostgreSQL database: the race below needs two writers that interleave."""
    yield from fresh_database_url("postgresql", tmp_path)


def test_two_registrations_at_once_give_one_model_and_one_name_taken(postgres_url: str) -> None:
    """On PostgreSQL both may read "not taken"; the unique index makes the second wait for
    the first's commit and then refuses it, and the store says NameTaken. (On SQLite the
    write lock lets one registration at a time read and insert.) The first is held open,
    uncommitted, until the second is seen waiting on it."""
    db = Database(postgres_url)
    db.migrate()
    first = str(uuid.uuid4())
    now = datetime.now(UTC)
    outcome: list[BaseException] = []

    def second() -> None:
        try:
            add_model(db, "TINY")
        except BaseException as err:  # handed to the test's thread
            outcome.append(err)

    with db.engine.connect() as held:
        transaction = held.begin()
        held.execute(
            insert(ModelRow).values(
                id=first,
                name="tiny",
                name_key=name_key("tiny"),
                source="/models/tiny.gguf",
                format="gguf",
                created_at=now,
                modified_at=now,
            )
        )
        thread = threading.Thread(target=second)
        thread.start()
        wait_for(lambda: _waiting_on_a_lock(db), timeout_s=60)
        transaction.commit()
    thread.join(60)
    assert not thread.is_alive()
    (refused,) = outcome
    assert isinstance(refused, NameTaken) and refused.holder_id == first
    assert [model.id for model in catalog.list_models(db)] == [first]
    db.dispose()


def _waiting_on_a_lock(db: Database) -> bool:
    with db.engine.connect() as connection:
        waiting = connection.scalar(
            text(
                "SELECT count(*) FROM pg_stat_activity "
                "WHERE datname = current_database() AND wait_event_type = 'Lock'"
            )
        )
    return bool(waiting)


# (id, name), oldest first, as a database from before the unique names may hold them. The
# second's name is what the fourth would be renamed to first.
OLD_MODELS = [
    ("a0000000-0000-4000-8000-000000000001", "tiny"),
    ("c0000000-0000-4000-8000-000000000003", "tiny-d0000000"),
    ("b0000000-0000-4000-8000-000000000002", "other"),
    ("d0000000-0000-4000-8000-000000000004", "Tiny"),
    ("e0000000-0000-4000-8000-000000000005", "\uff54\uff49\uff4e\uff59"),
    ("f0000000-0000-4000-8000-000000000006", "tiny"),
]
RENAMED = {
    "a0000000-0000-4000-8000-000000000001": "tiny",
    "c0000000-0000-4000-8000-000000000003": "tiny-d0000000",
    "b0000000-0000-4000-8000-000000000002": "other",
    "d0000000-0000-4000-8000-000000000004": "Tiny-d0000000-0000-4000-8000-000000000004",
    "e0000000-0000-4000-8000-000000000005": "\uff54\uff49\uff4e\uff59-e0000000",
    "f0000000-0000-4000-8000-000000000006": "tiny-f0000000",
}


def test_the_migration_renames_the_later_of_an_old_databases_duplicates(
    database_url: str,
) -> None:
    """The oldest model of a name keeps it; each later one gets its id's first 8 characters
    (its whole id when that is taken too). Files, configs and deployments stay; a
    deployment keeps the name it was made with (its engine serves that one)."""
    db = Database(database_url)
    upgrade_to(db, "copies")
    then = datetime(2020, 1, 1, tzinfo=UTC)
    with db.engine.begin() as connection:
        for age, (model_id, name) in enumerate(OLD_MODELS):
            when = then + timedelta(minutes=age)
            connection.execute(
                text(
                    "INSERT INTO models (id, name, source, format, created_at, modified_at) "
                    "VALUES (:id, :name, :source, 'gguf', :when, :when)"
                ),
                {"id": model_id, "name": name, "source": f"/models/{age}.gguf", "when": when},
            )
            connection.execute(
                text(
                    "INSERT INTO model_files (id, model_id, name, storage_type, created_at) "
                    "VALUES (:id, :model, 'm.gguf', 'file', :when)"
                ),
                {"id": str(uuid.uuid4()), "model": model_id, "when": when},
            )
            connection.execute(
                text(
                    "INSERT INTO model_configs (id, model_id, is_default, config, "
                    "system_config, created_at) VALUES (:id, :model, true, '{}', '{}', :when)"
                ),
                {"id": str(uuid.uuid4()), "model": model_id, "when": when},
            )
        connection.execute(
            text(
                "INSERT INTO deployments (id, model_id, config_id, model_name, engine, status, "
                "request, requested_bytes, tensor_parallel, requested_at) VALUES (:id, :model, "
                "'c', 'tiny', 'llamacpp', 'DEPLOYED', '{}', 1, 1, :when)"
            ),
            {"id": str(uuid.uuid4()), "model": OLD_MODELS[-1][0], "when": then},
        )
    db.migrate()
    models = {model.id: model for model in catalog.list_models(db)}
    assert {model_id: model.name for model_id, model in models.items()} == RENAMED
    assert len({name_key(model.name) for model in models.values()}) == len(OLD_MODELS)
    assert all(len(model.files) == 1 for model in models.values())
    renamed = {model_id for model_id, name in OLD_MODELS if RENAMED[model_id] != name}
    assert {m for m, model in models.items() if model.modified_at > model.created_at} == renamed
    with db.read() as session:
        assert session.scalar(select(func.count()).select_from(ModelConfigRow)) == len(OLD_MODELS)
        assert session.scalars(select(DeploymentRow.model_name)).all() == ["tiny"]
        stored_keys = dict(session.execute(select(ModelRow.id, ModelRow.name_key)).all())
    assert stored_keys == {model_id: name_key(name) for model_id, name in RENAMED.items()}
    with pytest.raises(NameTaken):
        add_model(db, "TINY-F0000000")
    db.dispose()
