"""Who may call the server, over real HTTP on a loopback port: the token is compared as bytes
(a non-ASCII header is a plain 401), it is checked before the body is read, the OpenAPI
document and its page are behind it, and without a token only loopback Host names (and the
allow-list) are answered — the DNS-rebinding defence. No CORS header is ever sent.
Engines are the scripted double; SQLite suffices (nothing here touches the store's SQL)."""

from __future__ import annotations

import socket
from collections.abc import Iterator
from pathlib import Path
from typing import Any
from urllib.parse import urlsplit

import httpx
import pytest
from pydantic import ValidationError

from cohabit.service.access.guard import host_name
from cohabit.service.settings import Settings
from tests.service.scripted_runtime import ScriptedRuntime
from tests.service.server import serving, settings_for

TOKEN = "s3cret"
BIG_BODY_BYTES = 25 * 1024 * 1024
TIMEOUT_S = 60  # generous: the OpenAPI document takes seconds to build on a busy machine


def call(method: str, url: str, **kwargs: Any) -> httpx.Response:
    return httpx.request(method, url, timeout=TIMEOUT_S, **kwargs)


@pytest.fixture
def guarded(tmp_path: Path) -> Iterator[str]:
    """A server with a token; yields its API root."""
    settings = settings_for(tmp_path, f"sqlite:///{tmp_path / 'db.sqlite'}", token=TOKEN)
    with serving(settings, ScriptedRuntime()) as api:
        yield api


@pytest.fixture
def open_server(tmp_path: Path) -> Iterator[str]:
    """A server without a token that also answers the Host name `cohabit.internal`."""
    settings = settings_for(
        tmp_path, f"sqlite:///{tmp_path / 'db.sqlite'}", allowed_hosts=("Cohabit.Internal",)
    )
    with serving(settings, ScriptedRuntime()) as api:
        yield api


@pytest.mark.parametrize(
    "authorization",
    [b"Bearer \xe9", "Bearer s3cr\u00e9t".encode(), b"Bearer s3cret\xff", b"\xe9\xe9", b"Bearer"],
    ids=["latin-1", "utf-8", "token-and-byte", "no-scheme", "empty"],
)
def test_a_non_ascii_or_malformed_bearer_is_a_401(guarded: str, authorization: bytes) -> None:
    response = call("GET", f"{guarded}/models/", headers={"Authorization": authorization})
    assert response.status_code == 401
    assert response.headers["www-authenticate"] == "Bearer"
    assert "bearer token" in response.json()["detail"]


def test_the_right_token_in_any_scheme_case_is_admitted(guarded: str) -> None:
    for scheme in ("Bearer", "bearer", "BEARER"):
        headers = {"Authorization": f"{scheme} {TOKEN}"}
        assert call("GET", f"{guarded}/models/", headers=headers).json() == []


@pytest.mark.parametrize("token", ["s3cr\u00e9t", "two words", "tab\there", "\u00e9"])
def test_a_token_that_is_not_visible_ascii_is_refused_at_start(token: str) -> None:
    with pytest.raises(ValidationError, match="visible ASCII"):
        Settings(token=token)


def test_a_visible_ascii_token_is_kept_as_given() -> None:
    assert Settings(token="A-z_0.9~+/=!").token == "A-z_0.9~+/=!"


def test_a_wrong_token_is_refused_before_the_body_is_read(guarded: str) -> None:
    """The request announces 25 MB but sends 1 KB, and never the rest: the answer is a 401,
    so the server did not wait for (read) the body, which would have ended in its 408 after
    the body timeout (60 s, longer than this client waits). The right token, for contrast,
    with a body within the API's limit (a larger one is a 413 at once, docs/api.md), waits."""
    assert _first_answer(guarded, "Bearer wrong", timeout_s=30).startswith(b"HTTP/1.1 401")
    within = _first_answer(guarded, f"Bearer {TOKEN}", timeout_s=1.5, announced=512 * 1024)
    assert within == b""


def _first_answer(
    api: str, authorization: str, *, timeout_s: float, announced: int = BIG_BODY_BYTES
) -> bytes:
    """Send the head of a POST announcing `announced` bytes and 1 KB of them; whatever comes
    back within timeout_s."""
    url = urlsplit(api)
    assert url.hostname is not None and url.port is not None
    head = (
        f"POST {url.path}/models/ HTTP/1.1\r\nHost: {url.netloc}\r\n"
        f"Authorization: {authorization}\r\nContent-Type: application/json\r\n"
        f"Content-Length: {announced}\r\n\r\n"
    )
    with socket.create_connection((url.hostname, url.port), timeout=timeout_s) as sock:
        sock.sendall(head.encode() + b"[" + b" " * 1023)
        try:
            return sock.recv(65536)
        except TimeoutError:
            return b""


