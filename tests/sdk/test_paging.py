"""The SDK reads every page of a list route, sync and async: on a real server (loopback) that
holds more models and deployments than the server's default pages (tests/sdk/crowded.py),
the list calls answer every record in the server's order, the `iter_*` calls walk pages of
any size without gaps or repeats, and finding a model by id, name or repo id sees past the
first page."""

from __future__ import annotations

import asyncio
from collections.abc import Iterator
from uuid import UUID

import pytest

from cohabit.sdk import AsyncClient, Client
from cohabit.sdk.paging import PAGE_SIZE
from tests.sdk.crowded import LAST, Crowded, crowded_server


@pytest.fixture(scope="module")
def crowded(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Crowded]:
    with crowded_server(tmp_path_factory.mktemp("crowded")) as server:
        yield server


def ids(items: object) -> list[str]:
    return [str(item.id) for item in items]  # type: ignore[attr-defined]


def test_the_list_calls_answer_every_record(crowded: Crowded) -> None:
    with Client(crowded.api) as client:
        assert ids(client.models.list_models()) == crowded.models
        assert ids(client.serving.list_deployments()) == crowded.ended
        mine = client.serving.list_deployments(crowded.first_model_id)
        assert ids(mine) == crowded.ended
        assert client.serving.list_deployments(crowded.models[-1]) == []


@pytest.mark.parametrize("page_size", [1, 7, 100, PAGE_SIZE])
def test_iterating_walks_every_page_once(crowded: Crowded, page_size: int) -> None:
    with Client(crowded.api) as client:
        assert ids(client.serving.iter_deployments(page_size=page_size)) == crowded.ended
        if page_size >= 7:  # a thousand one-model requests would only be slow
            assert ids(client.models.iter_models(page_size=page_size)) == crowded.models


def test_iterating_reads_pages_only_as_they_are_used(crowded: Crowded) -> None:
    with Client(crowded.api) as client:
        walk = client.serving.iter_deployments(page_size=3)
        assert [str(next(walk).id) for _ in range(4)] == crowded.ended[:4]
        assert ids(walk) == crowded.ended[4:]


def test_finding_a_model_past_the_first_page(crowded: Crowded) -> None:
    last_id = crowded.models[-1]
    with Client(crowded.api) as client:
        assert str(client.models.find_model(LAST).id) == last_id
        assert str(client.models.find_model(last_id).id) == last_id
        assert client.models.find_model(last_id.upper()).name == LAST
        with pytest.raises(ValueError, match="no model 'nothing-by-this-name'"):
            client.models.find_model("nothing-by-this-name")
        with pytest.raises(ValueError, match=f"no model '{UUID(int=7)}'"):
            client.models.find_model(str(UUID(int=7)))  # an id nothing has


@pytest.mark.parametrize("page_size", [0, PAGE_SIZE + 1])
def test_a_page_size_the_server_refuses_is_refused_here(crowded: Crowded, page_size: int) -> None:
    with Client(crowded.api) as client, pytest.raises(ValueError, match="page_size must be"):
        client.serving.iter_deployments(page_size=page_size)


def test_the_async_client_reads_every_page(crowded: Crowded) -> None:
    async def scenario() -> tuple[list[str], ...]:
        async with AsyncClient(crowded.api) as client:
            models = await client.models.list_models()
            deployments = await client.serving.list_deployments()
            walked = [d async for d in client.serving.iter_deployments(page_size=7)]
            paged_models = [m async for m in client.models.iter_models(page_size=300)]
            found = await client.models.find_model(LAST)
            by_id = await client.models.find_model(crowded.models[-1])
            return (
                ids(models),
                ids(deployments),
                ids(walked),
                ids(paged_models),
                ids([found, by_id]),
            )

    models, deployments, walked, paged_models, found = asyncio.run(scenario())
    assert models == paged_models == crowded.models
    assert deployments == walked == crowded.ended
    assert found == [crowded.models[-1]] * 2
