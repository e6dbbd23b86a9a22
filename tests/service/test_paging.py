"""Paging of the list routes over real HTTP, on SQLite and PostgreSQL: a server holding 250
ended deployments (written through the store before it starts) and 3 live ones (deployed
through the API). The default deployments page holds every live deployment, then the newest
ended ones, as a plain JSON array the published kamiwaza client parses; `limit`/`offset`
walk the same order without gaps or repeats; bad values are a 422 naming the parameter; a
change shows at once although pages are rendered from a cache. The gateway's route by model
name picks the live deployment among the many ended ones of that name. Engines: the
in-process double (its engines listen nowhere, so a routed request ends in a 502 that names
the deployment it was routed to)."""

from __future__ import annotations

from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path

import httpx
import pytest
from kamiwaza_sdk import KamiwazaClient

from cohabit.runtime.interface import RuntimeErrorCode
from cohabit.service.api.paging import DEPLOYMENTS_LIMIT
from cohabit.store import deployments
from cohabit.store.database import Database
from cohabit.store.records import DeploymentFailure, DeploymentStatus
from cohabit.units import GIB
from tests.service.scripted_runtime import ScriptedRuntime
from tests.service.server import deploy, serving, settings_for, wait_status
from tests.store.helpers import add_deployment, add_model

ENDED = 250
LIVE = 3


@dataclass(frozen=True, slots=True, kw_only=True)
class Server:
    client: httpx.Client
    api: str
    model_id: str
    other_model_id: str
    ended: list[str]  # oldest request first
    live: list[str]  # oldest request first


def write_history(db: Database, model: tuple[str, str], count: int) -> list[str]:
    """`count` ended deployments, every third FAILED, the rest STOPPED."""
    ids = []
    for index in range(count):
        record = add_deployment(db, model, GIB)
        failure = None
        if index % 3 == 0:
            failure = DeploymentFailure(
                status=DeploymentStatus.FAILED,
                code=RuntimeErrorCode.OOM.value,
                message="CUDA out of memory",
            )
        deployments.end(db, record.id, failure=failure)
        ids.append(record.id)
    return ids


@pytest.fixture(scope="module")
def server(tmp_path_factory: pytest.TempPathFactory, module_database_url: str) -> Iterator[Server]:
    db = Database(module_database_url)
    db.migrate()
    model = add_model(db, "tiny")
    other = add_model(db, "other")
    ended = write_history(db, model, ENDED)
    db.dispose()
    settings = settings_for(tmp_path_factory.mktemp("paging"), module_database_url)
    with (
        serving(settings, ScriptedRuntime()) as api,
        httpx.Client(base_url=api, timeout=30) as client,
    ):
        live = []
        for _ in range(LIVE):
            response = deploy(client, model[0], vram_allocation=GIB)
            assert response.status_code == 202, response.text
            live.append(response.json())
            wait_status(client, live[-1], {"DEPLOYED"})
        yield Server(
            client=client,
            api=api,
            model_id=model[0],
            other_model_id=other[0],
            ended=ended,
            live=live,
        )


def listed(server: Server, **params: object) -> list[str]:
    response = server.client.get("/serving/deployments", params=params)
    assert response.status_code == 200, response.text
    return [item["id"] for item in response.json()]


def test_the_default_page_is_every_live_deployment_then_the_newest_ended(
    server: Server,
) -> None:
    page = server.client.get("/serving/deployments").json()
    assert isinstance(page, list)
    assert len(page) == DEPLOYMENTS_LIMIT
    assert [item["id"] for item in page[:LIVE]] == server.live
    assert {item["status"] for item in page[:LIVE]} == {"DEPLOYED"}
    newest_first = server.ended[::-1]
    assert [item["id"] for item in page[LIVE:]] == newest_first[: DEPLOYMENTS_LIMIT - LIVE]
    assert {item["status"] for item in page[LIVE:]} == {"STOPPED", "FAILED"}


