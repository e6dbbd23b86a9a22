"""Schemathesis against a live server on a loopback port (real HTTP, SQLite, the T4 fleet, the
scripted engine double), with and without a token: every /api operation its OpenAPI document
lists, with generated valid and invalid input, must answer no 5xx and only what the document
says (status codes, content types, headers, body schemas); with a token, none may ignore it.
A model and a DEPLOYED deployment are there first, so list answers carry real records.
Each run is bounded in time (`FUZZ_SECONDS`), seeded, and reported by its reproducers.
And the hostile names schemathesis does not think of (hypothesis, seeded): spellings of one
name, and names with characters that hide, reorder or pad them, registered one after another:
each is refused with the character and its position, or kept one per name."""

from __future__ import annotations

import itertools
import json
import re
import socket
import subprocess
import sys
from collections.abc import Iterator
from contextlib import ExitStack, suppress
from dataclasses import dataclass
from pathlib import Path
from typing import Any
from urllib.parse import urlsplit

import httpx
import pytest
from hypothesis import given, seed, settings
from hypothesis import strategies as st

from cohabit.service.access.guard import OPEN_PATHS
from cohabit.service.json_depth import JSON_DEPTH_LIMIT, too_deep_message
from cohabit.service.paths import GATEWAY_PREFIXES
from cohabit.units import GIB
from tests.estimate.tinymodels import write_gguf_model
from tests.service import raw_http
from tests.service.scripted_runtime import ScriptedRuntime
from tests.service.server import (
    deploy,
    register_tiny_gguf,
    serving,
    serving_as_cli,
    settings_for,
    wait_status,
)

# A minute each, two minutes in all: schemathesis spends the first part on its coverage phase,
# and under `make test` another worker shares the CPU, so less left the fuzzing phase too
# little time to reach every operation twice.
FUZZ_SECONDS = 60
SEED = 20261201
CHECKS = (
    "not_a_server_error",
    "status_code_conformance",
    "content_type_conformance",
    "response_headers_conformance",
    "response_schema_conformance",
    "negative_data_rejection",
)


@pytest.mark.slow
@pytest.mark.timeout(FUZZ_SECONDS * 3)
@pytest.mark.parametrize("token", [None, "s3cret"], ids=["no-token", "token"])
def test_fuzzing_the_api_finds_no_5xx_and_no_contract_violation(
    tmp_path: Path, token: str | None
) -> None:
    settings = settings_for(tmp_path, f"sqlite:///{tmp_path / 'fuzz.db'}", token=token)
    headers = {"Authorization": f"Bearer {token}"} if token else {}
    with serving(settings, ScriptedRuntime()) as api:
        with httpx.Client(base_url=api, timeout=30, headers=headers) as client:
            model = register_tiny_gguf(client, tmp_path)
            deployed = deploy(client, model["id"], vram_allocation=GIB)
            assert wait_status(client, deployed.json())["status"] == "DEPLOYED"
            operations = _api_operations(client.get("/openapi.json").json())
        checks = CHECKS + (("ignored_auth",) if token else ())
        command = [
            sys.executable,
            "-m",
            "schemathesis.cli",
            "run",
            f"{api}/openapi.json",
            f"--checks={','.join(checks)}",
            "--exclude-tag=gateway",  # the OpenAI routes: their answers are the engines'
            # The Hub's routes: with no Hub reachable here they answer a documented 503;
            # tests/hub drive them against a stand-in of the Hub.
            "--exclude-tag=hub",
            f"--max-time={FUZZ_SECONDS}",
            "--max-examples=25",
            f"--seed={SEED}",
            "--generation-database=none",
            "--no-color",
        ]
        if token:
            command.append(f"--header=Authorization: Bearer {token}")
        result = subprocess.run(
            command,
            capture_output=True,
            text=True,
            cwd=tmp_path,
            timeout=FUZZ_SECONDS * 2,
            check=False,
        )
    report = result.stdout[-8000:] + result.stderr[-2000:]
    assert result.returncode == 0, report
    counts = re.search(r"(\d+) generated, (\d+) passed", result.stdout)
    assert counts is not None, report
    generated, passed = map(int, counts.groups())
    assert f"Tested: {operations}" in result.stdout, report
    assert generated >= 2 * operations and passed == generated, report


def _api_operations(document: dict[str, Any]) -> int:
    """How many operations the fuzzer must reach: all but the gateway's and the Hub's."""
    return sum(
        not {"gateway", "hub"} & set(operation.get("tags", []))
        for methods in document["paths"].values()
        for operation in methods.values()
    )


