"""The databases store and API tests run against: a fresh SQLite file, and a fresh database on
the PostgreSQL server named by COHABIT_TEST_DATABASE_URL (`.ci/run` starts one with
scripts/postgres.sh). With CI=true a missing URL fails the PostgreSQL cases instead of
skipping them, so CI can never pass without having run them."""

from __future__ import annotations

import os
import uuid
from collections.abc import Iterator
from pathlib import Path

import pytest

POSTGRES_URL_ENV = "COHABIT_TEST_DATABASE_URL"
KINDS = ("sqlite", "postgresql")


def postgres_server_url() -> str:
    url = os.environ.get(POSTGRES_URL_ENV)
    if url:
        return url
    message = f"{POSTGRES_URL_ENV} is not set (run scripts/postgres.sh start, export its URL)"
    if os.environ.get("CI", "").lower() == "true":
        pytest.fail(message)
    pytest.skip(message)


def _admin_dsn(url: str) -> str:
    return url.replace("postgresql+psycopg://", "postgresql://", 1)


def _with_database(url: str, name: str) -> str:
    head, _, _ = url.rpartition("/")
    return f"{head}/{name}"


def fresh_database_url(kind: str, tmp_path: Path) -> Iterator[str]:
    """Yield the URL of an empty database of `kind`; drop it afterwards."""
    if kind == "sqlite":
        yield f"sqlite:///{tmp_path / 'cohabit.db'}"
        return
    import psycopg

    server = postgres_server_url()
    name = f"t_{uuid.uuid4().hex[:16]}"
    with psycopg.connect(_admin_dsn(server), autocommit=True) as admin:
        admin.execute(f'CREATE DATABASE "{name}"')
    try:
        yield _with_database(server, name)
    finally:
        with psycopg.connect(_admin_dsn(server), autocommit=True) as admin:
            admin.execute(f'DROP DATABASE IF EXISTS "{name}" WITH (FORCE)')


@pytest.fixture(params=KINDS)
def database_url(request: pytest.FixtureRequest, tmp_path: Path) -> Iterator[str]:
    """An empty database, once per kind (SQLite and PostgreSQL)."""
    yield from fresh_database_url(request.param, tmp_path)


@pytest.fixture(params=KINDS, scope="module")
def module_database_url(
    request: pytest.FixtureRequest, tmp_path_factory: pytest.TempPathFactory
) -> Iterator[str]:
    """One empty database per kind, shared by a module's tests (one server for many cases)."""
    yield from fresh_database_url(request.param, tmp_path_factory.mktemp("db"))
