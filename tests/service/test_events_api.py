"""`GET /serving/deployment/{id}/events` over real HTTP (the app on a loopback port, SQLite;
engines: the in-process double) and the SDK's calls on it: pages come oldest first with the
cursor a follower resumes from, and `ended` once the deployment has ended; an unknown
deployment is a 404 and a bad cursor or limit a 422; the sync and async streams end with the
closing event (a follower started while it serves ends when it is stopped)."""

from __future__ import annotations

import asyncio
import threading
from collections.abc import Iterator
from pathlib import Path
from uuid import UUID

import httpx
import pytest

from cohabit.runtime.tinymodel import write_tiny_model
from cohabit.sdk import AsyncClient, Client, DeploymentEvent
from cohabit.units import GIB
from tests.sdk.live import FAST
from tests.service.scripted_runtime import ScriptedRuntime
from tests.service.server import serving, settings_for

SERVED = ["requested", "placed", "reserved", "started", "healthy"]


@pytest.fixture
def api(tmp_path: Path) -> Iterator[str]:
    settings = settings_for(tmp_path, f"sqlite:///{tmp_path / 'cohabit.db'}")
    with serving(settings, ScriptedRuntime()) as root:
        yield root


def deployed(client: Client, tmp_path: Path) -> UUID:
    model = client.models.add_model(write_tiny_model(tmp_path / "tiny.gguf"), name="tiny")
    return client.serving.deploy_model(model.id, vram_allocation=2 * GIB, **FAST)


def test_pages_resume_from_their_cursor_until_the_end(api: str, tmp_path: Path) -> None:
    with Client(api) as client:
        deployment_id = deployed(client, tmp_path)
        whole = client.serving.get_deployment_events(deployment_id)
        assert [e.kind for e in whole.events] == SERVED
        assert (whole.status, whole.ended, whole.cursor) == ("DEPLOYED", False, whole.events[-1].id)

        first = client.serving.get_deployment_events(deployment_id, limit=2)
        rest = client.serving.get_deployment_events(deployment_id, after=first.cursor)
        assert first.cursor == first.events[-1].id
        assert [e.id for e in first.events + rest.events] == [e.id for e in whole.events]
        caught_up = client.serving.get_deployment_events(deployment_id, after=rest.cursor)
        assert (caught_up.events, caught_up.cursor) == ([], rest.cursor)

        assert client.serving.stop_deployment(deployment_id) is True
        last = client.serving.get_deployment_events(deployment_id, after=rest.cursor)
        assert [e.kind for e in last.events] == ["stopped"]
        assert (last.status, last.ended) == ("STOPPED", True)


@pytest.mark.parametrize(
    ("path", "status", "says"),
    [
        ("/serving/deployment/00000000-0000-0000-0000-000000000001/events", 404, "not found"),
        ("/serving/deployment/not-a-uuid/events", 422, "deployment_id"),
        ("/serving/deployment/00000000-0000-0000-0000-000000000001/events?after=-1", 422, "after"),
        ("/serving/deployment/00000000-0000-0000-0000-000000000001/events?limit=0", 422, "limit"),
        (
            "/serving/deployment/00000000-0000-0000-0000-000000000001/events?limit=1001",
            422,
            "limit",
        ),
    ],
    ids=["unknown-deployment", "not-an-id", "negative-cursor", "zero-limit", "limit-too-big"],
)
def test_bad_requests_are_answered_with_what_is_wrong(
    api: str, path: str, status: int, says: str
) -> None:
    answer = httpx.get(f"{api}{path}", timeout=30)
    assert answer.status_code == status, answer.text
    assert says in answer.text


def test_a_follower_started_while_it_serves_ends_when_it_is_stopped(
    api: str, tmp_path: Path
) -> None:
    with Client(api) as client:
        deployment_id = deployed(client, tmp_path)
        seen: list[DeploymentEvent] = []

        def follow() -> None:
            for event in client.serving.stream_deployment_events(deployment_id, poll_interval=0.05):
                seen.append(event)

        follower = threading.Thread(target=follow)
        follower.start()
        try:
            while len(seen) < len(SERVED):
                follower.join(0.05)
                assert follower.is_alive(), "the follower ended while the deployment served"
            assert client.serving.stop_deployment(deployment_id) is True
        finally:
            follower.join(30)
        assert not follower.is_alive()
        assert [e.kind for e in seen] == [*SERVED, "stopped"]


def test_the_async_stream_of_an_ended_deployment_ends_after_its_last_event(
    api: str, tmp_path: Path
) -> None:
    with Client(api) as client:
        deployment_id = deployed(client, tmp_path)
        client.serving.stop_deployment(deployment_id)

    async def read() -> list[str]:
        async with AsyncClient(api) as client:
            page = await client.serving.get_deployment_events(deployment_id, limit=1)
            assert [e.kind for e in page.events] == ["requested"] and page.ended
            return [
                e.kind
                async for e in client.serving.stream_deployment_events(
                    deployment_id, after=page.cursor, poll_interval=0.05
                )
            ]

    assert asyncio.run(read()) == [*SERVED[1:], "stopped"]