@pytest.mark.parametrize("token", [None, "s3cret"], ids=["no-token", "token"])
def test_the_document_names_the_errors_each_route_can_answer(
    tmp_path: Path, token: str | None
) -> None:
    """What the fuzzer holds the server to must be there to hold: 401/403 on every guarded
    route, 404 where an id is looked up, 400/422 where a body is read (400 on the login,
    which reads its own), 408/413 wherever a body may be sent, 409 on deploy, and the bearer
    scheme exactly when the server has a token."""
    settings = settings_for(tmp_path, f"sqlite:///{tmp_path / 'doc.db'}", token=token)
    headers = {"Authorization": f"Bearer {token}"} if token else {}
    with serving(settings, ScriptedRuntime()) as api:
        document = httpx.get(f"{api}/openapi.json", headers=headers, timeout=60).json()
    schemes = document["components"].get("securitySchemes", {})
    assert (schemes.get("bearer", {}).get("scheme") == "bearer") is bool(token)
    for path, methods in document["paths"].items():
        if not path.startswith("/api/"):
            continue
        for method, operation in methods.items():
            codes = set(operation["responses"])
            open_route = path in OPEN_PATHS
            assert ("403" in codes) and (open_route or "401" in codes), (method, path)
            if token:
                assert operation["security"] == ([] if open_route else [{"bearer": []}])
            if "{" in path or "requestBody" in operation:
                # the estimate answers an unknown id as the reference does: 200, "unavailable";
                # registering inventory looks nothing up (a cluster's unknown location is a 422
                # naming the field)
                unlooked = (
                    "/api/models/",
                    "/api/serving/estimate_model_vram",
                    "/api/cluster/location",
                    "/api/cluster/hardware",
                    "/api/cluster/cluster",
                )
                assert "404" in codes or path in unlooked, (method, path)
            if "requestBody" in operation:
                assert {"400", "422"} <= codes, (method, path)
            if method in ("post", "put", "patch"):  # a body may be sent to any of them
                assert {"408", "413"} <= codes, (method, path)
            if path == "/api/serving/deploy_model":
                assert "409" in codes
    assert "400" in document["paths"]["/api/auth/token"]["post"]["responses"]


# --- The edge, fuzzed below the API's schema: bodies of any size, sent whole or streamed; JSON
# of any depth, its strings full of brackets and quotes; heads cut anywhere and left hanging.
# One server as `cohabit serve` runs it (httpserver.server_options), small limits so the
# drawn bodies stay small; every route that takes a body, the gateway's two included.

EDGE_TOKEN = "s3cret"
EDGE_BODY_BYTES = 8 * 1024
EDGE_GATEWAY_BODY_BYTES = 32 * 1024
EDGE_HEAD_TIMEOUT_S = 0.5
SOME_ID = "00000000-0000-4000-8000-000000000000"
GATEWAY_ROUTES = (
    ("POST", "/v1/chat/completions"),
    ("POST", f"/runtime/models/{SOME_ID}/v1/chat/completions"),
)
_TRICKY = st.text(alphabet='[]{}"\\ ,:a\u00e9', max_size=8)  # what a naive count would trip on


@dataclass(frozen=True)
class Edge:
    address: tuple[str, int]
    routes: tuple[tuple[str, str], ...]  # (method, path): every operation taking a body


@pytest.fixture(scope="module")
def edge(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Edge]:
    tmp_path = tmp_path_factory.mktemp("edge")
    server_settings = settings_for(
        tmp_path,
        f"sqlite:///{tmp_path / 'edge.db'}",
        token=EDGE_TOKEN,
        max_body_bytes=EDGE_BODY_BYTES,
        max_gateway_body_bytes=EDGE_GATEWAY_BODY_BYTES,
        head_timeout_s=EDGE_HEAD_TIMEOUT_S,
        body_timeout_s=10.0,
    )
    with serving_as_cli(server_settings, ScriptedRuntime()) as api:
        headers = {"Authorization": f"Bearer {EDGE_TOKEN}"}
        document = httpx.get(f"{api}/openapi.json", headers=headers, timeout=60).json()
        routes = tuple(
            (method.upper(), re.sub(r"\{[^}]+\}", SOME_ID, path))
            for path, methods in document["paths"].items()
            for method, operation in methods.items()
            if method in ("post", "put", "patch") and "hub" not in operation.get("tags", [])
        )
        where = urlsplit(api)
        yield Edge(address=(where.hostname or "", where.port or 0), routes=routes + GATEWAY_ROUTES)


def _gateway(path: str) -> bool:
    return path.startswith(GATEWAY_PREFIXES)


def _message(path: str, body: Any) -> Any:
    return body["error"]["message"] if _gateway(path) else body["detail"]