@pytest.mark.parametrize("path", ["/api/openapi.json", "/api/docs", "/api/serving/status"])
def test_the_openapi_document_and_its_page_are_behind_the_token(guarded: str, path: str) -> None:
    root = guarded.removesuffix("/api")
    assert call("GET", f"{root}{path}").status_code == 401
    answer = call("GET", f"{root}{path}", headers={"Authorization": f"Bearer {TOKEN}"})
    assert answer.status_code == 200


@pytest.mark.parametrize("path", ["/api/serving/health", "/", "/ui/static/app.js"])
def test_health_and_the_page_stay_open(guarded: str, path: str) -> None:
    root = guarded.removesuffix("/api")
    assert call("GET", f"{root}{path}").status_code == 200


@pytest.mark.parametrize(
    "path",
    [
        "/ui/static/../../api/models/",
        "/ui/static/%2e%2e/%2e%2e/api/models/",
        "/api/serving/health/../../models/",
        "/api/serving/health/",
    ],
)
def test_an_open_prefix_does_not_open_other_paths(guarded: str, path: str) -> None:
    """Sent as written (clients would resolve the dots): only the exact open paths are open."""
    answer = _raw_get(guarded, path)
    status = int(answer.split(b" ", 2)[1])
    assert status in (401, 404), answer[:200]


def _raw_get(api: str, path: str) -> bytes:
    url = urlsplit(api)
    assert url.hostname is not None and url.port is not None
    request = f"GET {path} HTTP/1.1\r\nHost: {url.netloc}\r\nConnection: close\r\n\r\n"
    with socket.create_connection((url.hostname, url.port), timeout=TIMEOUT_S) as sock:
        sock.sendall(request.encode())
        chunks = []
        while chunk := sock.recv(65536):
            chunks.append(chunk)
    return b"".join(chunks)


def test_the_gateway_refuses_a_missing_token_the_openai_way(guarded: str) -> None:
    root = guarded.removesuffix("/api")
    refused = call("POST", f"{root}/v1/chat/completions", json={"model": "x"})
    assert refused.status_code == 401
    assert refused.json()["error"]["code"] == "invalid_api_key"


@pytest.mark.parametrize(
    "host",
    ["127.0.0.1", "localhost", "LOCALHOST:8420", "[::1]", "[::1]:8420", "cohabit.internal:80"],
)
def test_without_a_token_loopback_and_allowed_hosts_are_answered(
    open_server: str, host: str
) -> None:
    response = call("GET", f"{open_server}/models/", headers={"Host": host})
    assert response.status_code == 200, response.text


@pytest.mark.parametrize(
    "host", ["evil.example", "evil.example:8420", "127.0.0.1.evil.example", "[::2]", "", "\u00e9"]
)
def test_without_a_token_another_host_is_refused(open_server: str, host: str) -> None:
    """A page on evil.example whose name the attacker re-points at 127.0.0.1 sends
    `Host: evil.example`: refused with one line, health included."""
    for path in ("/models/", "/serving/health"):
        response = call("GET", f"{open_server}{path}", headers={"Host": host.encode()})
        assert response.status_code == 403
        detail = response.json()["detail"]
        assert "--allow-host" in detail and "\n" not in detail


def test_the_gateway_refuses_another_host_the_openai_way(open_server: str) -> None:
    root = open_server.removesuffix("/api")
    response = call("GET", f"{root}/v1/models", headers={"Host": "evil.example"})
    assert response.status_code == 403
    assert response.json()["error"]["code"] == "host_not_allowed"


def test_with_a_token_the_host_is_not_checked(guarded: str) -> None:
    headers = {"Host": "cohabit.example.com", "Authorization": f"Bearer {TOKEN}"}
    assert call("GET", f"{guarded}/models/", headers=headers).status_code == 200


def test_no_cors_header_is_sent(open_server: str, guarded: str) -> None:
    origin = {"Origin": "http://evil.example"}
    answers = [
        call("GET", f"{open_server}/models/", headers=origin),
        call(
            "OPTIONS",
            f"{open_server}/models/",
            headers=origin | {"Access-Control-Request-Method": "POST"},
        ),
        call("GET", f"{guarded}/models/", headers=origin | {"Authorization": f"Bearer {TOKEN}"}),
    ]
    for answer in answers:
        assert not [h for h in answer.headers if h.lower().startswith("access-control-")]


@pytest.mark.parametrize(
    ("header", "name"),
    [
        (b"127.0.0.1:8420", "127.0.0.1"),
        (b"[::1]:8420", "::1"),
        (b"[::1]", "::1"),
        (b"LocalHost", "localhost"),
        (b"::1", "::1"),
        (None, ""),
        (b"\xe9", ""),
    ],
)
def test_host_name_drops_the_port_and_brackets(header: bytes | None, name: str) -> None:
    assert host_name(header) == name
