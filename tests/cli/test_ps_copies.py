"""`cohabit ps` shows a deployment's copies: serving over running in the COPIES column, and
with --verbose one line per copy (its status, place, budget and engine). Run as a user runs
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

from cohabit.units import GIB
from tests.conftest import run_cli
from tests.service.server import deploy, register_tiny_gguf, scripted_client, wait_for


@pytest.fixture
def client(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Iterator[httpx.Client]:
    with scripted_client(tmp_path, f"sqlite:///{tmp_path / 'cohabit.db'}") as http:
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
    short = deployment_id[:8]
    table = ps()
    assert re.search(rf"{short}\s+tiny\s+DEPLOYED\s+2/2\s+node-a gpu 0\s", table), table
    assert "copy 1" not in table

    verbose = ps("-v")
    for instance in record["instances"]:
        index, url = instance["extra_details"]["copy_index"], instance["extra_details"]["base_url"]
        line = rf"copy {index}\s+DEPLOYED\s+node-a gpu 0\s+1 GiB\s+{re.escape(url)}/v1"
        assert re.search(line, verbose), verbose
    assert verbose.index("copy 0") < verbose.index("copy 1")

    (shown,) = json.loads(ps("--json"))
    assert (shown["copies"], shown["ready_copies"], len(shown["instances"])) == (2, 2, 2)

    assert client.delete(f"/serving/deployment/{deployment_id}").json() is True
    ended = ps("--all")
    assert re.search(rf"{short}\s+tiny\s+STOPPED\s+-\s", ended), ended
