"""`cohabit serve` keeps an idle connection open longer than a client polls: the published
kamiwaza client polls every 5 s, so one connection polled at exactly 5 s for a minute must
carry every request (uvicorn's own 5 s keep-alive closed it under some of them)."""

from __future__ import annotations

import http.client
import time
from pathlib import Path
from urllib.parse import urlsplit

import pytest

from tests.cli.test_serve import T4, cohabit_serve

POLL_INTERVAL_S = 5.0
POLLS = 12  # a minute of polling after the first request


@pytest.mark.slow
def test_one_connection_carries_a_minute_of_5_s_polls(tmp_path: Path) -> None:
    with cohabit_serve(tmp_path, T4) as (api, _process):
        parts = urlsplit(api)
        connection = http.client.HTTPConnection(parts.hostname or "", parts.port, timeout=10)
        start = time.monotonic()
        local_ends = []
        try:
            for poll in range(POLLS + 1):
                time.sleep(max(0.0, start + poll * POLL_INTERVAL_S - time.monotonic()))
                connection.request("GET", f"{parts.path}/ping")
                response = connection.getresponse()
                assert (response.status, response.read()[:1]) == (200, b"{")
                assert connection.sock is not None
                local_ends.append(connection.sock.getsockname())
        finally:
            connection.close()
    assert len(local_ends) == POLLS + 1
    assert set(local_ends) == {local_ends[0]}, "the server closed the connection between polls"
