"""The gateway in front of a deployment's copies, over real HTTP (the app on a loopback port,
SQLite and PostgreSQL): each copy's engine is a stand-in OpenAI engine of its own in this
process (tests/service/test_gateway.py's `EngineServer`, which answers as llama-cpp-python's
server does), so a test sees which copy each request reached. Which copies are ready is up
to the test (`CopyRuntime`). Two real llama.cpp engines go through the same route in the
end-to-end copies test."""

from __future__ import annotations

import threading
from collections.abc import Iterator
from contextlib import ExitStack
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import httpx
import pytest

from cohabit.runtime.interface import EngineHandle, EngineState, EngineStatus, LaunchRequest
from cohabit.service.app import Backend, create_app
from cohabit.service.gateway.proxy import Gateway
from cohabit.store import deployments
from cohabit.store.database import Database
from cohabit.units import GIB
from tests.service.server import T4_FLEET, register_tiny_gguf, serving_app, settings_for, wait_for
from tests.service.test_gateway import CHAT, EngineServer, StandInRuntime


@dataclass
class CopyRuntime(StandInRuntime):
    """Each engine started (one per copy) is the next free one of `stand_ins`; it is READY
    once its URL is in `ready`."""

    stand_ins: list[EngineServer]
    ready: set[str] = field(default_factory=set)
    started: dict[str, EngineServer] = field(default_factory=dict)  # copy row id → engine
    lock: threading.Lock = field(default_factory=threading.Lock)

    def start(self, request: LaunchRequest) -> EngineHandle:
        with self.lock:
            engine = self.stand_ins[len(self.started)]
            self.started[request.deployment_id] = engine
        return EngineHandle(deployment_id=request.deployment_id, base_url=engine.url)

    def status(self, handle: EngineHandle) -> EngineStatus:
        engine = self.started.get(handle.deployment_id)
        ready = engine is not None and engine.url in self.ready
        return EngineStatus(state=EngineState.READY if ready else EngineState.STARTING)

    def adopt(self, handle: EngineHandle) -> EngineHandle | None:
        return handle if handle.deployment_id in self.started else None


@dataclass(frozen=True)
class Copies:
    api: httpx.Client
    root: str
    runtime: CopyRuntime
    engines: list[EngineServer]
    activity: Any
    db: Database
    gateway: Gateway

    def deploy(self, tmp_path: Path, copies: int) -> str:
        model = register_tiny_gguf(self.api, tmp_path, name="tiny")
        answer = self.api.post(
            "/serving/deploy_model",
            json={"m_id": model["id"], "vram_allocation": GIB, "starting_copies": copies},
        )
        assert answer.status_code == 202, answer.text
        deployment_id: str = answer.json()
        return deployment_id

    def serving(self, deployment_id: str, count: int) -> None:
        """Wait until `count` copies serve, as the API shows and as the gateway's route
        table (read every `route_refresh_s`, so a pass behind the database) holds them."""
        wait_for(lambda: self.shown(deployment_id)["ready_copies"] == count)

        def routed() -> bool:
            target = self.gateway.table.snapshot.by_id.get(deployment_id)
            return target is not None and len(target.engines) == count

        wait_for(routed)

    def shown(self, deployment_id: str) -> dict[str, Any]:
        record: dict[str, Any] = self.api.get(f"/serving/deployment/{deployment_id}").json()
        return record

    def engine_of(self, deployment_id: str, copy_index: int) -> EngineServer:
        """The stand-in serving copy `copy_index`, found by the URL its instance shows."""
        for instance in self.shown(deployment_id)["instances"]:
            if instance["extra_details"]["copy_index"] == copy_index:
                url = instance["extra_details"]["base_url"]
                return next(e for e in self.engines if e.url == url)
        raise AssertionError(f"copy {copy_index} has no instance")


@pytest.fixture
def copies(tmp_path: Path, database_url: str) -> Iterator[Copies]:
    with ExitStack() as stack:
        engines = [EngineServer(), EngineServer()]
        for engine in engines:
            threading.Thread(target=engine.serve_forever, daemon=True).start()
            stack.callback(engine.server_close)
            stack.callback(engine.shutdown)
            stack.callback(engine.release.set)
        runtime = CopyRuntime(engines)
        settings = settings_for(tmp_path, database_url, gateway_wait_s=10.0)
        app = create_app(settings, Backend(runtime=runtime, fleet=T4_FLEET))
        api = stack.enter_context(serving_app(app))
        client = stack.enter_context(httpx.Client(base_url=api, timeout=30, trust_env=False))
        db = Database(database_url)
        stack.callback(db.dispose)
        yield Copies(
            api=client,
            root=api.removesuffix("/api"),
            runtime=runtime,
            engines=engines,
            activity=app.state.context.activity,
            db=db,
            gateway=app.state.gateway,
        )


def chats(engine: EngineServer) -> int:
    return sum(path == "/v1/chat/completions" for path, _ in engine.seen)


