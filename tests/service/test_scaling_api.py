"""The scaling fields at the API's edge, over real HTTP on SQLite and PostgreSQL: each bad value
is a 422 naming its field with nothing stored; good ones are stored once and shown as
admitted; `starting_copies: 0` is admitted UNLOADED, listed and stoppable; `starting_copies`
engines run, one instance each."""

from __future__ import annotations

from collections.abc import Iterator
from datetime import datetime
from typing import Any

import httpx
import pytest

from tests.service.server import (
    deploy,
    register_tiny_gguf,
    scripted_client,
    wait_for,
    wait_status,
)

BIG = 10**12  # beyond a 32-bit column: must be refused before the store sees it


@pytest.fixture(scope="module")
def client(
    tmp_path_factory: pytest.TempPathFactory, module_database_url: str
) -> Iterator[httpx.Client]:
    with scripted_client(tmp_path_factory.mktemp("scaling"), module_database_url) as http:
        yield http


@pytest.fixture(scope="module")
def model(client: httpx.Client, tmp_path_factory: pytest.TempPathFactory) -> dict[str, Any]:
    return register_tiny_gguf(client, tmp_path_factory.mktemp("tiny"))


@pytest.mark.parametrize(
    ("body", "field", "words"),
    [
        ({"priority": 1001}, "priority", "less than or equal to 1000"),
        ({"priority": -1001}, "priority", "greater than or equal to -1000"),
        ({"priority": BIG}, "priority", "less than or equal to 1000"),
        ({"priority": 1.5}, "priority", "integer"),
        ({"keep_alive": -2}, "keep_alive", "greater than or equal to -1"),
        ({"keep_alive": BIG}, "keep_alive", "less than or equal to"),
        ({"keep_alive": "5m"}, "keep_alive", "integer"),
        ({"queue": "maybe"}, "queue", "boolean"),
        ({"duration": 0}, "duration", "greater than or equal to 1"),
        ({"duration": BIG}, "duration", "less than or equal to"),
        ({"min_copies": BIG}, "min_copies", "less than or equal to 1000"),
        ({"min_copies": 2}, "starting_copies", "starting_copies 1 is below min_copies 2"),
        ({"starting_copies": 3, "max_copies": 2}, "max_copies", "below starting_copies 3"),
        ({"min_copies": 0, "max_copies": 0}, "max_copies", "greater than or equal to 1"),
    ],
    ids=lambda value: (
        "-".join(f"{k}={v}" for k, v in value.items()) if isinstance(value, dict) else None
    ),
)
def test_bad_scaling_values_are_a_422_naming_the_field(
    client: httpx.Client, model: dict[str, Any], body: dict[str, Any], field: str, words: str
) -> None:
    before = client.get("/serving/deployments").json()
    response = deploy(client, model["id"], vram_allocation=2**30, **body)
    assert response.status_code == 422, response.text
    (problem,) = response.json()["detail"]
    assert problem["loc"] == ["body", field]
    assert words in problem["msg"]
    assert client.get("/serving/deployments").json() == before


def test_scaling_fields_are_stored_and_shown_as_admitted(
    client: httpx.Client, model: dict[str, Any]
) -> None:
    response = deploy(
        client,
        model["id"],
        vram_allocation=2**30,
        priority=-5,
        keep_alive=-1,
        queue=True,
        duration=90,
        min_copies=0,
        starting_copies=2,
        max_copies=3,
    )
    assert response.status_code == 202, response.text
    record = wait_status(client, response.json(), {"DEPLOYED"})
    shown = {key: record[key] for key in ("priority", "keep_alive", "queue", "duration")}
    assert shown == {"priority": -5, "keep_alive": -1, "queue": True, "duration": 90}
    copies = [record[key] for key in ("min_copies", "starting_copies", "max_copies")]
    assert copies == [0, 2, 3]
    ends = datetime.fromisoformat(record["ends_at"]) - datetime.fromisoformat(
        record["requested_at"]
    )
    assert ends.total_seconds() == 90 * 60
    record = wait_for(
        lambda: (
            (r := client.get(f"/serving/deployment/{response.json()}").json())["ready_copies"] == 2
            and r
        )
    )
    assert record["copies"] == 2 and len(record["instances"]) == 2  # both copies run
    assert "SingleCopy" not in record["notices"]
    assert client.delete(f"/serving/deployment/{record['id']}").json() is True


def test_defaults_are_one_copy_kept_five_minutes(
    client: httpx.Client, model: dict[str, Any]
) -> None:
    response = deploy(client, model["id"], vram_allocation=2**30)
    record = client.get(f"/serving/deployment/{response.json()}").json()
    defaults = {
        key: record[key]
        for key in ("priority", "keep_alive", "queue", "duration", "ends_at", "min_copies")
    }
    assert defaults == {
        "priority": 0,
        "keep_alive": 300,
        "queue": False,
        "duration": None,
        "ends_at": None,
        "min_copies": 1,
    }
    assert "SingleCopy" not in record["notices"]
    client.delete(f"/serving/deployment/{record['id']}")


def test_starting_with_no_copy_is_unloaded_listed_and_stoppable(
    client: httpx.Client, model: dict[str, Any]
) -> None:
    response = deploy(client, model["id"], vram_allocation=2**30, min_copies=0, starting_copies=0)
    assert response.status_code == 202, response.text
    deployment_id = response.json()
    record = client.get(f"/serving/deployment/{deployment_id}").json()
    assert record["status"] == "UNLOADED"
    assert record["instances"] == [] and record["node_name"] is None
    assert client.get(f"/serving/deployment/{deployment_id}/status").json() == "UNLOADED"
    listed = client.get("/serving/deployments").json()
    assert [d["status"] for d in listed if d["id"] == deployment_id] == ["UNLOADED"]
    assert client.delete(f"/serving/deployment/{deployment_id}").json() is True
    assert client.get(f"/serving/deployment/{deployment_id}").json()["status"] == "STOPPED"
