"""200 deploys at once against a small fleet (two nodes, four 16 GiB cards), sent to three
server processes that share one database, on SQLite and on PostgreSQL: no device is ever
over-reserved, and every deployment ends DEPLOYED or FAILED/NoFitError. Engines are the
scripted double inside each worker process."""

from __future__ import annotations

import random
import threading
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

import httpx
import pytest

from cohabit.store import deployments
from cohabit.store.database import Database
from cohabit.store.records import ACTIVE, NO_FIT_ERROR, DeploymentRecord, DeploymentStatus
from cohabit.units import GIB
from tests.estimate.tinymodels import write_gguf_model
from tests.service.processes import check_ledger, workers
from tests.service.server import wait_for

DEPLOYS = 200
SIZES_GIB = (1, 2, 3, 4, 6, 8)


def test_two_hundred_concurrent_deploys_never_over_reserve(
    tmp_path: Path, database_url: str, request: pytest.FixtureRequest
) -> None:
    write_gguf_model(tmp_path / "tiny.gguf")
    db = Database(database_url)
    request.addfinalizer(db.dispose)  # a failure must not leave its connections to the GC
    rng = random.Random(5)
    sizes = [rng.choice(SIZES_GIB) * GIB for _ in range(DEPLOYS)]
    with workers(database_url, tmp_path / "data", 3) as apis:
        model = httpx.post(f"{apis[0]}/models/", json={"path": str(tmp_path / "tiny.gguf")})
        model_id = model.json()["id"]

        stop_sampling = threading.Event()
        samples: list[int] = []

        def sample() -> None:  # the invariant holds at every moment, not only at the end
            while not stop_sampling.is_set():
                check_ledger(db)
                samples.append(1)
                stop_sampling.wait(0.02)

        sampler = threading.Thread(target=sample)
        sampler.start()
        try:

            def fire(index: int) -> str:
                response = httpx.post(
                    f"{apis[index % len(apis)]}/serving/deploy_model",
                    json={"m_id": model_id, "vram_allocation": sizes[index]},
                    timeout=120,
                )
                assert response.status_code == 202, response.text
                deployment_id: str = response.json()
                return deployment_id

            with ThreadPoolExecutor(max_workers=40) as pool:
                ids = list(pool.map(fire, range(DEPLOYS)))

            def settled() -> dict[str, DeploymentRecord] | None:
                """Every record, once one read finds none on its way. The outcome is that
                read's: a moment later a server whose lease ran out on a loaded machine may
                be taken over by another, which starts its (scripted) engine again, and as
                each server stops it lets go of its deployments for the same."""
                moving = ACTIVE - {DeploymentStatus.DEPLOYED}
                found = {r.id: r for r in deployments.list_all(db)}
                return None if any(r.status in moving for r in found.values()) else found

            records = wait_for(settled, timeout_s=120, interval_s=0.2)
            state = check_ledger(db)
        finally:
            stop_sampling.set()
            sampler.join(30)

    assert sorted(records) == sorted(ids)
    deployed = [r for r in records.values() if r.status is DeploymentStatus.DEPLOYED]
    refused = [r for r in records.values() if r.status is DeploymentStatus.FAILED]
    others = [
        (r.id, r.status.value, r.last_error_code, r.last_error_message)
        for r in records.values()
        if r.status not in {DeploymentStatus.DEPLOYED, DeploymentStatus.FAILED}
    ]
    assert not others  # every one ends DEPLOYED or refused
    assert len(deployed) + len(refused) == DEPLOYS
    assert all(r.last_error_code == NO_FIT_ERROR for r in refused)
    assert deployed and refused  # 200 requests ask for far more than 64 GiB
    held: dict[str, int] = {}
    for reservation in state.reservations:
        held[reservation.deployment] = (
            held.get(reservation.deployment, 0) + reservation.reserved_bytes
        )
    assert held == {r.id: r.requested_bytes for r in deployed}
    assert samples  # the sampler really ran
