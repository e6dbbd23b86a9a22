"""Request bodies at the edge, over real HTTP to the app on a loopback port (SQLite, the scripted
engine double; the token set, so the open login route is what anyone may reach): a body
announced larger than its route takes is a 413 before a byte of it is read, a chunked one is
cut off with a 413 once it passes the limit, a slow one is a 408 (from the connection, as
`cohabit serve` runs the app), and JSON nested deeper than the limit is a 400 naming the
depth — on the login route, an /api route and the gateway, each in its documented shape.
Raw sockets where the client must not send what it announces (a client library would)."""

from __future__ import annotations

import json
import socket
from collections.abc import Iterator
from typing import Any
from urllib.parse import urlsplit

import httpx
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from cohabit.service.json_depth import JSON_DEPTH_LIMIT, depth_over
from cohabit.service.paths import GATEWAY_PREFIXES
from cohabit.units import MIB
from tests.service import raw_http
from tests.service.scripted_runtime import ScriptedRuntime
from tests.service.server import serving, serving_as_cli, settings_for

TOKEN = "s3cret"
AUTH = {"Authorization": f"Bearer {TOKEN}"}
LOGIN = "/api/auth/token"
DEPLOY = "/api/serving/deploy_model"
CHAT = "/v1/chat/completions"
BY_ID = "/runtime/models/00000000-0000-4000-8000-000000000000/v1/chat/completions"
SMALL_BYTES = 64 * 1024  # the limits the streaming tests run under
SMALL_GATEWAY_BYTES = 256 * 1024
BODY_TIMEOUT_S = (
    5.0  # long beside a loaded machine sending a few hundred KiB; the 408 tests wait it out
)


@pytest.fixture(scope="module")
def server(tmp_path_factory: pytest.TempPathFactory) -> Iterator[tuple[str, int]]:
    """A server with the default body limits; (host, port)."""
    tmp_path = tmp_path_factory.mktemp("limits")
    settings = settings_for(tmp_path, f"sqlite:///{tmp_path / 'c.db'}", token=TOKEN)
    with serving(settings, ScriptedRuntime()) as api:
        yield _address(api)


@pytest.fixture(scope="module")
def small_server(tmp_path_factory: pytest.TempPathFactory) -> Iterator[tuple[str, int]]:
    """A server with small limits and a short body timeout, so the tests send little; run as
    `cohabit serve` runs it (the body's deadline is the connection's)."""
    tmp_path = tmp_path_factory.mktemp("small")
    settings = settings_for(
        tmp_path,
        f"sqlite:///{tmp_path / 'c.db'}",
        token=TOKEN,
        max_body_bytes=SMALL_BYTES,
        max_gateway_body_bytes=SMALL_GATEWAY_BYTES,
        body_timeout_s=BODY_TIMEOUT_S,
    )
    with serving_as_cli(settings, ScriptedRuntime()) as api:
        yield _address(api)


def _address(api: str) -> tuple[str, int]:
    where = urlsplit(api)
    assert where.hostname is not None and where.port is not None
    return where.hostname, where.port


def _head(path: str, *headers: str) -> bytes:
    auth = () if path == LOGIN else (f"Authorization: Bearer {TOKEN}",)
    return raw_http.head("POST", path, *headers, *auth)


def _error(path: str, body: Any) -> tuple[str, str]:
    """(code, message) of an API or a gateway error body."""
    if path.startswith(GATEWAY_PREFIXES):
        return body["error"]["code"], body["error"]["message"]
    return "", body["detail"]


ROUTES = [LOGIN, DEPLOY, CHAT, BY_ID]
ROUTE_IDS = ["login", "api", "gateway-by-name", "gateway-by-id"]


@pytest.mark.parametrize(
    ("path", "announced"),
    [(LOGIN, 256 * MIB), (DEPLOY, 2 * MIB), (CHAT, 300 * MIB)],
    ids=["login-256MiB", "api-2MiB", "gateway-300MiB"],
)
def test_a_body_announced_over_the_limit_is_a_413_before_it_is_sent(
    server: tuple[str, int], path: str, announced: int
) -> None:
    """The head alone is sent: the answer comes without waiting for a byte of the body, and
    the connection is closed after it."""
    with socket.create_connection(server, timeout=10) as sock:
        sock.sendall(_head(path, "Content-Type: application/json", f"Content-Length: {announced}"))
        answer = raw_http.read_answer(sock)
        assert answer.status == 413, answer.body
        assert answer.headers["connection"] == "close"
        code, message = _error(path, answer.body)
        limit = 32 * MIB if path == CHAT else MIB
        assert f"larger than {limit} bytes" in message
        assert code == ("body_too_large" if path == CHAT else "")
        assert sock.recv(1) == b""  # closed


