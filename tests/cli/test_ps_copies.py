"""`cohabit ps` shows a deployment's copies: serving over running in the COPIES column, and
with --verbose one line per copy (its status, place, budget and engine); a queued one shows
its place in the queue; `cohabit logs --copy N` reads copy N's engine log. Run as a user runs
it (a subprocess) against a real server over HTTP, with the scripted engine double in place
of the engines."""

from __future__ import annotations

import json
import re
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import httpx
import pytest

from cohabit.cli.ps import copies
from cohabit.sdk import Deployment
from cohabit.units import GIB
from tests.conftest import run_cli
from tests.service.scripted_runtime import ScriptedRuntime
from tests.service.server import (
    deploy,
    register_tiny_gguf,
    serving,
    settings_for,
    wait_for,
    wait_status,
)


@pytest.fixture
def client(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Iterator[httpx.Client]:
    settings = settings_for(tmp_path, f"sqlite:///{tmp_path / 'cohabit.db'}")
    runtime = ScriptedRuntime(log_dir=tmp_path / "logs")  # each engine's log named by its port
    with serving(settings, runtime) as api, httpx.Client(base_url=api, timeout=30) as http:
        monkeypatch.setenv("COHABIT_BASE_URL", str(http.base_url).rstrip("/"))
        monkeypatch.setenv("COLUMNS", "200")  # one table line per row
        yield http


def ps(*args: str) -> str:
    result = run_cli("ps", *args)
    assert result.returncode == 0, result.stderr
    return result.stdout


def test_ps_shows_copies_and_one_line_per_copy(client: httpx.Client, tmp_path: Path) -> None:
    model = register_tiny_gguf(client, tmp_path)
    response = deploy(client, model["id"], vram_allocation=GIB, starting_copies=2)
    deployment_id = response.json()
    record: dict[str, Any] = wait_for(
        lambda: (
            (r := client.get(f"/serving/deployment/{deployment_id}").json())["ready_copies"] == 2
            and r
        )
    )
    # The card's rest taken, a deployment that asks to wait for room shows its place.
    assert wait_status(client, deploy(client, model["id"], vram_allocation=14 * GIB).json())
    waiting = deploy(client, model["id"], vram_allocation=2 * GIB, queue=True).json()
    shown = wait_for(
        lambda: (
            (r := client.get(f"/serving/deployment/{waiting}").json())["status"] == "QUEUED"
            and "queue_position" in (r["no_fit"] or {})
            and r
        )
    )
    assert shown["no_fit"]["queue_position"] == 1
    short = deployment_id[:8]
    table = ps()
    assert re.search(rf"{short}\s+tiny\s+DEPLOYED\s+2/2\s+node-a gpu 0\s", table), table
    assert re.search(rf"{waiting[:8]}\s+tiny\s+QUEUED\s+0/1\s.*\squeued #1\s", table), table
    assert "copy 1" not in table

    verbose = ps("-v")
    for instance in record["instances"]:
        index, url = instance["extra_details"]["copy_index"], instance["extra_details"]["base_url"]
        line = rf"copy {index}\s+DEPLOYED\s+node-a gpu 0\s+1 GiB\s+{re.escape(url)}/v1"
        assert re.search(line, verbose), verbose
    assert verbose.index("copy 0") < verbose.index("copy 1")

    # `cohabit logs --copy 1` reads copy 1's engine log.
    (copy_1,) = [i for i in record["instances"] if i["extra_details"]["copy_index"] == 1]
    logs = run_cli("logs", short, "--copy", "1", "--json")
    assert logs.returncode == 0, logs.stderr
    port = copy_1["listen_port"]
    assert json.loads(logs.stdout)["log_file_path"] == str(tmp_path / "logs" / f"{port}.log")

    (shown,) = [d for d in json.loads(ps("--json")) if d["id"] == deployment_id]
    assert (shown["copies"], shown["ready_copies"], len(shown["instances"])) == (2, 2, 2)

    assert client.delete(f"/serving/deployment/{deployment_id}").json() is True
    ended = ps("--all")
    assert re.search(rf"{short}\s+tiny\s+STOPPED\s+-\s", ended), ended


@pytest.mark.parametrize(
    ("fields", "shown"),
    [
        ({"status": "DEPLOYED", "copies": 2, "ready_copies": 1}, "1/2"),
        ({"status": "UNLOADED", "copies": 1, "ready_copies": 0}, "0/1"),
        ({"status": "STOPPED", "copies": 0, "ready_copies": 0}, "-"),
        ({"status": "DEPLOYED"}, "-"),  # a server from before copies says nothing of them
    ],
)
def test_the_copies_column(fields: dict[str, Any], shown: str) -> None:
    ids = {
        "id": "6c8fae52-6e82-42d7-a3b8-003f680db8cf",
        "m_id": "0e4c0d0e-54a4-4c39-9d1e-6d3f2d7f0a11",
    }
    assert copies(Deployment.model_validate(ids | fields)) == shown