def _send(edge: Edge, method: str, path: str, body: bytes, pieces: list[int] | None) -> Any:
    """`body` with its length announced, or (`pieces`: where to cut it) chunked."""
    headers = ["Content-Type: application/json", f"Authorization: Bearer {EDGE_TOKEN}"]
    if pieces is None:
        headers.append(f"Content-Length: {len(body)}")
        sent = [body]
    else:
        headers.append("Transfer-Encoding: chunked")
        cuts = [0, *sorted(cut % (len(body) + 1) for cut in pieces), len(body)]
        parts = [body[start:end] for start, end in itertools.pairwise(cuts) if end > start]
        sent = [*raw_http.chunked(parts), b"0\r\n\r\n"]
    return raw_http.exchange(edge.address, raw_http.head(method, path, *headers), sent)


@pytest.mark.slow
@settings(max_examples=80, deadline=None, database=None)
@seed(SEED)
@given(data=st.data())
def test_bodies_of_any_size_are_read_up_to_the_limit_and_refused_past_it(
    edge: Edge, data: st.DataObject
) -> None:
    method, path = data.draw(st.sampled_from(edge.routes), label="route")
    limit = EDGE_GATEWAY_BODY_BYTES if _gateway(path) else EDGE_BODY_BYTES
    size = data.draw(st.integers(0, 3 * limit) | st.sampled_from([limit, limit + 1]), "size")
    pieces = data.draw(st.none() | st.lists(st.integers(0, 3 * limit), max_size=6), "pieces")
    body = (b"{}" + b" " * size)[:size]
    answer = _send(edge, method, path, body, pieces)
    assert answer.status < 500, (answer.status, answer.body)
    if size > limit:
        assert answer.status == 413, answer.body
        assert f"larger than {limit} bytes" in _message(path, answer.body)
    else:
        assert answer.status != 413, answer.body


def _nested(leaf: str, shapes: list[bool], key: str) -> Any:
    """`leaf` inside one array (True) or object (False) per entry of `shapes`."""
    value: Any = leaf
    for array in shapes:
        value = [value] if array else {key: value}
    return value