@pytest.mark.parametrize("path", ROUTES, ids=ROUTE_IDS)
def test_a_chunked_body_is_cut_off_at_the_limit_with_a_413(
    small_server: tuple[str, int], path: str
) -> None:
    """The client streams chunks of 16 KiB and never ends the body: the server answers once
    more than the limit has come, and reads no more."""
    limit = SMALL_GATEWAY_BYTES if path.startswith(GATEWAY_PREFIXES) else SMALL_BYTES
    pieces = raw_http.chunked([b"x" * 0x4000] * (limit // 0x4000 + 8))  # past it, no end
    sent = _head(path, "Content-Type: application/json", "Transfer-Encoding: chunked")
    answer = raw_http.exchange(small_server, sent, pieces)
    assert answer.status == 413, answer.body
    assert answer.headers["connection"] == "close"
    assert f"larger than {limit} bytes" in _error(path, answer.body)[1]


@pytest.mark.parametrize("path", ROUTES, ids=ROUTE_IDS)
def test_a_body_slower_than_the_timeout_is_a_408(small_server: tuple[str, int], path: str) -> None:
    """Answered by the connection, before any route has the body: `{"detail"}` everywhere."""
    sent = _head(path, "Content-Type: application/json", "Content-Length: 100")
    answer = raw_http.exchange(small_server, sent, [b'{"model": '])  # and nothing more
    assert answer.status == 408, answer.body
    assert answer.headers["connection"] == "close"
    assert answer.body == {"detail": f"the request body did not arrive within {BODY_TIMEOUT_S:g} s"}


def _nested(depth: int) -> bytes:
    """A body whose JSON nests `depth` levels: an object whose `model` field is a string and
    whose `x` field holds arrays down to depth."""
    return (
        b'{"model": "tiny", "password": "p", "x": ' + b"[" * (depth - 1) + b"]" * (depth - 1) + b"}"
    )


@pytest.mark.parametrize("path", ROUTES, ids=ROUTE_IDS)
def test_json_nested_deeper_than_the_limit_is_a_400_naming_the_depth(
    server: tuple[str, int], path: str
) -> None:
    url = f"http://{server[0]}:{server[1]}{path}"
    headers = {"Content-Type": "application/json", **AUTH}
    with httpx.Client(timeout=30, trust_env=False) as client:
        deep = client.post(url, content=_nested(5000), headers=headers)
        assert deep.status_code == 400, deep.text
        code, message = _error(path, deep.json())
        assert (
            message
            == f"the JSON body nests 5000 levels deep; at most {JSON_DEPTH_LIMIT} are accepted"
        )
        assert code == ("json_too_deep" if path.startswith(GATEWAY_PREFIXES) else "")
        # At the limit the body goes on to the route, which answers as it does for any body:
        # a wrong password, fields that are not a deployment, a model not deployed.
        at_limit = client.post(url, content=_nested(JSON_DEPTH_LIMIT), headers=headers)
        expected = {LOGIN: 401, DEPLOY: 422, CHAT: 404, BY_ID: 404}[path]
        assert at_limit.status_code == expected, at_limit.text
        # Brackets inside strings are text, not nesting.
        text = b'{"model": "x", "password": "' + b"[" * 5000 + b'"}'
        assert client.post(url, content=text, headers=headers).status_code != 400


def test_bodies_that_are_not_json_by_their_type_are_not_read_for_depth(
    server: tuple[str, int],
) -> None:
    """The depth is a JSON body's: a login form's brackets are its text, and so are those of
    an upload the gateway passes to an engine (audio, say); a body without a type may be
    JSON, and is held to the limit."""
    url = f"http://{server[0]}:{server[1]}"
    form = {"grant_type": "password", "username": "u", "password": "[" * 5000}
    answer = httpx.post(url + LOGIN, data=form, timeout=30, trust_env=False)
    assert answer.status_code == 401, answer.text
    headers = {"Content-Type": "application/octet-stream", **AUTH}
    upload = httpx.post(url + BY_ID, content=b"[" * 5000, headers=headers, trust_env=False)
    assert upload.status_code == 404, upload.text  # on to the route: no such deployment
    # A body of no type is read as JSON, as FastAPI did before its strict content type.
    untyped = httpx.post(url + BY_ID, content=b"[" * 5000, headers=AUTH, trust_env=False)
    assert untyped.status_code == 400, untyped.text
    assert untyped.json()["error"]["code"] == "json_too_deep"


@pytest.mark.parametrize(
    ("text", "limit", "expected"),
    [
        (b"{}", 1, None),
        (b"[[]]", 1, 2),
        (b'{"a": [{"b": [1, 2]}]}', 3, 4),
        (b'{"a": [{"b": [1, 2]}]}', 4, None),
        (b'["[[[[[", "\\"[[[[", {"k]": "}}}}"}]', 1, 2),  # escaped quotes stay in strings
        (b'"\\\\"[[[]]]', 2, 3),  # an escaped backslash ends before the quote
        (b"[" * 100, 64, 100),  # not JSON: still an answer, the parser refuses it after
        (b'{"a": "[[[[[[[[[[', 3, 11),  # an unfinished string: its brackets count
    ],
)
def test_depth_over_counts_only_nesting_outside_strings(
    text: bytes, limit: int, expected: int | None
) -> None:
    assert depth_over(text, limit) == expected


# JSON values whose strings and keys are full of what a naive count would take for nesting.
_TRICKY = st.text(alphabet='[]{}"\\ a\u00e9', max_size=6)
JSON_VALUES = st.recursive(
    st.none() | st.booleans() | st.integers() | _TRICKY,
    lambda inner: st.lists(inner, max_size=3) | st.dictionaries(_TRICKY, inner, max_size=3),
    max_leaves=30,
)


def _depth(value: Any) -> int:
    if isinstance(value, list):
        return 1 + max(map(_depth, value), default=0)
    if isinstance(value, dict):
        return 1 + max(map(_depth, value.values()), default=0)
    return 0


@settings(max_examples=150, deadline=None, database=None)
@given(value=JSON_VALUES, limit=st.integers(0, 8), ascii_only=st.booleans())
def test_depth_over_is_the_parsed_values_depth(value: Any, limit: int, ascii_only: bool) -> None:
    depth = _depth(value)
    text = json.dumps(value, ensure_ascii=ascii_only).encode()
    assert depth_over(text, limit) == (depth if depth > limit else None)
