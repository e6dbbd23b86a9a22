"""Faults of the database as a user meets them. Over real HTTP on SQLite and PostgreSQL: a
database that stops taking writes (a full disk, a read-only server: tests/store/faults.py)
answers every write with the documented 503 `{"detail": …}` naming it, health reports the
database failing with the reason until a write succeeds again, and nothing stored is lost;
a deploy that races its model's delete is a 404 naming the model. And `cohabit serve`, run
as a user runs it, refuses a damaged SQLite file, a database a newer cohabit wrote and one
it cannot write, each in one line, exit 2."""

from __future__ import annotations

import logging
from collections.abc import Callable
from pathlib import Path
from typing import Any

import httpx
import pytest

from cohabit.hardware.model import Fleet
from cohabit.service.registry.catalog import Registration, register_model
from cohabit.service.registry.downloads import Downloader
from cohabit.store import catalog, ledger
from cohabit.store import deployments as store_deployments
from cohabit.store import downloads as store_downloads
from cohabit.store.database import Database
from cohabit.store.downloads import NewDownload
from cohabit.store.records import NewDeployment
from cohabit.units import GIB
from tests.conftest import run_cli
from tests.estimate.tinymodels import write_gguf_model
from tests.service.scripted_runtime import ScriptedRuntime
from tests.service.server import (
    T4_FLEET,
    deploy,
    register_tiny_gguf,
    scripted_client,
    serving,
    settings_for,
    wait_for,
)
from tests.store.faults import (
    FUTURE_REVISION,
    Unwritable,
    damage_a_page,
    from_the_future,
    unwritable,
)

__all__ = ["unwritable"]


def _database(client: httpx.Client) -> dict[str, Any]:
    entries = client.get("/serving/health").json()
    (entry,) = [entry for entry in entries if entry["component"] == "database"]
    return dict(entry)


def test_writes_to_a_database_that_takes_none_are_503s_and_health_says_why(
    unwritable: Unwritable, tmp_path: Path
) -> None:
    settings = settings_for(tmp_path, unwritable.url)
    with (
        serving(settings, ScriptedRuntime()) as api,
        httpx.Client(base_url=api, timeout=60) as client,
    ):
        model = register_tiny_gguf(client, tmp_path)
        assert _database(client) == {"component": "database", "status": "ok"}
        write_gguf_model(tmp_path / "second.gguf")
        unwritable.stop_writes()
        refused = {
            "register": client.post(
                "/models/", json={"name": "second", "path": str(tmp_path / "second.gguf")}
            ),
            "deploy": deploy(client, model["id"], vram_allocation=GIB),
            "delete": client.delete(f"/models/{model['id']}"),
        }
        for what, answer in refused.items():
            assert answer.status_code == 503, (what, answer.text)
            assert answer.headers["content-type"] == "application/json", what
            detail = answer.json()["detail"]
            assert detail.startswith("cannot write to database "), (what, detail)
            assert unwritable.reason in detail, (what, detail)
        # The reason is the last failed write's: a transaction of the server's own that the
        # failover cut (PostgreSQL) may fail after the requests above, and then the next of
        # its writes says read-only again.
        database = wait_for(
            lambda: (
                (entry := _database(client)).get("status") == "failing"
                and unwritable.reason in entry["reason"]
                and entry
            )
        )
        assert "since" in database
        # Nothing stored is lost, and reads go on.
        assert [m["id"] for m in client.get("/models/").json()] == [model["id"]]
        assert client.get("/serving/deployments").json() == []
        unwritable.allow_writes()
        # One write that changes a row clears it; written again while a transaction cut by
        # the failover may still report its failure after one.
        attempts = iter(range(1000))

        def written_and_healthy() -> bool:
            name = f"after-{next(attempts)}"
            write_gguf_model(tmp_path / f"{name}.gguf")
            again = client.post(
                "/models/", json={"name": name, "path": str(tmp_path / f"{name}.gguf")}
            )
            assert again.status_code == 201, again.text
            return _database(client) == {"component": "database", "status": "ok"}

        wait_for(written_and_healthy, interval_s=0.2)


