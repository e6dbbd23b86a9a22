"""The gateway over real HTTP (the app on a loopback port, SQLite and PostgreSQL) in front of
a stand-in OpenAI engine in this process: an HTTP/1.1 server that answers chat completions
the way llama-cpp-python's server does (a JSON answer with `usage`, or SSE chunks with the
usage in the last one) and, for a stream, holds its remaining chunks until the test lets
them go — so a test can see what reaches the client while the engine is still generating.
Which deployments serve is up to the test (`GatedRuntime`). Real llama.cpp engines go
through the gateway in the benchmark's test (test_gateway_benchmark.py) and the e2e tests.
"""

from __future__ import annotations

import http.server
import json
import socketserver
import threading
import time
from collections.abc import Iterator
from contextlib import contextmanager
from dataclasses import dataclass, field
from datetime import UTC, datetime
from pathlib import Path
from typing import Any

import httpx
import pytest

from cohabit.runtime.interface import EngineHandle, EngineState, EngineStatus, LaunchRequest
from cohabit.service.app import Backend, create_app
from cohabit.service.gateway import proxy
from cohabit.service.gateway.proxy import Gateway, least_busy
from cohabit.service.gateway.routing import Target
from cohabit.service.settings import Settings
from cohabit.store.records import DeploymentStatus
from cohabit.units import GIB
from tests.service.server import T4_FLEET, register_tiny_gguf, serving_app, wait_for, wait_status

CHAT = {"messages": [{"role": "user", "content": "hi"}], "max_tokens": 3}


class _Engine(http.server.BaseHTTPRequestHandler):
    protocol_version = "HTTP/1.1"  # keep-alive, as uvicorn serves engines
    server: EngineServer

    def do_GET(self) -> None:
        self.server.seen.append((self.path, self.client_address[1]))
        self._json(200, {"object": "list", "data": [{"id": "stub"}]})

    def setup(self) -> None:
        self.timeout = self.server.idle_timeout_s  # then it closes the connection
        super().setup()

    def do_POST(self) -> None:
        body = json.loads(self.rfile.read(int(self.headers["content-length"])) or b"{}")
        self.server.seen.append((self.path, self.client_address[1]))
        if self.server.raw is not None:
            self.wfile.write(self.server.raw)
            self.close_connection = True
            return
        tokens = int(body.get("max_tokens", 1))
        usage = {"prompt_tokens": 2, "completion_tokens": tokens, "total_tokens": tokens + 2}
        if not body.get("stream"):
            message = {"role": "assistant", "content": "x" * tokens}
            self._json(
                200,
                {"object": "chat.completion", "choices": [{"message": message}], "usage": usage},
            )
            return
        self.send_response(200)
        self.send_header("content-type", "text/event-stream")
        self.send_header("transfer-encoding", "chunked")
        self.end_headers()
        try:
            self._chunk({"choices": [{"delta": {"content": "x"}}]})
            self.server.release.wait(30)
            for _ in range(tokens - 1):
                self._chunk({"choices": [{"delta": {"content": "x"}}]})
            self._chunk({"choices": [], "usage": usage})
            self._event(b"[DONE]")
            self.wfile.write(b"0\r\n\r\n")
            self.server.finished += 1
        except OSError:
            self.server.cut_off += 1  # the gateway closed the connection: the client left

    def _chunk(self, data: dict[str, Any]) -> None:
        self._event(json.dumps(data).encode())

    def _event(self, data: bytes) -> None:
        event = b"data: " + data + b"\n\n"
        self.wfile.write(b"%x\r\n%s\r\n" % (len(event), event))
        self.wfile.flush()

    def _json(self, status: int, data: dict[str, Any]) -> None:
        payload = json.dumps(data).encode()
        self.send_response(status)
        self.send_header("content-type", "application/json")
        self.send_header("content-length", str(len(payload)))
        self.end_headers()
        self.wfile.write(payload)

    def log_message(self, format: str, *args: object) -> None:
        del format, args


