"""The commands see every record, not the server's first page: against a real server
(loopback) holding one model more than the default models page and one deployment more
than the default deployments page (tests/sdk/crowded.py), `models ls` lists them all,
`deploy` finds the last model by name and by id, `ps --all` lists every deployment, and a
deployment past the first page is found by its id prefix. The commands run in this process
(tests/cli/inprocess.py)."""

from __future__ import annotations

import json
from collections.abc import Iterator
from typing import Any

import pytest

from tests.cli.inprocess import invoke, succeeded
from tests.sdk.crowded import LAST, Crowded, crowded_server


@pytest.fixture(scope="module")
def crowded(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Crowded]:
    with crowded_server(tmp_path_factory.mktemp("crowded-cli")) as server:
        yield server


@pytest.fixture(autouse=True)
def reach(crowded: Crowded, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("COHABIT_BASE_URL", crowded.api)
    monkeypatch.delenv("COHABIT_API_TOKEN", raising=False)


def cli_json(*args: str) -> Any:
    result = invoke(*args, "--json")
    assert succeeded(result), result.output
    return json.loads(result.stdout)


def test_models_ls_lists_every_model(crowded: Crowded) -> None:
    assert [model["id"] for model in cli_json("models", "ls")] == crowded.models


def test_deploy_finds_the_last_model_by_name_and_id_and_ps_lists_everything(
    crowded: Crowded,
) -> None:
    by_name = cli_json("deploy", LAST, "--no-wait")
    by_id = cli_json("deploy", crowded.models[-1], "--no-wait")

    listed = [d["id"] for d in cli_json("ps", "--all")]
    assert listed == [by_name["id"], by_id["id"], *crowded.ended]

    stopped = cli_json("stop", LAST)
    assert sorted(stopped["stopped"]) == sorted([by_name["id"], by_id["id"]])


def test_a_deployment_past_the_first_page_is_found_by_its_id_prefix(crowded: Crowded) -> None:
    oldest = crowded.ended[-1]
    result = invoke("stop", oldest[:8])
    assert succeeded(result), result.output
    assert result.stdout.strip() == f"{oldest} had already ended"
    events = invoke("events", oldest[:10], "--json")
    assert succeeded(events), events.output