def test_the_download_worker_goes_on_through_a_database_that_takes_no_writes(
    unwritable: Unwritable, tmp_path: Path, caplog: pytest.LogCaptureFixture
) -> None:
    """The worker claims a queued file with a write. While the database refuses writes each
    claim fails, is logged, and the worker tries again: it never dies of the fault. (It is
    stopped before writes come back, so it never reaches for the Hub.)"""
    db = Database(unwritable.url)
    db.migrate()
    write_gguf_model(tmp_path / "tiny.gguf")
    model = register_model(db, Registration(name="tiny", path=str(tmp_path / "tiny.gguf")))
    (file,) = model.files
    store_downloads.queue(db, [_download(model.id, file.id)])
    unwritable.stop_writes()
    worker = Downloader(db, data_dir=tmp_path / "data")
    caplog.set_level(logging.WARNING, logger=Downloader.__module__)

    def refused_claims() -> int:
        return sum(unwritable.reason in r.getMessage() for r in caplog.records)

    worker.start()
    try:
        wait_for(lambda: refused_claims() >= 2, timeout_s=60)
        assert worker._thread is not None and worker._thread.is_alive()
    finally:
        worker.stop()
        unwritable.allow_writes()
        db.dispose()
    assert not worker._thread.is_alive()


def _download(model_id: str, file_id: str) -> NewDownload:
    return NewDownload(
        model_id=model_id,
        file_id=file_id,
        repo_id="example/tiny",
        revision="main",
        filename="tiny.gguf",
        size_bytes=None,
        sha256=None,
        blob_id=None,
        to_cache=False,
    )


def test_a_deploy_racing_its_models_delete_is_a_404_naming_the_model(
    database_url: str, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """The delete is made real, on the server's own database, at the store's seam: after
    admission has read and sized the model, before it inserts the deployment (the moment a
    concurrent DELETE /models/{id} can land)."""
    with scripted_client(tmp_path, database_url) as client:
        model = register_tiny_gguf(client, tmp_path)
        create = store_deployments.create

        def deleted_first(db: Database, new: NewDeployment, **options: Any) -> Any:
            catalog.delete_model(db, new.model_id)
            return create(db, new, **options)

        monkeypatch.setattr(store_deployments, "create", deleted_first)
        answer = deploy(client, model["id"], vram_allocation=GIB)
        monkeypatch.undo()
        assert answer.status_code == 404, answer.text
        assert answer.json() == {"detail": f"model {model['id']} not found"}
        assert client.get("/serving/deployments").json() == []
        assert client.get(f"/models/{model['id']}").status_code == 404


def _stored(data_dir: Path, fleet: Fleet = T4_FLEET) -> Path:
    """A database as `cohabit serve --data-dir data_dir` leaves it, closed."""
    data_dir.mkdir(parents=True)
    path = data_dir / "cohabit.db"
    db = Database(f"sqlite:///{path}")
    db.migrate()
    ledger.save_fleet(db, fleet)
    db.dispose()
    return path


def _damaged(path: Path, _monkeypatch: pytest.MonkeyPatch) -> str:
    damage_a_page(path)
    return f"database file {path} is damaged ("


def _newer(path: Path, _monkeypatch: pytest.MonkeyPatch) -> str:
    from_the_future(f"sqlite:///{path}")
    return (
        f"database {path} was written by a newer cohabit: its schema revision {FUTURE_REVISION!r}"
    )


def _read_only(path: Path, monkeypatch: pytest.MonkeyPatch) -> str:
    """Opened read-only, as SQLite opens a file its user cannot write (file modes do not
    stop root, which the tests run as; `mode=ro` is the same open for everyone)."""
    monkeypatch.setenv("COHABIT_DATABASE_URL", f"sqlite:///file:{path}?mode=ro&uri=true")
    return f"cannot write to database file:{path}: attempt to write a readonly database"


@pytest.mark.parametrize("fault", [_damaged, _newer, _read_only], ids=lambda f: f.__name__[1:])
def test_serve_refuses_a_database_it_cannot_use_in_one_line(
    tmp_path: Path,
    monkeypatch: pytest.MonkeyPatch,
    fault: Callable[[Path, pytest.MonkeyPatch], str],
) -> None:
    path = _stored(tmp_path / "data")
    expected = fault(path, monkeypatch)
    # A token, so that no other line (the no-token notice) is printed before the error.
    monkeypatch.setenv("COHABIT_API_TOKEN", "store-faults-test-token")
    (tmp_path / "fleet.yaml").write_text(
        "nodes:\n  - name: node-a\n    gpus: [{index: 0, vendor: nvidia, product: T4, "
        "memory: 16GiB}]\n"
    )
    result = run_cli(
        "serve",
        "--fleet",
        str(tmp_path / "fleet.yaml"),
        "--data-dir",
        str(tmp_path / "data"),
    )
    assert result.returncode == 2, result.stderr
    assert "Traceback" not in result.stderr
    (line,) = result.stderr.strip().splitlines()
    assert line.startswith(f"error: {expected}"), line
