"""A server holding more records than the default page of each list route holds: one more
model than `CATALOG_LIMIT` and one more deployment than `DEPLOYMENTS_LIMIT` (the service's
api/paging.py), written straight into the store before the server starts, and a last model
registered through the API (a tiny GGUF, so it can be deployed). The real app on loopback,
with the in-process engine double (tests/service/scripted_runtime.py)."""

from __future__ import annotations

import uuid
from collections.abc import Iterator
from contextlib import contextmanager
from dataclasses import dataclass
from pathlib import Path

import httpx

from cohabit.service.api.paging import CATALOG_LIMIT, DEPLOYMENTS_LIMIT
from cohabit.store import deployments
from cohabit.store.catalog import name_key
from cohabit.store.database import Database, utcnow
from cohabit.store.tables import ModelRow
from cohabit.units import GIB
from tests.service.scripted_runtime import ScriptedRuntime
from tests.service.server import register_tiny_gguf, serving, settings_for
from tests.store.helpers import add_deployment, add_model

LAST = "last-of-many"  # the name of the model registered after all the others


@dataclass(frozen=True, slots=True, kw_only=True)
class Crowded:
    api: str
    models: list[str]  # every model id, in the list's order (oldest first)
    ended: list[str]  # every deployment id, in the list's order (newest first)
    first_model_id: str  # the model the ended deployments are of


def add_fillers(db: Database, count: int) -> list[str]:
    """`count` models in one transaction (one at a time takes seconds), registered at one
    moment: the list orders them by id. No files, no configs: they are only listed."""
    now = utcnow()
    ids = sorted(str(uuid.uuid4()) for _ in range(count))
    with db.write() as session:
        session.add_all(
            ModelRow(
                id=model_id,
                name=f"filler-{index:04d}",
                name_key=name_key(f"filler-{index:04d}"),
                repo_id=None,
                hub=None,
                source=f"/models/filler-{index:04d}.gguf",
                model_path=f"/models/filler-{index:04d}.gguf",
                format="gguf",
                description=None,
                created_at=now,
                modified_at=now,
            )
            for index, model_id in enumerate(ids)
        )
    return ids


@contextmanager
def crowded_server(tmp_path: Path) -> Iterator[Crowded]:
    database_url = f"sqlite:///{tmp_path / 'cohabit.db'}"
    db = Database(database_url)
    db.migrate()
    first = add_model(db, "tiny")
    fillers = add_fillers(db, CATALOG_LIMIT - 1)
    ended = []
    for _ in range(DEPLOYMENTS_LIMIT + 1):
        record = add_deployment(db, first, GIB)
        deployments.end(db, record.id)
        ended.append(record.id)
    db.dispose()
    with (
        serving(settings_for(tmp_path, database_url), ScriptedRuntime()) as api,
        httpx.Client(base_url=api, timeout=30) as http,
    ):
        last = register_tiny_gguf(http, tmp_path, name=LAST)
        yield Crowded(
            api=api,
            models=[first[0], *fillers, last["id"]],
            ended=ended[::-1],
            first_model_id=first[0],
        )
