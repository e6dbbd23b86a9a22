"""A deployment of two copies as the API shows it, over real HTTP on SQLite and PostgreSQL
(the scripted engine double stands in for the engines): one deployment listed, DEPLOYED, with
one instance per copy in the reference shape, each its own; the instance routes list the
copies; a copy's own id is a 404 naming its deployment; /metrics counts the ready copies;
the list shows a copy's change (its memory sample, its end) even when copy 0's row did not
change."""

from __future__ import annotations

import uuid
from collections.abc import Iterator
from typing import Any

import httpx
import pytest

from cohabit.runtime.interface import handle_from_json
from cohabit.store import deployments
from cohabit.store.database import Database, utcnow
from cohabit.store.memory import MemorySample, save_samples
from cohabit.store.records import DeploymentFailure, DeploymentRecord, DeploymentStatus
from cohabit.units import GIB, MIB
from tests.service.server import deploy, register_tiny_gguf, scripted_client, wait_for
from tests.service.test_metrics import parse, value


@pytest.fixture
def client(tmp_path: Any, database_url: str) -> Iterator[httpx.Client]:
    with scripted_client(tmp_path, database_url) as http:
        yield http


@pytest.fixture
def db(database_url: str) -> Iterator[Database]:
    database = Database(database_url)
    yield database
    database.dispose()


def two_copies(client: httpx.Client, tmp_path: Any) -> dict[str, Any]:
    model = register_tiny_gguf(client, tmp_path)
    response = deploy(client, model["id"], vram_allocation=GIB, starting_copies=2)
    assert response.status_code == 202, response.text
    path = f"/serving/deployment/{response.json()}"
    record: dict[str, Any] = wait_for(
        lambda: (r := client.get(path).json())["ready_copies"] == 2 and r
    )
    return record


def instance_id(copy: DeploymentRecord) -> str:
    return str(uuid.uuid5(uuid.NAMESPACE_URL, f"cohabit:instance:{copy.id}"))


def test_each_copy_is_an_instance_of_its_own(
    client: httpx.Client, db: Database, tmp_path: Any
) -> None:
    record = two_copies(client, tmp_path)
    deployment_id = record["id"]
    assert (record["status"], record["copies"], record["ready_copies"]) == ("DEPLOYED", 2, 2)
    copies = deployments.copies_of(db, deployment_id)
    assert [c.copy_index for c in copies] == [0, 1] and copies[1].copy_of == deployment_id
    by_copy = {i["extra_details"]["copy_index"]: i for i in record["instances"]}
    assert sorted(by_copy) == [0, 1]
    for copy in copies:
        shown = by_copy[copy.copy_index]
        handle = handle_from_json(copy.engine_handle)
        assert handle is not None and copy.placement is not None
        assert shown["id"] == instance_id(copy)
        assert shown["deployment_id"] == deployment_id  # the deployment's, not the copy's
        assert shown["status"] == "DEPLOYED"
        assert shown["host_name"] == copy.placement.node_name
        assert shown["listen_port"] == handle.port
        details = shown["extra_details"]
        assert details["base_url"] == handle.base_url
        assert details["gpu_indices"] == list(copy.placement.gpu_indices)
        assert details["allocated_bytes"] == copy.placement.allocated_bytes
    assert by_copy[0]["listen_port"] != by_copy[1]["listen_port"]

    # The instance routes: by deployment, all of them, and one by its id.
    listed = client.get("/serving/model_instances", params={"deployment_id": deployment_id})
    assert [i["id"] for i in listed.json()] == [instance_id(c) for c in copies]
    every = {i["id"] for i in client.get("/serving/model_instances").json()}
    assert every == {instance_id(c) for c in copies}
    one = client.get(f"/serving/model_instance/{instance_id(copies[1])}").json()
    assert one["extra_details"]["copy_index"] == 1

    # Copies are not deployments: listed once, and a copy's id is a 404 naming its deployment.
    page = client.get("/serving/deployments").json()
    assert [d["id"] for d in page] == [deployment_id]
    assert page[0]["ready_copies"] == 2 and len(page[0]["instances"]) == 2
    for path in ("", "/status", "/events"):
        answer = client.get(f"/serving/deployment/{copies[1].id}{path}")
        assert answer.status_code == 404, answer.text
        assert f"copy 1 of deployment {deployment_id}" in answer.json()["detail"]
    stop_copy = client.delete(f"/serving/deployment/{copies[1].id}")
    assert stop_copy.status_code == 404, stop_copy.text
    assert f"copy 1 of deployment {deployment_id}" in stop_copy.json()["detail"]
    assert client.get(f"/serving/deployment/{deployment_id}").json()["ready_copies"] == 2
    assert client.get(f"/serving/deployment/{deployment_id}/status").json() == "DEPLOYED"
    timeline = client.get(f"/serving/deployment/{deployment_id}/events").json()
    assert (timeline["status"], timeline["ended"]) == ("DEPLOYED", False)

    # A copy's log by its index; a copy it does not have is a 404.
    assert client.get(f"/serving/deployment/{deployment_id}/logs?copy=1").status_code == 200
    missing = client.get(f"/serving/deployment/{deployment_id}/logs?copy=7")
    assert missing.status_code == 404 and "has no copy 7" in missing.json()["detail"]

    root = str(client.base_url).rstrip("/").removesuffix("/api")
    samples = parse(httpx.get(f"{root}/metrics", timeout=30).text)
    labels = {"id": deployment_id, "model": "tiny"}
    assert value(samples, "cohabit_deployment_ready_copies", **labels) == 2
    assert value(samples, "cohabit_deployment_copies", **labels) == 2
    assert value(samples, "cohabit_deployment_budget_bytes", **labels) == 2 * GIB
    assert value(samples, "cohabit_deployment_status", status="DEPLOYED", **labels) == 1

    # Stopping ends every copy: no instance is left.
    assert client.delete(f"/serving/deployment/{deployment_id}").json() is True
    ended = client.get(f"/serving/deployment/{deployment_id}").json()
    assert (ended["status"], ended["copies"], ended["instances"]) == ("STOPPED", 0, [])


def test_the_list_shows_a_copy_that_changed_while_copy_0_did_not(
    client: httpx.Client, db: Database, tmp_path: Any
) -> None:
    record = two_copies(client, tmp_path)
    before = client.get("/serving/deployments").json()  # rendered and kept by the server
    assert before[0]["ready_copies"] == 2
    copy = deployments.copies_of(db, record["id"])[1]
    # The meter's sample of copy 1's engine shows on its instance.
    save_samples(db, {copy.id: MemorySample(used_bytes=300 * MIB, at=utcnow())})
    (sampled,) = client.get("/serving/deployments").json()
    used = {i["extra_details"]["copy_index"]: i["extra_details"].get("memory_used_bytes")
            for i in sampled["instances"]}  # fmt: skip
    assert used == {0: None, 1: 300 * MIB}
    failure = DeploymentFailure(status=DeploymentStatus.ERROR, code="OOM", message="killed")
    assert deployments.end(db, copy.id, failure=failure) is not None
    (after,) = client.get("/serving/deployments").json()
    assert (after["status"], after["copies"], after["ready_copies"]) == ("DEPLOYED", 1, 1)
    assert [i["extra_details"]["copy_index"] for i in after["instances"]] == [0]