class EngineServer(socketserver.ThreadingMixIn, http.server.HTTPServer):
    """`raw`: bytes written as is in answer to every POST, then the connection closed;
    `idle_timeout_s`: how long a kept connection may wait for its next request."""

    daemon_threads = True

    def __init__(self, *, raw: bytes | None = None, idle_timeout_s: float | None = None) -> None:
        super().__init__(("127.0.0.1", 0), _Engine)
        self.raw = raw
        self.idle_timeout_s = idle_timeout_s
        self.seen: list[tuple[str, int]] = []  # (path, the caller's port) per request
        self.release = threading.Event()
        self.finished = 0
        self.cut_off = 0

    @property
    def url(self) -> str:
        return f"http://127.0.0.1:{self.server_address[1]}"


class StandInRuntime:
    """What a runtime whose engines are stand-ins in this process does nothing for: stopping
    one, its logs, finding engines after a restart, discarding an ended one's files."""

    def stop(self, handle: EngineHandle) -> None:
        del handle

    def logs(self, handle: EngineHandle, *, tail: int = 200) -> list[str]:
        return []

    def engines(self) -> list[EngineHandle]:
        return []

    def discard(self, deployment_id: str) -> None:
        del deployment_id


@dataclass
class GatedRuntime(StandInRuntime):
    """Every engine is `engine`; a deployment is READY once its served name is in `ready`."""

    engine: EngineServer
    ready: set[str] = field(default_factory=set)
    names: dict[str, str] = field(default_factory=dict)

    def start(self, request: LaunchRequest) -> EngineHandle:
        self.names[request.deployment_id] = request.served_model_name
        return EngineHandle(deployment_id=request.deployment_id, base_url=self.engine.url)

    def status(self, handle: EngineHandle) -> EngineStatus:
        name = self.names.get(handle.deployment_id)
        return EngineStatus(state=EngineState.READY if name in self.ready else EngineState.STARTING)

    def adopt(self, handle: EngineHandle) -> EngineHandle | None:
        return handle if handle.deployment_id in self.names else None


@dataclass(frozen=True)
class Served:
    api: httpx.Client
    root: str
    gateway: Gateway
    runtime: GatedRuntime
    engine: EngineServer
    loads: list[str]

    def deploy(self, name: str, tmp_path: Path) -> str:
        model = register_tiny_gguf(self.api, tmp_path, name=name)
        answer = self.api.post(
            "/serving/deploy_model", json={"m_id": model["id"], "vram_allocation": GIB}
        )
        assert answer.status_code == 202, answer.text
        deployment_id: str = answer.json()
        return deployment_id


@pytest.fixture
def engine() -> Iterator[EngineServer]:
    server = EngineServer()
    threading.Thread(target=server.serve_forever, daemon=True).start()
    yield server
    server.release.set()
    server.shutdown()
    server.server_close()


def _settings(tmp_path: Path, database_url: str, **extra: Any) -> Settings:
    return Settings(
        data_dir=tmp_path / "data",
        database_url=database_url,
        poll_interval_s=0.05,
        lease_s=2.0,
        **extra,
    )


@pytest.fixture
def served(tmp_path: Path, database_url: str, engine: EngineServer) -> Iterator[Served]:
    with serve(_settings(tmp_path, database_url, gateway_wait_s=20.0), engine) as running:
        yield running


@contextmanager
def serve(settings: Settings, engine: EngineServer) -> Iterator[Served]:
    runtime = GatedRuntime(engine)
    app = create_app(settings, Backend(runtime=runtime, fleet=T4_FLEET))
    with serving_app(app) as api, httpx.Client(base_url=api, timeout=30, trust_env=False) as client:
        reconciler = app.state.context.reconciler
        loads: list[str] = []
        plain_load = reconciler.load

        def load(deployment_id: str) -> bool:  # the reconciler's hook, recorded
            loads.append(deployment_id)
            return bool(plain_load(deployment_id))

        reconciler.load = load
        yield Served(
            api=client,
            root=api.removesuffix("/api"),
            gateway=app.state.gateway,
            runtime=runtime,
            engine=engine,
            loads=loads,
        )


