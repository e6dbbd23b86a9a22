"""The gateway over real HTTP in front of engines that misbehave: the stand-in engine of
test_gateway.py told to answer garbage, or to close its kept connections once idle as
uvicorn's keep-alive timeout does. The caller gets a 502 naming what was wrong, or, for a
connection the engine closed while it sat in the pool, its answer; never a 500 or a
traceback."""

from __future__ import annotations

import logging
import threading
import time
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path
from typing import Any

import httpx
import pytest

from cohabit.service.gateway.upstream import HEAD_LIMIT_BYTES
from tests.service.test_gateway import CHAT, EngineServer, _settings, deployed, serve


@contextmanager
def engine_server(**options: Any) -> Iterator[EngineServer]:
    server = EngineServer(**options)
    threading.Thread(target=server.serve_forever, daemon=True).start()
    try:
        yield server
    finally:
        server.shutdown()
        server.server_close()


class _Kept(logging.Handler):
    def __init__(self) -> None:
        super().__init__(logging.ERROR)
        self.records: list[logging.LogRecord] = []

    def emit(self, record: logging.LogRecord) -> None:
        self.records.append(record)


@contextmanager
def server_errors() -> Iterator[list[logging.LogRecord]]:
    """What uvicorn logs as errors: an exception that escaped the app (a traceback, a 500)."""
    kept = _Kept()
    logger = logging.getLogger("uvicorn.error")
    logger.addHandler(kept)
    try:
        yield kept.records
    finally:
        logger.removeHandler(kept)


@pytest.mark.parametrize(
    ("raw", "said"),
    [
        (b"hello there\r\n\r\n", "not an HTTP/1.x answer: b'hello there'"),
        (b"HTTP/1.1 200 OK\r\nbad header\r\ncontent-length: 2\r\n\r\n{}", "bad header line"),
        (
            b"HTTP/1.1 200 OK\r\ncontent-length: 2\r\ntransfer-encoding: chunked\r\n\r\n{}",
            "both content-length and transfer-encoding",
        ),
        (b"HTTP/1.1 200 OK\r\nx-big: " + b"a" * HEAD_LIMIT_BYTES + b"\r\n\r\n", "over 64 KiB"),
    ],
    ids=["not HTTP", "a bad header line", "length and chunked", "a head over the limit"],
)
def test_a_garbled_answer_is_a_502_naming_what_was_wrong(
    tmp_path: Path,
    database_url: str,
    raw: bytes,
    said: str,
    caplog: pytest.LogCaptureFixture,
) -> None:
    with (
        engine_server(raw=raw) as engine,
        serve(_settings(tmp_path, database_url), engine) as served,
        server_errors() as errors,
    ):
        deployment_id = deployed(served, "tiny", tmp_path)
        url = f"{served.root}/v1/chat/completions"
        answer = httpx.post(url, json={**CHAT, "model": "tiny"}, timeout=30, trust_env=False)
    assert answer.status_code == 502, answer.text
    error = answer.json()["error"]
    assert error["code"] == "engine_unreachable"
    assert error["message"].startswith(
        f"the engine of deployment {deployment_id} gave no usable answer: "
    )
    assert said in error["message"]
    assert errors == []
    logged = [r for r in caplog.records if r.name == "cohabit.service.gateway.proxy"]
    assert [(r.levelname, r.exc_info) for r in logged] == [("WARNING", None)]
    assert said in logged[0].getMessage()


def test_a_connection_the_engine_closed_while_idle_is_replaced_not_a_502(
    tmp_path: Path, database_url: str
) -> None:
    with (
        engine_server(idle_timeout_s=0.2) as engine,
        serve(_settings(tmp_path, database_url), engine) as served,
    ):
        deployment_id = deployed(served, "tiny", tmp_path)
        url = f"{served.root}/runtime/models/{deployment_id}/v1/chat/completions"
        with httpx.Client(timeout=30, trust_env=False) as client:
            for _ in range(3):
                answer = client.post(url, json={**CHAT, "model": "tiny"})
                assert answer.status_code == 200, answer.text
                time.sleep(0.5)  # past the engine's keep-alive: it closes the pooled connection
    chats = [port for path, port in engine.seen if path == "/v1/chat/completions"]
    assert len(chats) == 3 and len(set(chats)) == 3  # each on a connection of its own
