"""A deployment of two copies through both clients, against a cohabit server on a loopback
port (engines are the in-process double): cohabit's SDK parses the copy counts and one
instance per copy, and reads each copy's log; the published kamiwaza-sdk (1.3.0), unchanged,
deploys, waits, reads and lists it as one available deployment with two instances, and stops
it."""

from __future__ import annotations

import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any
from uuid import UUID

import httpx
import pytest
from kamiwaza_sdk import KamiwazaClient

from cohabit.sdk import Client
from cohabit.units import GIB
from tests.service.scripted_runtime import ScriptedRuntime
from tests.service.server import serving, settings_for
from tests.service.test_sdk import FAST, register

TOKEN = "s3cret"


@pytest.fixture
def api(tmp_path: Path, database_url: str, monkeypatch: pytest.MonkeyPatch) -> Iterator[str]:
    monkeypatch.delenv("KAMIWAZA_API_KEY", raising=False)
    runtime = ScriptedRuntime(log_dir=tmp_path / "logs")  # each engine's log named by its port
    with serving(settings_for(tmp_path, database_url, token=TOKEN), runtime) as root:
        yield root


def both_ready(read: Any, deployment_id: UUID) -> Any:
    """Poll until both copies serve (DEPLOYED comes with the first)."""
    deadline = time.monotonic() + 20
    while (deployment := read(deployment_id)).ready_copies != 2:
        assert time.monotonic() < deadline, deployment
        time.sleep(0.05)
    return deployment


def test_both_clients_read_a_deployment_of_two_copies(api: str, tmp_path: Path) -> None:
    kamiwaza = KamiwazaClient(base_url=api, api_key=TOKEN)
    model_id = register(kamiwaza, tmp_path)
    deployment_id = kamiwaza.serving.deploy_model(
        model_id=model_id, wait=True, vram_allocation=GIB, starting_copies=2, **FAST
    )
    with Client(base_url=api, api_key=TOKEN) as client:
        deployment = both_ready(client.serving.get_deployment, deployment_id)
        assert (deployment.status, deployment.copies) == ("DEPLOYED", 2)
        instances = sorted(deployment.instances, key=lambda i: i.copy_index)
        assert [i.copy_index for i in instances] == [0, 1]
        assert all(i.deployment_id == deployment_id for i in instances)
        assert len({i.id for i in instances}) == len({i.base_url for i in instances}) == 2
        listed = client.serving.list_model_instances(deployment_id)
        assert {i.id for i in listed} == {i.id for i in instances}
        (active,) = client.serving.list_active_deployments()
        assert active.id == deployment_id and active.is_available
        for instance in instances:  # each copy's own engine log
            logs = client.serving.get_deployment_logs(deployment_id, copy=instance.copy_index)
            assert logs.log_file_path == str(tmp_path / "logs" / f"{instance.listen_port}.log")
        # The engine's log list names the deployment and the copy of each file.
        listed = httpx.get(
            f"{api}/serving/logs/llamacpp", headers={"Authorization": f"Bearer {TOKEN}"}
        ).json()["logs"]
        assert sorted(
            (e["deployment_id"], e["copy_index"], e["log_file_path"]) for e in listed
        ) == [
            (str(deployment_id), str(i.copy_index), str(tmp_path / "logs" / f"{i.listen_port}.log"))
            for i in instances
        ]

    seen = kamiwaza.serving.get_deployment(deployment_id)
    assert seen.status == "DEPLOYED" and len(seen.instances) == 2
    assert {i.status for i in seen.instances} == {"DEPLOYED"}
    (active,) = kamiwaza.serving.list_active_deployments()
    assert active.id == deployment_id and active.is_available
    assert len(kamiwaza.serving.list_model_instances(deployment_id)) == 2
    assert kamiwaza.serving.stop_deployment(deployment_id) is True
    assert kamiwaza.serving.get_deployment(deployment_id).status == "STOPPED"
