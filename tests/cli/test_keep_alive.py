"""`cohabit serve` keeps an idle connection open longer than a client polls. The published
kamiwaza client sleeps 5 s after each answer and asks again on the same connection; so does
this test, three times, and every request must ride that one connection. Under uvicorn's own
5 s keep-alive the server closes it just before each next request, so one pause would already
show it; three show the connection is not merely lucky once."""

from __future__ import annotations

import http.client
import time
from pathlib import Path
from urllib.parse import urlsplit

import pytest

from tests.cli.test_serve import T4, cohabit_serve

POLL_INTERVAL_S = 5.0
POLLS = 3  # 15 s of polling after the first request


@pytest.mark.slow
def test_one_connection_carries_several_5_s_polls(tmp_path: Path) -> None:
    with cohabit_serve(tmp_path, T4) as (api, _process):
        parts = urlsplit(api)
        connection = http.client.HTTPConnection(parts.hostname or "", parts.port, timeout=10)
        local_ends = []
        try:
            for poll in range(POLLS + 1):
                if poll:
                    time.sleep(POLL_INTERVAL_S)  # as the client's poller: after the answer
                connection.request("GET", f"{parts.path}/ping")
                response = connection.getresponse()
                assert (response.status, response.read()[:1]) == (200, b"{")
                assert connection.sock is not None
                local_ends.append(connection.sock.getsockname())
        finally:
            connection.close()
    assert len(local_ends) == POLLS + 1
    assert set(local_ends) == {local_ends[0]}, "the server closed the connection between polls"
