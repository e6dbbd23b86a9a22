"""Service tests run on SQLite and PostgreSQL (see databases.py); `db` is a migrated one
holding the T4 fleet, `model_id` a tiny GGUF registered in it."""

from collections.abc import Iterator
from pathlib import Path

import pytest

from cohabit.service.registry.catalog import Registration, register_model
from cohabit.store import ledger
from cohabit.store.database import Database
from tests.estimate.tinymodels import write_gguf_model
from tests.service.server import T4_FLEET
from tests.store.databases import database_url, module_database_url

__all__ = ["database_url", "module_database_url"]


@pytest.fixture
def db(database_url: str) -> Iterator[Database]:
    database = Database(database_url)
    database.migrate()
    ledger.save_fleet(database, T4_FLEET)
    yield database
    database.dispose()


@pytest.fixture
def model_id(db: Database, tmp_path: Path) -> str:
    write_gguf_model(tmp_path / "tiny.gguf")
    return register_model(db, Registration(name="tiny", path=str(tmp_path / "tiny.gguf"))).id
