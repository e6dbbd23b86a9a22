"""`cohabit ps` in a 120-column terminal keeps each deployment on one line — its endpoint shown
as the name the server's /v1 routes to it by, values too long cut with "…", class names
never split — and `--wide` shows each full endpoint. Run as a user runs it (a subprocess,
COLUMNS=120) against a real server over HTTP, with the scripted engine double in place of
the engines."""

from __future__ import annotations

import re
from collections.abc import Iterator
from pathlib import Path

import httpx
import pytest

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

NAMES = ("qwen2.5-0.5b-instruct-q4_k_m", "llama-3.1-8b-instruct", "filler", "waiting")


@pytest.fixture
def client(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Iterator[httpx.Client]:
    settings = settings_for(tmp_path, f"sqlite:///{tmp_path / 'cohabit.db'}")
    with (
        serving(settings, ScriptedRuntime()) as api,
        httpx.Client(base_url=api, timeout=30) as http,
    ):
        monkeypatch.setenv("COHABIT_BASE_URL", api)
        monkeypatch.setenv("COLUMNS", "120")
        yield http


def ps(*args: str) -> list[str]:
    result = run_cli("ps", *args)
    assert result.returncode == 0, result.stderr
    return result.stdout.splitlines()


def rows(lines: list[str]) -> list[str]:
    """The table's lines between the rule under its header and the blank line after it."""
    start = next(i for i, line in enumerate(lines) if line.strip().startswith("─"))
    end = next(i for i, line in enumerate(lines) if i > start and not line.strip())
    return lines[start + 1 : end]


def test_each_deployment_is_one_line_at_120_columns(client: httpx.Client, tmp_path: Path) -> None:
    models = {name: register_tiny_gguf(client, tmp_path, name=name)["id"] for name in NAMES}
    serving_ids = [
        deploy(client, models[name], vram_allocation=GIB, starting_copies=2).json()
        for name in NAMES[:2]
    ]
    for deployment_id in serving_ids:
        wait_for(lambda: wait_status(client, deployment_id)["ready_copies"] == 2)  # noqa: B023
    # The card's rest taken, one more waits in the queue.
    filler = deploy(client, models["filler"], vram_allocation=11 * GIB).json()
    assert wait_status(client, filler)["status"] == "DEPLOYED"
    waiting = deploy(client, models["waiting"], vram_allocation=2 * GIB, queue=True).json()
    wait_status(client, waiting, {"QUEUED"})
    origin = str(client.base_url).removesuffix("/api/")

    lines = ps()
    assert max(len(line) for line in lines) <= 120
    shown = rows(lines)
    assert [row.split()[0] for row in shown] == [d[:8] for d in (*serving_ids, filler, waiting)], (
        "\n".join(lines)
    )
    # Long names and classes are cut with "…" (never split over lines); ids, statuses whole.
    for row, name in zip(shown[:2], NAMES, strict=False):
        assert re.fullmatch(
            rf" \w{{8}}  {re.escape(name[:12])}\S*\s+DEPLOYED\s+2/2\s+node-a gpu 0\s+"
            r"software_shared/\S*\s+1 GiB\s+-\s+/v1\s*",
            row,
        ), row
    assert shown[-1].split()[-2:] == ["queued", "#1"]
    assert f'/v1: {origin}/v1 with "model": MODEL' in "\n".join(lines)

    wide = ps("--wide")
    for deployment_id in (*serving_ids, filler):
        (row,) = [line for line in wide if line.startswith(f" {deployment_id[:8]} ")]
        assert row.rstrip().endswith(f"  {origin}/runtime/models/{deployment_id}/v1"), row
        assert "…" not in row
