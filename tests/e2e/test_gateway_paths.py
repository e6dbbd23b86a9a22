"""The gateway forwards only the engine's `/v1/…` routes. Paths that climb out of `/v1/`
after decoding (`%2e%2e`, raw `..`, `.%2e`), that carry an encoded `/` or `\\`, or bytes
that are not UTF-8 are refused with a 400 and never reach the engine: a real engine process
(tests/fixtures/runtime/fake_engine.py, which logs every request it gets) behind the real
app proves it from the engine's own log. Dot segments that stay inside `/v1/` still work."""

from __future__ import annotations

import http.client
import json
from collections.abc import Iterator
from urllib.parse import urlsplit

import pytest

from cohabit.service.gateway.intake import Refusal, engine_path
from tests.e2e.fake_service import FakeService, fake_service
from tests.service.server import wait_status


@pytest.mark.parametrize(
    ("tail", "expected"),
    [
        ("/v1/chat/completions", "/v1/chat/completions"),
        ("/v1/models", "/v1/models"),
        ("/v1/", "/v1/"),
        ("/v1/chat/../models", "/v1/models"),
        ("/v1/./models", "/v1/models"),
        ("/v1/chat/%2e%2e/models", "/v1/models"),
        ("/v1/models/org%20name", "/v1/models/org%20name"),
        ("/v1/models/caf%C3%A9", "/v1/models/caf%C3%A9"),
        ("/v1/models/a%3Fb%23c", "/v1/models/a%3Fb%23c"),  # stays one segment, no query
        ("/v1/models/%252e%252e", "/v1/models/%252e%252e"),  # encoded once more: a name
        ("/v1/models?x=1", "/v1/models"),
    ],
)
def test_paths_inside_v1_are_forwarded_normalised(tail: str, expected: str) -> None:
    assert engine_path(tail, prefix_segments=2) == expected


@pytest.mark.parametrize(
    ("tail", "says"),
    [
        ("/v1/..", "leaves /v1/"),
        ("/v1/../openapi.json", "leaves /v1/"),
        ("/v1/%2e%2e/%2e%2e/openapi.json", "leaves /v1/"),
        ("/v1/%2E%2E/metrics", "leaves /v1/"),
        ("/v1/.%2e/health", "leaves /v1/"),
        ("/v1/chat/../../health", "leaves /v1/"),
        ("/v1/..%2f..%2fopenapi.json", "encoded '/'"),
        ("/v1/..%2F..%2Fopenapi.json", "encoded '/'"),
        ("/v1/..%5c..%5cmetrics", "encoded '/'"),
        ("/v1/..\\..\\metrics", "encoded '/'"),
        ("/v1/models/%ff", "not UTF-8"),
        ("/v1/models/a%00b", "control characters"),
        ("/v1/models/caf\u00e9", "must be ASCII"),
    ],
)
def test_paths_leaving_v1_are_refused(tail: str, says: str) -> None:
    refused = engine_path(tail, prefix_segments=2)
    assert isinstance(refused, Refusal)
    assert refused.status_code == 400
    assert refused.code == "invalid_path"
    assert says in refused.message


@pytest.fixture(scope="module")
def service(tmp_path_factory: pytest.TempPathFactory) -> Iterator[FakeService]:
    with fake_service(tmp_path_factory.mktemp("gateway-paths")) as running:
        yield running


@pytest.fixture(scope="module")
def deployment(service: FakeService) -> str:
    model = service.register("serve")
    deployment_id = service.deploy(model["id"], gib=2)
    assert wait_status(service.client, deployment_id, {"DEPLOYED"}, timeout_s=60)["status"] == (
        "DEPLOYED"
    )
    return deployment_id


def send(
    service: FakeService, method: str, path: str, body: dict[str, str] | None = None
) -> tuple[int, dict]:
    """`path` exactly as given (http.client, unlike httpx, leaves `..` alone)."""
    where = urlsplit(service.root)
    connection = http.client.HTTPConnection(where.hostname or "", where.port, timeout=30)
    try:
        payload = None if body is None else json.dumps(body).encode()
        headers = {} if body is None else {"content-type": "application/json"}
        connection.request(method, path, body=payload, headers=headers)
        response = connection.getresponse()
        return response.status, json.loads(response.read() or b"null")
    finally:
        connection.close()


def engine_requests(service: FakeService, deployment_id: str) -> list[str]:
    """The request lines the engine logged (`"GET /health HTTP/1.1" 200 -`)."""
    logs = service.client.get(f"/serving/deployment/{deployment_id}/logs?tail=10000").json()
    return [line for line in logs["logs"] if "HTTP/1." in line]


ESCAPES = [
    "/v1/%2e%2e/%2e%2e/openapi.json",
    "/v1/../../openapi.json",
    "/v1/.%2e/.%2e/metrics",
    "/v1/chat/../../health",
    "/v1/..%2f..%2fopenapi.json",
    "/v1/models/..%5c..%5cmetrics",
]


def test_escapes_through_the_deployment_route_never_reach_the_engine(
    service: FakeService, deployment: str
) -> None:
    before = len(engine_requests(service, deployment))
    for tail in ESCAPES:
        status, body = send(service, "GET", f"/runtime/models/{deployment}{tail}")
        assert status == 400, (tail, body)
        assert body["error"]["code"] == "invalid_path"
    seen = engine_requests(service, deployment)[before:]
    assert not [line for line in seen if "/health" not in line], seen  # only the probe's


def test_escapes_through_the_route_by_model_name_never_reach_the_engine(
    service: FakeService, deployment: str
) -> None:
    before = len(engine_requests(service, deployment))
    for tail in ("/v1/%2e%2e/openapi.json", "/v1/../health", "/v1/..%2fmetrics"):
        status, body = send(service, "POST", tail, {"model": "serve"})
        assert status == 400, (tail, body)
        assert body["error"]["code"] == "invalid_path"
    seen = engine_requests(service, deployment)[before:]
    assert not [line for line in seen if "/health" not in line], seen


def test_dot_segments_inside_v1_reach_the_normalised_route(
    service: FakeService, deployment: str
) -> None:
    before = len(engine_requests(service, deployment))
    for tail in ("/v1/chat/../models", "/v1/./models"):
        status, body = send(service, "GET", f"/runtime/models/{deployment}{tail}")
        assert status == 200, (tail, body)
        assert body["data"][0]["id"] == "fake"
    seen = [line for line in engine_requests(service, deployment)[before:] if "/health" not in line]
    assert len(seen) == 2, seen
    assert all('"GET /v1/models HTTP/1.1" 200' in line for line in seen), seen
