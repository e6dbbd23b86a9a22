"""`cohabit serve --log-format json`, run as a user runs it (a subprocess): every line it
writes on stderr is one JSON object — its own notices, uvicorn's server and access logs —
with time, level, logger and message; an exception's traceback travels in `exception`."""

from __future__ import annotations

import json
import logging
import sys
from datetime import datetime
from pathlib import Path
from typing import Any

import httpx

from cohabit.service.telemetry.logformat import JsonFormatter
from tests.cli.test_serve import T4, cohabit_serve

TOKEN = "s3cret-0f-16-chars"


def test_json_logs_are_one_object_per_line_uvicorn_included(tmp_path: Path) -> None:
    args = ("--log-format", "json", "--log-level", "info", "--token", TOKEN)
    with cohabit_serve(tmp_path, T4, *args) as (api, _process):
        assert httpx.get(f"{api}/ping", timeout=30).status_code == 200
        assert httpx.get(f"{api}/models/", timeout=30).status_code == 401
    lines = (tmp_path / "stderr.txt").read_text().splitlines()
    entries: list[dict[str, Any]] = [json.loads(line) for line in lines]
    assert entries
    for entry in entries:
        assert {"time", "level", "logger", "message"} <= entry.keys(), entry
        assert datetime.fromisoformat(entry["time"]).tzinfo is not None
    by_logger = {entry["logger"] for entry in entries}
    assert {"cohabit.serve", "uvicorn.error", "uvicorn.access"} <= by_logger
    assert any(e["message"].startswith("cohabit API on http://127.0.0.1:") for e in entries)
    access = [e for e in entries if e["logger"] == "uvicorn.access"]
    refused = [e for e in access if e["path"] == "/api/models/"]
    assert [(e["method"], e["status"], e["level"]) for e in refused] == [("GET", 401, "INFO")]


def test_an_exception_travels_with_its_traceback() -> None:
    logger = logging.getLogger("cohabit.test")
    try:
        int("not a number")
    except ValueError:
        record = logger.makeRecord(
            logger.name, logging.ERROR, __file__, 1, "parsing %s failed", ("x",), sys.exc_info()
        )
    entry = json.loads(JsonFormatter().format(record))
    assert (entry["level"], entry["logger"], entry["message"]) == (
        "ERROR",
        "cohabit.test",
        "parsing x failed",
    )
    assert entry["exception"].startswith("Traceback (most recent call last):")
    assert entry["exception"].endswith(
        "ValueError: invalid literal for int() with base 10: 'not a number'"
    )