@pytest.mark.slow
@settings(max_examples=80, deadline=None, database=None)
@seed(SEED)
@given(data=st.data())
def test_json_of_any_depth_is_read_up_to_the_limit_and_refused_naming_it_past(
    edge: Edge, data: st.DataObject
) -> None:
    method, path = data.draw(st.sampled_from(edge.routes), label="route")
    depths = st.integers(1, 3 * JSON_DEPTH_LIMIT) | st.sampled_from(
        [JSON_DEPTH_LIMIT, JSON_DEPTH_LIMIT + 1]
    )
    depth = data.draw(depths, "depth")
    shapes = data.draw(st.lists(st.booleans(), min_size=depth - 1, max_size=depth - 1), "shapes")
    leaf, key = data.draw(_TRICKY, "leaf"), data.draw(_TRICKY, "key")
    body = {"model": "tiny", "password": leaf, "x": _nested(leaf, shapes, key)}
    text = json.dumps(body, ensure_ascii=data.draw(st.booleans(), "ascii")).encode()
    answer = _send(edge, method, path, text, data.draw(st.none() | st.just([len(text) // 2])))
    assert answer.status < 500, (answer.status, answer.body)
    refused = answer.status == 400 and _message(path, answer.body) == too_deep_message(depth)
    assert refused is (depth > JSON_DEPTH_LIMIT), (depth, answer.status, answer.body)


@pytest.mark.slow
@settings(max_examples=15, deadline=None, database=None)
@seed(SEED)
@given(data=st.data())
def test_heads_cut_anywhere_and_left_hanging_are_closed_while_others_are_served(
    edge: Edge, data: st.DataObject
) -> None:
    """A few connections at once, each sending its head up to a drawn byte in drawn pieces
    and then nothing: health answers meanwhile, and each is closed at the head deadline —
    or at once with a 400, when what it sent already cannot be a request (both
    Content-Length and Transfer-Encoding)."""
    heads = []
    for _ in range(data.draw(st.integers(1, 8), "connections")):
        method, path = data.draw(st.sampled_from((("GET", "/api/serving/health"), *edge.routes)))
        extra = data.draw(st.lists(st.sampled_from(HEADERS), max_size=4, unique=True), "headers")
        whole = raw_http.head(method, path, *extra)
        cut = data.draw(st.integers(0, len(whole) - 1), "cut")
        splits = sorted(data.draw(st.lists(st.integers(0, cut), max_size=3), "splits"))
        heads.append([whole[a:b] for a, b in itertools.pairwise([0, *splits, cut])])
    with ExitStack() as stack:
        connections = []
        for pieces in heads:
            sock = stack.enter_context(socket.create_connection(edge.address, timeout=10))
            for piece in pieces:
                sock.sendall(piece)
            connections.append(sock)
        url = f"http://{edge.address[0]}:{edge.address[1]}/api/serving/health"
        assert httpx.get(url, timeout=10, trust_env=False).status_code == 200
        for sock in connections:
            sock.settimeout(10)
            answered = b""
            with suppress(ConnectionResetError):
                while piece := sock.recv(65536):
                    answered += piece
            assert not answered or answered.startswith(b"HTTP/1.1 400 "), answered


HEADERS = (
    "Content-Type: application/json",
    "Content-Length: 12",
    "Transfer-Encoding: chunked",
    "Expect: 100-continue",
    "Connection: keep-alive",
    f"Authorization: Bearer {EDGE_TOKEN}",
    "X-Long: " + "a" * 2000,
)


# Names that are different once normalised, and the characters of hostile names: those that
# hide, reorder or join text (and controls), and spaces that pad a name at either end.
BASES = ("tiny", "llama-3", "qwen2.5", "file", "mistral 7b")
HIDING = (
    "\u202e",  # right-to-left override
    "\u202a",  # left-to-right embedding
    "\u2066",  # left-to-right isolate
    "\u2069",  # pop directional isolate
    "\u200f",  # right-to-left mark
    "\u200b",  # zero width space
    "\u200c",  # zero width non-joiner
    "\u200d",  # zero width joiner
    "\ufeff",  # zero width no-break space (a BOM)
    "\u2060",  # word joiner
    "\u00ad",  # soft hyphen
    "\x1b",  # escape
    "\u2028",  # line separator
)
PADDING = (" ", "\u00a0", "\u2003", "\u3000")


def _spellings(char: str) -> list[str]:
    """Ways to write `char` that are the same character once normalised: itself, its
    capital, its full-width form (U+FF01 to U+FF5E mirror ASCII 0x21 to 0x7E)."""
    spellings = [char, char.upper()]
    if "!" <= char <= "~":
        spellings.append(chr(ord(char) + 0xFEE0))
    return spellings


@st.composite
def hostile_names(draw: st.DrawFn) -> tuple[str, str, tuple[str, int] | None]:
    """(name, the base it spells, the bad character and where it is, or None)."""
    base = draw(st.sampled_from(BASES))
    name = "".join(draw(st.sampled_from(_spellings(char))) for char in base)
    if base == "file":
        name = draw(st.sampled_from([name, "\ufb01" + name[2:]]))  # the fi ligature
    hostility = draw(st.sampled_from(["none", "hide", "pad-start", "pad-end"]))
    if hostility == "hide":
        position = draw(st.integers(0, len(name)))
        char = draw(st.sampled_from(HIDING))
        return name[:position] + char + name[position:], base, (char, position)
    if hostility.startswith("pad"):
        char = draw(st.sampled_from(PADDING))
        if hostility == "pad-start":
            return char + name, base, (char, 0)
        return name + char, base, (char, len(name))
    return name, base, None


@pytest.fixture(scope="module")
def names_server(tmp_path_factory: pytest.TempPathFactory) -> Iterator[tuple[httpx.Client, str]]:
    """A live server and the path of a GGUF every registration points at."""
    tmp_path = tmp_path_factory.mktemp("names")
    write_gguf_model(tmp_path / "m.gguf")
    settings = settings_for(tmp_path, f"sqlite:///{tmp_path / 'names.db'}")
    with (
        serving(settings, ScriptedRuntime()) as api,
        httpx.Client(base_url=api, timeout=30) as client,
    ):
        yield client, str(tmp_path / "m.gguf")


HOLDERS: dict[str, str] = {}  # base name -> the id of the model registered under a spelling


@seed(SEED)
@settings(max_examples=150, deadline=None, database=None)
@given(hostile_names())
def test_hostile_names_are_refused_where_they_hide_or_kept_one_per_name(
    names_server: tuple[httpx.Client, str], named: tuple[str, str, tuple[str, int] | None]
) -> None:
    client, path = names_server
    name, base, bad = named
    answer = client.post("/models/", json={"name": name, "path": path})
    if bad is not None:
        char, position = bad
        assert answer.status_code == 422, (name, answer.text)
        (problem,) = answer.json()["detail"]
        assert problem["loc"] == ["body", "name"]
        assert f"U+{ord(char):04X}" in problem["msg"], (name, problem)
        assert f"at position {position}" in problem["msg"], (name, problem)
    elif base in HOLDERS:
        assert answer.status_code == 409, (name, answer.text)
        assert f"is taken by model {HOLDERS[base]}" in answer.json()["detail"]
    else:
        assert answer.status_code == 201, (name, answer.text)
        HOLDERS[base] = answer.json()["id"]
    # One model per name, whatever came before.
    assert sorted(model["id"] for model in client.get("/models/").json()) == sorted(
        HOLDERS.values()
    )