def test_requests_spread_over_the_copies_least_in_flight_first(
    copies: Copies, tmp_path: Path
) -> None:
    copies.runtime.ready |= {e.url for e in copies.engines}
    deployment_id = copies.deploy(tmp_path, 2)
    copies.serving(deployment_id, 2)
    first, second = copies.engine_of(deployment_id, 0), copies.engine_of(deployment_id, 1)
    assert first is not second
    url = f"{copies.root}/v1/chat/completions"
    body = {**CHAT, "model": "tiny"}
    with (
        httpx.Client(timeout=30, trust_env=False) as client,
        client.stream("POST", url, json={**body, "stream": True}) as held,
    ):
        pieces = held.iter_raw()
        next(pieces)  # the copy that took it holds the rest until its `release`
        # Either copy may take the first request (both have none in flight): find which.
        assert sorted((chats(first), chats(second))) == [0, 1]
        busy, idle = (first, second) if chats(first) == 1 else (second, first)
        # The busy copy has one request in flight: the next go to the other, by name and id.
        answer = client.post(url, json=body)
        assert answer.status_code == 200, answer.text
        by_id = f"{copies.root}/runtime/models/{deployment_id}/v1/chat/completions"
        assert client.post(by_id, json=body).status_code == 200
        assert (chats(busy), chats(idle)) == (1, 2)
        busy.release.set()
        b"".join(pieces)
        # A copy's own id routes to its deployment: the least busy copy serves it.
        copy_id = deployments.copies_of(copies.db, deployment_id)[1].id
        by_copy = f"{copies.root}/runtime/models/{copy_id}/v1/chat/completions"
        assert client.post(by_copy, json=body).status_code == 200
    # Counted under the deployment (copies are no deployments of their own).
    usage = wait_for(lambda: (u := copies.activity.get(deployment_id)).requests == 4 and u)
    assert (usage.in_flight, usage.errors) == (0, 0)
    models = httpx.get(f"{copies.root}/v1/models", trust_env=False).json()["data"]
    assert [m["id"] for m in models] == ["tiny"]  # one name, not one per copy


def test_copy_0_not_serving_while_copy_1_serves_still_routes_to_copy_1(
    copies: Copies, tmp_path: Path
) -> None:
    deployment_id = copies.deploy(tmp_path, 2)
    wait_for(lambda: len(copies.shown(deployment_id)["instances"]) == 2)  # both starting
    first, second = copies.engine_of(deployment_id, 0), copies.engine_of(deployment_id, 1)
    copies.runtime.ready.add(second.url)  # copy 1 is ready; copy 0 is still starting
    record = wait_for(lambda: (r := copies.shown(deployment_id))["ready_copies"] == 1 and r)
    assert (record["status"], record["copies"]) == ("DEPLOYED", 2)
    statuses = {
        i["extra_details"]["copy_index"]: (i["status"], i["extra_details"]["copy_status"])
        for i in record["instances"]
    }
    assert statuses == {0: ("REQUESTED", "INITIALIZING"), 1: ("DEPLOYED", "DEPLOYED")}
    with httpx.Client(timeout=30, trust_env=False) as client:
        for url in (
            f"{copies.root}/v1/chat/completions",
            f"{copies.root}/runtime/models/{deployment_id}/v1/chat/completions",
        ):
            answer = client.post(url, json={**CHAT, "model": "tiny"})
            assert answer.status_code == 200, answer.text
    assert (chats(first), chats(second)) == (0, 2)
    copies.runtime.ready.add(first.url)  # copy 0 serves again: both share the load
    wait_for(lambda: copies.shown(deployment_id)["ready_copies"] == 2)


def test_a_copy_whose_engine_went_away_unnoticed_is_passed_over(
    copies: Copies, tmp_path: Path
) -> None:
    """Copy 0's engine stops answering before anything notices (the runtime still calls it
    READY): a request that finds its connection refused is routed again and, the refused
    engine still counting it in flight, reaches copy 1."""
    copies.runtime.ready |= {e.url for e in copies.engines}
    deployment_id = copies.deploy(tmp_path, 2)
    copies.serving(deployment_id, 2)
    first, second = copies.engine_of(deployment_id, 0), copies.engine_of(deployment_id, 1)
    first.shutdown()
    first.server_close()  # its port now refuses connections
    with httpx.Client(timeout=30, trust_env=False) as client:
        for _ in range(3):
            answer = client.post(
                f"{copies.root}/v1/chat/completions", json={**CHAT, "model": "tiny"}
            )
            assert answer.status_code == 200, answer.text
    assert chats(second) == 3
    assert copies.shown(deployment_id)["status"] == "DEPLOYED"


def test_a_refused_engine_is_passed_over_even_when_the_other_copy_is_busier(
    copies: Copies, tmp_path: Path
) -> None:
    """Copy 1 looks busier (in flight through this gateway) than copy 0, whose engine has
    gone unnoticed: the refused connection's retry, and the requests after it, go to copy 1
    instead of trying the dead engine again (a 502)."""
    copies.runtime.ready |= {e.url for e in copies.engines}
    deployment_id = copies.deploy(tmp_path, 2)
    copies.serving(deployment_id, 2)
    first, second = copies.engine_of(deployment_id, 0), copies.engine_of(deployment_id, 1)
    first.shutdown()
    first.server_close()
    copies.gateway.in_flight[second.url] = 5  # as if five long answers were streaming
    try:
        with httpx.Client(timeout=30, trust_env=False) as client:
            for _ in range(3):
                answer = client.post(
                    f"{copies.root}/v1/chat/completions", json={**CHAT, "model": "tiny"}
                )
                assert answer.status_code == 200, answer.text
    finally:
        copies.gateway.in_flight[second.url] -= 5
    assert chats(second) == 3
    assert set(copies.gateway.refused) == {first.url}