def deployed(served: Served, name: str, tmp_path: Path) -> str:
    served.runtime.ready.add(name)
    deployment_id = served.deploy(name, tmp_path)
    assert wait_status(served.api, deployment_id)["status"] == "DEPLOYED"
    return deployment_id


def test_a_stream_reaches_the_client_chunk_by_chunk_and_counts_until_it_ends(
    served: Served, tmp_path: Path
) -> None:
    deployment_id = deployed(served, "tiny", tmp_path)
    activity = served.gateway.activity
    url = f"{served.root}/runtime/models/{deployment_id}/v1/chat/completions"
    with (
        httpx.Client(timeout=30, trust_env=False) as client,
        client.stream("POST", url, json={**CHAT, "stream": True, "model": "tiny"}) as answer,
    ):
        pieces = answer.iter_raw()
        first = next(pieces)  # the engine holds the rest until `release`
        assert first.startswith(b"data: ") and b'"content": "x"' in first
        assert served.engine.finished == 0
        assert activity.in_flight(deployment_id) == 1
        served.engine.release.set()
        rest = b"".join(pieces)
    assert rest.endswith(b"data: [DONE]\n\n")
    usage = wait_for(lambda: (found := activity.get(deployment_id)).requests and found)
    assert (usage.in_flight, usage.requests, usage.errors, usage.completion_tokens) == (0, 1, 0, 3)


def test_a_client_that_leaves_ends_the_stream_and_its_count(served: Served, tmp_path: Path) -> None:
    deployment_id = deployed(served, "tiny", tmp_path)
    activity = served.gateway.activity
    url = f"{served.root}/v1/chat/completions"
    with (
        httpx.Client(timeout=30, trust_env=False) as client,
        client.stream("POST", url, json={**CHAT, "stream": True, "model": "tiny"}) as answer,
    ):
        pieces = answer.iter_raw()  # kept: a dropped iterator closes the response
        first = next(pieces)
        assert answer.status_code == 200, first
        assert activity.in_flight(deployment_id) == 1, activity.get(deployment_id)
    # The client closed its connection mid-stream: no longer in flight, counted as an error.
    wait_for(lambda: activity.in_flight(deployment_id) == 0, timeout_s=10)
    usage = activity.get(deployment_id)
    assert (usage.requests, usage.errors) == (1, 1)
    served.engine.release.set()  # the engine's writes now fail: its connection was closed
    wait_for(lambda: served.engine.cut_off == 1, timeout_s=10)


def test_answers_count_their_tokens_over_one_pooled_connection(
    served: Served, tmp_path: Path
) -> None:
    deployment_id = deployed(served, "tiny", tmp_path)
    by_id = f"{served.root}/runtime/models/{deployment_id}/v1/chat/completions"
    by_name = f"{served.root}/v1/chat/completions"
    with httpx.Client(timeout=30, trust_env=False) as client:
        for url in (by_id, by_name, by_id, by_name):
            answer = client.post(url, json={**CHAT, "model": "tiny"})
            assert answer.status_code == 200, answer.text
            assert answer.json()["usage"]["completion_tokens"] == 3
    activity = served.gateway.activity
    # Counted once each answer has gone out, a moment after the client has it.
    usage = wait_for(lambda: (found := activity.get(deployment_id)).requests == 4 and found)
    assert (usage.in_flight, usage.requests, usage.errors, usage.completion_tokens) == (0, 4, 0, 12)
    chats = [port for path, port in served.engine.seen if path == "/v1/chat/completions"]
    assert len(chats) == 4 and len(set(chats)) == 1  # one keep-alive connection to the engine


