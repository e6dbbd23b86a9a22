"""SIGKILL a server mid-deploy, start it again on the same database, and check that nothing is
lost: no reservation without a live deployment, no live deployment without its reservation,
and every deployment still ends DEPLOYED (its engine relaunched inside the budget it held) or
FAILED/NoFitError. Engines are the scripted double in the worker process (slow to become
ready, so the kill lands while many are INITIALIZING)."""

from __future__ import annotations

import signal
from pathlib import Path

import httpx

from cohabit.store import deployments
from cohabit.store.database import Database
from cohabit.store.records import ACTIVE, NO_FIT_ERROR, DeploymentStatus
from cohabit.units import GIB
from tests.estimate.tinymodels import write_gguf_model
from tests.service.processes import check_ledger, start_worker, stop_worker
from tests.service.server import wait_for

S = DeploymentStatus
SLOW = ("--ready-after", "40", "--lease-s", "1")


def test_sigkill_mid_deploy_keeps_the_ledger_whole(tmp_path: Path, database_url: str) -> None:
    write_gguf_model(tmp_path / "tiny.gguf")
    db = Database(database_url)
    process, api = start_worker(database_url, tmp_path / "data", *SLOW)
    try:
        model_id = httpx.post(f"{api}/models/", json={"path": str(tmp_path / "tiny.gguf")}).json()[
            "id"
        ]
        ids = [
            httpx.post(
                f"{api}/serving/deploy_model",
                json={"m_id": model_id, "vram_allocation": 6 * GIB},
                timeout=30,
            ).json()
            for _ in range(14)
        ]
        wait_for(
            lambda: any(r.status is S.INITIALIZING for r in deployments.list_all(db)),
            timeout_s=30,
        )
        process.send_signal(signal.SIGKILL)
        process.wait(30)
    finally:
        stop_worker(process)

    mid = deployments.list_all(db)
    assert any(r.status is S.INITIALIZING for r in mid)  # killed mid-deploy
    check_ledger(db)

    process, api = start_worker(database_url, tmp_path / "data", *SLOW)
    try:

        def settled() -> bool:
            moving = ACTIVE - {S.DEPLOYED}
            records = deployments.list_all(db)
            check_ledger(db)  # holds at every moment of the recovery too
            return not any(r.status in moving for r in records)

        wait_for(settled, timeout_s=60, interval_s=0.1)
    finally:
        stop_worker(process)

    records = deployments.list_all(db)
    assert sorted(r.id for r in records) == sorted(ids)
    deployed = [r for r in records if r.status is S.DEPLOYED]
    refused = [r for r in records if r.status is S.FAILED]
    assert len(deployed) == 8  # 4 cards × two 6 GiB budgets each (12 of 16 GiB)
    assert len(refused) == 6 and all(r.last_error_code == NO_FIT_ERROR for r in refused)
    state = check_ledger(db)
    assert {r.deployment for r in state.reservations} == {r.id for r in deployed}
    db.dispose()
