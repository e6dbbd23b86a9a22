"""Retention, on SQLite and PostgreSQL: ended deployments whose end lies further back than
the retention are deleted with their engine directory (the real LocalRuntime's, under the
data dir); recent ones, active ones however old, and ones that ended recently after a long
life stay. Records are backdated in the database, as if they had ended days ago. The server
purges once at start (a retention of 0 keeps everything)."""

from __future__ import annotations

from collections.abc import Iterator
from dataclasses import dataclass
from datetime import datetime, timedelta
from pathlib import Path
from typing import Any

import httpx
import pytest
from sqlalchemy import update

from cohabit.runtime.spawner import LocalRuntime
from cohabit.service.control import retention
from cohabit.service.control.retention import DAY_S, purge
from cohabit.store import deployments
from cohabit.store.database import Database, utcnow
from cohabit.store.records import DeploymentFailure, DeploymentStatus
from cohabit.store.tables import DeploymentRow
from cohabit.units import GIB
from tests.service.scripted_runtime import ScriptedRuntime
from tests.service.server import serving, settings_for, wait_for
from tests.store.helpers import add_deployment, add_model

S = DeploymentStatus
WEEK_S = 7 * DAY_S


def backdate(db: Database, deployment_id: str, **moments: datetime) -> None:
    with db.write() as session:
        session.execute(
            update(DeploymentRow).where(DeploymentRow.id == deployment_id).values(**moments)
        )


@dataclass(frozen=True, slots=True, kw_only=True)
class History:
    old_stopped: str
    old_failed: str
    recent_stopped: str
    old_but_active: str
    long_life_ended_yesterday: str

    @property
    def expired(self) -> set[str]:
        return {self.old_stopped, self.old_failed}

    @property
    def kept(self) -> set[str]:
        return {self.recent_stopped, self.old_but_active, self.long_life_ended_yesterday}


def write_history(db: Database, data_dir: Path) -> History:
    """Five deployments, each with an engine directory holding a log, as the spawner makes."""
    model = add_model(db)
    ids = [add_deployment(db, model, GIB).id for _ in range(5)]
    now = utcnow()
    ten_days_ago, yesterday = now - timedelta(days=10), now - timedelta(days=1)
    history = History(
        old_stopped=ids[0],
        old_failed=ids[1],
        recent_stopped=ids[2],
        old_but_active=ids[3],
        long_life_ended_yesterday=ids[4],
    )
    for deployment_id in (history.old_stopped, history.recent_stopped):
        deployments.end(db, deployment_id)
    oom = DeploymentFailure(
        status=S.FAILED, code="OOM", message="CUDA out of memory", at=ten_days_ago
    )
    deployments.end(db, history.old_failed, failure=oom)
    deployments.end(db, history.long_life_ended_yesterday)
    backdate(db, history.old_stopped, requested_at=ten_days_ago, stopped_at=ten_days_ago)
    backdate(db, history.old_failed, requested_at=ten_days_ago)
    backdate(db, history.old_but_active, requested_at=now - timedelta(days=30))
    backdate(
        db,
        history.long_life_ended_yesterday,
        requested_at=now - timedelta(days=20),
        stopped_at=yesterday,
    )
    for deployment_id in ids:
        directory = data_dir / "engines" / deployment_id
        directory.mkdir(parents=True)
        (directory / "engine.log").write_text("fake-engine: listening\n")
    return history


@pytest.fixture
def db(database_url: str) -> Iterator[Database]:
    database = Database(database_url)
    database.migrate()
    yield database
    database.dispose()


def existing(db: Database, ids: set[str]) -> set[str]:
    return set(deployments.names(db, ids))


def test_purge_deletes_what_ended_before_the_retention_with_its_logs(
    db: Database, tmp_path: Path
) -> None:
    data_dir = tmp_path / "data"
    history = write_history(db, data_dir)
    runtime = LocalRuntime(data_dir)
    assert purge(db, runtime, retention_s=WEEK_S) == 2
    everything = history.expired | history.kept
    assert existing(db, everything) == history.kept
    on_disk = {path.name for path in (data_dir / "engines").iterdir()}
    assert on_disk == history.kept
    assert purge(db, runtime, retention_s=WEEK_S) == 0  # nothing more to do
    assert purge(db, runtime, retention_s=0.5 * DAY_S) == 1  # a shorter retention
    assert existing(db, everything) == {history.old_but_active, history.recent_stopped}


def test_purge_works_through_a_long_history_in_batches(
    db: Database, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setattr(retention, "BATCH", 2)
    model = add_model(db)
    ended = [add_deployment(db, model, GIB).id for _ in range(5)]
    long_ago = utcnow() - timedelta(days=8)
    for deployment_id in ended:
        deployments.end(db, deployment_id)
        backdate(db, deployment_id, requested_at=long_ago, stopped_at=long_ago)
    runtime = ScriptedRuntime()
    assert purge(db, runtime, retention_s=WEEK_S) == 5
    assert existing(db, set(ended)) == set()
    assert sorted(runtime.discarded) == sorted(ended)


@pytest.mark.parametrize(("retention_days", "purged"), [(7.0, True), (0.0, False)])
def test_the_server_purges_at_start(
    database_url: str, tmp_path: Path, retention_days: float, purged: bool
) -> None:
    db = Database(database_url)
    db.migrate()
    history = write_history(db, tmp_path / "data")
    settings = settings_for(tmp_path, database_url, retention_days=retention_days)
    with (
        serving(settings, ScriptedRuntime()) as api,
        httpx.Client(base_url=api, timeout=30) as client,
    ):

        def listed() -> set[str]:
            body: list[dict[str, Any]] = client.get("/serving/deployments").json()
            return {item["id"] for item in body}

        if purged:
            wait_for(lambda: listed() == history.kept)
            for deployment_id in history.expired:
                response = client.get(f"/serving/deployment/{deployment_id}")
                assert response.status_code == 404
        else:
            assert listed() == history.expired | history.kept
    db.dispose()