def test_requests_for_a_starting_deployment_wait_for_one_load_and_are_served(
    served: Served, tmp_path: Path
) -> None:
    deployment_id = served.deploy("slow", tmp_path)
    wait_status(served.api, deployment_id, {"INITIALIZING"})
    urls = [
        f"{served.root}/runtime/models/{deployment_id}/v1/chat/completions",
        f"{served.root}/v1/chat/completions",
        f"{served.root}/v1/chat/completions",
    ]
    answers: list[httpx.Response] = []

    def ask(url: str) -> None:
        answers.append(httpx.post(url, json={**CHAT, "model": "slow"}, timeout=30, trust_env=False))

    threads = [threading.Thread(target=ask, args=(url,)) for url in urls]
    for thread in threads:
        thread.start()
    wait_for(lambda: served.gateway.activity.waiting(deployment_id) == 3, timeout_s=20)
    assert answers == []  # held: the engine is not ready
    assert served.loads == [deployment_id]  # one load asked for, by the first of them
    served.runtime.ready.add("slow")
    for thread in threads:
        thread.join(30)
    assert [a.status_code for a in answers] == [200, 200, 200]
    activity = served.gateway.activity
    wait_for(lambda: activity.get(deployment_id).requests == 3)  # counted as each answer ends


def test_a_held_request_goes_on_when_its_load_serves_not_a_poll_later(
    tmp_path: Path, database_url: str, engine: EngineServer, monkeypatch: pytest.MonkeyPatch
) -> None:
    """With the held request's own look and the reconciler's pass a minute apart, the request
    is answered within seconds of its engine becoming ready: the reconciler looks at a
    starting engine every few milliseconds while a request is held for it, and wakes the
    request the moment it records the deployment serving."""
    monkeypatch.setattr(proxy, "WAIT_POLL_S", 60.0)
    settings = _settings(
        tmp_path, database_url, gateway_wait_s=120.0, route_refresh_s=60.0
    ).model_copy(update={"poll_interval_s": 60.0})
    with serve(settings, engine) as served:
        deployment_id = served.deploy("slow", tmp_path)
        wait_status(served.api, deployment_id, {"INITIALIZING"})
        answers: list[httpx.Response] = []
        url = f"{served.root}/v1/chat/completions"
        asking = threading.Thread(
            target=lambda: answers.append(
                httpx.post(url, json={**CHAT, "model": "slow"}, timeout=90, trust_env=False)
            )
        )
        asking.start()
        wait_for(lambda: served.gateway.activity.waiting(deployment_id) == 1, timeout_s=20)
        served.runtime.ready.add("slow")
        asking.join(30)  # a minute, without the wake-ups
        assert [a.status_code for a in answers] == [200]


def test_a_request_is_never_sent_to_an_engine_this_server_is_stopping(
    tmp_path: Path, database_url: str, engine: EngineServer
) -> None:
    """The route table is read again only every minute here, so after an unload it still
    lists the engine; the request goes to a new load instead (the old engine would be
    shutting down: a stream cut short with nothing in it)."""
    settings = _settings(tmp_path, database_url, gateway_wait_s=20.0, route_refresh_s=60.0)
    with serve(settings, engine) as served:
        served.runtime.ready.add("lazy")
        model = register_tiny_gguf(served.api, tmp_path, name="lazy")
        body = {"m_id": model["id"], "vram_allocation": GIB, "min_copies": 0, "keep_alive": -1}
        answer = served.api.post("/serving/deploy_model", json=body)
        deployment_id = answer.json()
        wait_status(served.api, deployment_id, {"DEPLOYED"})
        url = f"{served.root}/v1/chat/completions"
        first = httpx.post(url, json={**CHAT, "model": "lazy"}, timeout=30, trust_env=False)
        assert first.status_code == 200 and served.loads == []
        table = served.gateway.table.snapshot
        assert table.by_id[deployment_id].engines == (engine.url,)
        reconciler = served.gateway.loader
        assert reconciler.unload(deployment_id, reason="test")  # type: ignore[attr-defined]
        assert served.gateway.table.snapshot is table  # not read again: it lists the engine
        again = httpx.post(url, json={**CHAT, "model": "lazy"}, timeout=30, trust_env=False)
        assert again.status_code == 200
        assert served.loads == [deployment_id]  # held for a load, not sent to the old engine


