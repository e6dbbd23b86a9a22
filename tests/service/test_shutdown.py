"""A server shutting down cleanly: the reconciler stops, the `stop_engines` hook (what
`cohabit serve` passes: the local runtime's stop_all, unless --keep-engines) runs once, and the
server hands its deployments back — they keep their status and budget, with no lease, so the
next start takes them over at once. Engines are the scripted double; the app runs in-process
(FastAPI's TestClient drives its lifespan)."""

from __future__ import annotations

import time
from pathlib import Path

from fastapi.testclient import TestClient

from cohabit.service.app import Backend, create_app
from cohabit.store import deployments
from cohabit.store.database import Database
from cohabit.store.records import DeploymentStatus
from cohabit.units import GIB
from tests.estimate.tinymodels import write_gguf_model
from tests.service.scripted_runtime import ScriptedRuntime
from tests.service.server import T4_FLEET, settings_for


def test_shutdown_stops_engines_and_hands_deployments_back(
    tmp_path: Path, database_url: str
) -> None:
    calls: list[str] = []
    settings = settings_for(tmp_path, database_url).model_copy(update={"lease_s": 60.0})
    app = create_app(
        settings,
        Backend(
            runtime=ScriptedRuntime(),
            fleet=T4_FLEET,
            stop_engines=lambda: calls.append("stop_engines"),
        ),
    )
    model = tmp_path / "tiny.gguf"
    write_gguf_model(model)
    with TestClient(app, base_url="http://127.0.0.1") as client:
        model_id = client.post("/api/models/", json={"path": str(model)}).json()["id"]
        body = {"m_id": model_id, "vram_allocation": 6 * GIB}
        deployment_id = client.post("/api/serving/deploy_model", json=body).json()
        deadline = time.monotonic() + 20
        while client.get(f"/api/serving/deployment/{deployment_id}").json()["status"] != (
            "DEPLOYED"
        ):
            assert time.monotonic() < deadline
            time.sleep(0.05)
        assert calls == []
    assert calls == ["stop_engines"]
    db = Database(database_url)
    try:
        record = deployments.get(db, deployment_id)
    finally:
        db.dispose()
    assert record.status is DeploymentStatus.DEPLOYED  # desired state survives the server
    assert (record.claimed_by, record.claimed_until) == (None, None)
    assert record.placement is not None  # its budget is still held