def test_limit_and_offset_walk_the_whole_list_once(server: Server) -> None:
    everything = server.live + server.ended[::-1]
    walked: list[str] = []
    while True:
        page = listed(server, limit=37, offset=len(walked))
        walked += page
        if len(page) < 37:
            break
    assert walked == everything
    assert listed(server, limit=5, offset=LIVE + 10) == everything[LIVE + 10 : LIVE + 15]
    assert listed(server, limit=5, offset=1) == everything[1:6]  # across the boundary
    assert listed(server, limit=1000, offset=0) == everything
    assert listed(server, offset=len(everything)) == []


def test_model_id_narrows_the_page(server: Server) -> None:
    assert listed(server, model_id=server.other_model_id) == []
    assert (
        listed(server, model_id=server.model_id, limit=4) == (server.live + server.ended[::-1])[:4]
    )


@pytest.mark.parametrize(
    ("params", "name"),
    [
        ({"limit": 0}, "limit"),
        ({"limit": 1001}, "limit"),
        ({"limit": "ten"}, "limit"),
        ({"offset": -1}, "offset"),
        ({"offset": 2**31}, "offset"),
    ],
)
def test_bad_paging_values_are_a_422_naming_the_parameter(
    server: Server, params: dict[str, object], name: str
) -> None:
    for path in ("/serving/deployments", "/models/", "/model_configs/"):
        response = server.client.get(path, params=params)
        assert response.status_code == 422, (path, response.text)
        assert name in response.text


def test_a_change_shows_at_once(server: Server) -> None:
    """Pages come from rendered items kept per record content; a stop changes the content."""
    before = server.client.get("/serving/deployments").json()
    last = server.live[-1]
    assert server.client.delete(f"/serving/deployment/{last}").json() is True
    after = {item["id"]: item for item in server.client.get("/serving/deployments").json()}
    assert after[last]["status"] == "STOPPED"
    assert after[last]["stopped_at"] is not None
    assert [item["id"] for item in before][: LIVE - 1] == server.live[: LIVE - 1]
    assert listed(server)[: LIVE - 1] == server.live[: LIVE - 1]
    assert listed(server)[LIVE - 1] == last  # the newest of the ended now


def test_the_published_client_reads_the_default_page(server: Server) -> None:
    client = KamiwazaClient(base_url=server.api)
    listed_by_sdk = client.serving.list_deployments()
    assert len(listed_by_sdk) == DEPLOYMENTS_LIMIT
    assert {str(d.id) for d in listed_by_sdk} >= set(server.live[:-1])


def test_models_and_configs_page_oldest_first(server: Server, tmp_path: Path) -> None:
    models = [m["id"] for m in server.client.get("/models/").json()]
    assert models == [server.model_id, server.other_model_id]
    assert [m["id"] for m in server.client.get("/models/", params={"limit": 1}).json()] == [
        server.model_id
    ]
    second = server.client.get("/models/", params={"limit": 1, "offset": 1}).json()
    assert [m["id"] for m in second] == [server.other_model_id]
    assert second[0]["default_config"] == {"engine": "llamacpp"}
    configs = server.client.get("/model_configs/").json()
    assert [c["m_id"] for c in configs] == [server.model_id, server.other_model_id]
    assert server.client.get("/model_configs/", params={"offset": 1}).json() == configs[1:]
    one = server.client.get(f"/models/{server.model_id}/configs", params={"limit": 1}).json()
    assert one == configs[:1]


def test_routing_by_name_finds_the_live_deployment_among_the_ended(server: Server) -> None:
    root = server.api.removesuffix("/api")
    chat = {"messages": [{"role": "user", "content": "hi"}]}
    routed = httpx.post(f"{root}/v1/chat/completions", json={"model": "tiny", **chat})
    assert routed.status_code == 502, routed.text  # reached the (absent) engine of …
    assert f"deployment {server.live[0]} " in routed.json()["error"]["message"]
    by_id = httpx.post(f"{root}/v1/chat/completions", json={"model": server.live[1], **chat})
    assert f"deployment {server.live[1]} " in by_id.json()["error"]["message"]
    ended = httpx.post(f"{root}/v1/chat/completions", json={"model": server.ended[0], **chat})
    assert ended.status_code == 404
    assert ended.json()["error"]["code"] == "model_not_found"
    models = httpx.get(f"{root}/v1/models").json()["data"]
    assert [m["id"] for m in models] == ["tiny"]