def test_the_wait_is_bounded_then_503_with_retry_after(
    tmp_path: Path, database_url: str, engine: EngineServer
) -> None:
    settings = _settings(tmp_path, database_url, gateway_wait_s=0.6)
    with serve(settings, engine) as served:
        deployment_id = served.deploy("never", tmp_path)
        wait_status(served.api, deployment_id, {"INITIALIZING"})
        for url in (
            f"{served.root}/runtime/models/{deployment_id}/v1/chat/completions",
            f"{served.root}/v1/chat/completions",
        ):
            started = time.monotonic()
            answer = httpx.post(url, json={**CHAT, "model": "never"}, timeout=30, trust_env=False)
            assert 0.6 <= time.monotonic() - started < 5
            assert answer.status_code == 503
            assert answer.headers["retry-after"] == "5"
            error = answer.json()["error"]
            assert error["code"] == "deployment_not_ready"
            assert "INITIALIZING" in error["message"] and "after waiting 0.6 s" in error["message"]


def test_a_load_that_finds_no_room_answers_the_held_request_at_once(
    tmp_path: Path, database_url: str, engine: EngineServer
) -> None:
    """An unloaded deployment whose load finds no room (another holds the card and may not
    be unloaded for it): the request that asked for the load is answered with the NoFit as
    soon as it is recorded, not after the wait (600 s here, longer than the client waits);
    the next request tries a load of its own, and the one serving goes on serving."""
    settings = _settings(tmp_path, database_url, gateway_wait_s=600.0)
    with serve(settings, engine) as served:
        hog = deployed(served, "hog", tmp_path)
        model = register_tiny_gguf(served.api, tmp_path, name="big")
        body = {"m_id": model["id"], "vram_allocation": 16 * GIB}  # the whole card
        answer = served.api.post(
            "/serving/deploy_model", json={**body, "starting_copies": 0, "min_copies": 0}
        )
        assert answer.status_code == 202, answer.text
        big = answer.json()
        assert wait_status(served.api, big, {"UNLOADED"})["status"] == "UNLOADED"
        url = f"{served.root}/v1/chat/completions"
        for attempt in (1, 2):
            refused = httpx.post(url, json={**CHAT, "model": "big"}, timeout=120, trust_env=False)
            assert refused.status_code == 503, (attempt, refused.text)
            assert refused.headers["retry-after"] == "5"
            error = refused.json()["error"]
            assert error["code"] == "no_room_to_load", error
            assert error["message"].startswith("model 'big' could not be loaded: ")
            assert "insufficient_capacity" in error["message"], error
        assert served.loads == [big, big]
        assert served.api.get(f"/serving/deployment/{big}").json()["status"] == "UNLOADED"
        hogged = httpx.post(url, json={**CHAT, "model": "hog"}, timeout=30, trust_env=False)
        assert hogged.status_code == 200
        assert served.api.get(f"/serving/deployment/{hog}").json()["status"] == "DEPLOYED"


def test_a_server_sharing_the_database_stops_routing_within_the_refresh(
    tmp_path: Path, database_url: str, engine: EngineServer
) -> None:
    """Two servers on one database: the one that did not deploy routes to the deployment at
    once (an unknown id is read again) and stops at its first refresh begun after the other
    stopped it: the refresh, not a request, reads the stop (no wall-clock bound, so a loaded
    machine cannot fail it)."""
    with (
        serve(_settings(tmp_path / "a", database_url), engine) as a,
        serve(_settings(tmp_path / "b", database_url, route_refresh_s=0.5), engine) as b,
    ):
        b.runtime.ready.add("tiny")  # whichever server's reconciler claims it
        deployment_id = deployed(a, "tiny", tmp_path)
        url = f"{b.root}/runtime/models/{deployment_id}/v1/chat/completions"
        assert httpx.post(url, json=CHAT, trust_env=False).status_code == 200
        assert a.api.delete(f"/serving/deployment/{deployment_id}").json() is True
        stopped = time.monotonic()
        table = b.gateway.table
        wait_for(lambda: table.snapshot.taken_at > stopped, timeout_s=30, interval_s=0.02)
        assert deployment_id not in table.snapshot.by_id  # an ended deployment is not active
        answer = httpx.post(url, json=CHAT, trust_env=False)
        assert answer.status_code == 503, answer.text
        assert "STOPPED" in answer.json()["error"]["message"]


def test_an_engine_stopped_after_the_table_was_read_is_a_503_not_a_502(
    tmp_path: Path, database_url: str
) -> None:
    """The table still routes to an engine its deployment's stop has just closed (the next
    refresh is a minute away): the refused connection makes the gateway read again, and the
    caller hears what a request arriving now would, that the deployment was STOPPED."""
    engine = EngineServer()
    threading.Thread(target=engine.serve_forever, daemon=True).start()
    try:
        with serve(_settings(tmp_path, database_url, route_refresh_s=60.0), engine) as served:
            deployment_id = deployed(served, "tiny", tmp_path)
            unknown = f"{served.root}/runtime/models/{'0' * 8}-0000-0000-0000-{'0' * 12}/v1/models"
            assert httpx.get(unknown, trust_env=False).status_code == 404  # reads the table
            assert served.gateway.table.snapshot.by_id[deployment_id].engines == (engine.url,)
            assert served.api.delete(f"/serving/deployment/{deployment_id}").json() is True
            engine.shutdown()
            engine.server_close()  # the engine's port now refuses connections
            url = f"{served.root}/runtime/models/{deployment_id}/v1/chat/completions"
            answer = httpx.post(url, json=CHAT, timeout=30, trust_env=False)
            assert answer.status_code == 503, answer.text
            assert answer.json()["error"]["code"] == "deployment_not_ready"
            assert "STOPPED" in answer.json()["error"]["message"]
    finally:
        engine.server_close()


def test_the_least_busy_engine_is_chosen() -> None:
    """Copies of a deployment are engines of one target; the gateway's in-flight counts
    choose among them, the first listed among equals."""
    since = datetime(2026, 12, 1, tzinfo=UTC)
    one = Target(
        deployment_id="a",
        model_name="m",
        status=DeploymentStatus.DEPLOYED,
        engines=("http://e1", "http://e2"),
        since=since,
    )
    two = Target(
        deployment_id="b",
        model_name="m",
        status=DeploymentStatus.DEPLOYED,
        engines=("http://e3",),
        since=since,
    )
    assert least_busy((one, two), {}).base_url == "http://e1"
    assert least_busy((one, two), {"http://e1": 2, "http://e2": 1, "http://e3": 1}).base_url == (
        "http://e2"
    )
    route = least_busy((one, two), {"http://e1": 2, "http://e2": 1, "http://e3": 0})
    assert (route.deployment_id, route.base_url) == ("b", "http://e3")
    # An engine that refused a connection is taken only when nothing else is there.
    busy = {"http://e1": 0, "http://e2": 4, "http://e3": 3}
    assert least_busy((one, two), busy, avoid=frozenset({"http://e1"})).base_url == "http://e3"
    everyone = frozenset({"http://e1", "http://e2", "http://e3"})
    assert least_busy((one, two), busy, avoid=everyone).base_url == "http://e1"


@pytest.mark.parametrize("raw_id", ["a%00b", "x" * 65, "00000000-0000-0000-0000-000000000007"])
def test_ids_no_store_holds_are_a_404_without_a_fault(served: Served, raw_id: str) -> None:
    answer = httpx.get(f"{served.root}/runtime/models/{raw_id}/v1/models", trust_env=False)
    assert answer.status_code == 404, answer.text
    assert answer.json()["error"]["code"] == "deployment_not_found"
