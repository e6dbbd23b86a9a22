"""The sleep client (runtime/sleep.py) against vLLM's sleep routes.

Two seams: a table of answers through httpx.MockTransport (what each status and body
becomes), and a running fake_vllm.py — a boundary double fed by vLLM's source
(vllm/entrypoints/serve/sleep/api_router.py, vllm/v1/engine/core.py, vllm/envs.py; see its
docstring), not vLLM itself: no GPU here, so its memory figures are reported, not held.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
import threading
import time
from collections.abc import Callable, Iterator
from pathlib import Path

import httpx
import pytest

from cohabit.placement.residency import SleepLevel
from cohabit.runtime.errors import SleepError, SleepUnsupported
from cohabit.runtime.process import free_port
from cohabit.runtime.sleep import SleepClient
from cohabit.units import GIB
from tests.runtime.conftest import FAKE_VLLM

BASE = "http://engine.test"


def client_answering(status: int, body: object = None) -> SleepClient:
    def answer(request: httpx.Request) -> httpx.Response:
        if body is None:
            return httpx.Response(status)
        return httpx.Response(status, json=body)

    return SleepClient(base_url=BASE, name="dep-1", transport=httpx.MockTransport(answer))


VLLM_ERROR = {"error": {"message": "CUDA error: out of memory", "type": "X", "code": 500}}


@pytest.mark.parametrize(
    ("status", "body", "error", "message"),
    [
        (404, {"detail": "Not Found"}, SleepUnsupported, "dep-1: no /wake_up route: .*sleep mode"),
        (500, VLLM_ERROR, SleepError, "dep-1: POST /wake_up answered 500: CUDA error: out of"),
        (503, {"detail": "busy"}, SleepError, "answered 503: busy"),
    ],
    ids=["no-route", "vllm-error", "fastapi-detail"],
)
def test_a_wake_that_fails_says_why(
    status: int, body: object, error: type[Exception], message: str
) -> None:
    with pytest.raises(error, match=message):
        client_answering(status, body).wake_up(SleepLevel.OFFLOAD)


@pytest.mark.parametrize(
    ("body", "expected"),
    [({"is_sleeping": True}, True), ({"is_sleeping": False}, False)],
)
def test_is_sleeping_reads_the_flag(body: object, expected: bool) -> None:
    assert client_answering(200, body).is_sleeping() is expected


@pytest.mark.parametrize("body", [{"is_sleeping": "yes"}, {}, ["x"]])
def test_is_sleeping_refuses_an_answer_of_another_shape(body: object) -> None:
    with pytest.raises(SleepError, match=r"not .*is_sleeping"):
        client_answering(200, body).is_sleeping()


def test_an_engine_that_does_not_answer_in_time_is_an_error() -> None:
    def slow(request: httpx.Request) -> httpx.Response:
        raise httpx.ReadTimeout("timed out", request=request)

    client = SleepClient(base_url=BASE, name="dep-1", transport=httpx.MockTransport(slow))
    with pytest.raises(SleepError, match=r"dep-1: POST /sleep took more than 2 s"):
        client.sleep(SleepLevel.OFFLOAD, timeout_s=2)


def test_level_two_wakes_the_weights_reloads_them_then_the_kv_cache() -> None:
    seen: list[str] = []

    def record(request: httpx.Request) -> httpx.Response:
        body = request.content.decode()
        seen.append(f"{request.url.path}?{request.url.query.decode()}{body}")
        return httpx.Response(200)

    client = SleepClient(base_url=BASE, transport=httpx.MockTransport(record))
    client.sleep(SleepLevel.DISCARD)
    client.wake_up(SleepLevel.DISCARD)
    assert seen == [
        "/sleep?level=2",
        "/wake_up?tags=weights",
        '/collective_rpc?{"method":"reload_weights"}',
        "/wake_up?tags=kv_cache",
    ]


# The stand-in, running.


Engine = Callable[..., tuple[SleepClient, Path]]


@pytest.fixture
def engine(tmp_path: Path) -> Iterator[Engine]:
    """Start fake_vllm.py: `sleep_mode` passes --enable-sleep-mode, `dev_mode` sets
    VLLM_SERVER_DEV_MODE=1. Returns a client and the file that fails the next wake."""
    started: list[subprocess.Popen[bytes]] = []

    def start(*, sleep_mode: bool = True, dev_mode: bool = True) -> tuple[SleepClient, Path]:
        port = free_port()
        fail_wake = tmp_path / f"fail-wake-{port}"
        env = {
            **os.environ,
            "FAKE_VLLM_RECORD": str(tmp_path / f"record-{port}.json"),
            "FAKE_VLLM_FAIL_WAKE": str(fail_wake),
            "FAKE_VLLM_WEIGHTS_BYTES": str(4 * GIB),
            "FAKE_VLLM_KV_BYTES": str(2 * GIB),
            "FAKE_VLLM_RESIDUE_BYTES": str(GIB // 2),
        }
        env.pop("VLLM_SERVER_DEV_MODE", None)
        if dev_mode:
            env["VLLM_SERVER_DEV_MODE"] = "1"
        argv = [sys.executable, str(FAKE_VLLM), "serve", "m", "--port", str(port)]
        if sleep_mode:
            argv.append("--enable-sleep-mode")
        process = subprocess.Popen(argv, env=env, stdout=subprocess.DEVNULL)
        started.append(process)
        url = f"http://127.0.0.1:{port}"
        deadline = time.monotonic() + 30
        while True:
            try:
                if httpx.get(f"{url}/health", trust_env=False).status_code == 200:
                    break
            except httpx.TransportError:
                pass
            if time.monotonic() > deadline or process.poll() is not None:
                pytest.fail("fake_vllm.py did not start")
            time.sleep(0.05)
        return SleepClient(base_url=url, name="dep-1"), fail_wake

    yield start
    for process in started:
        process.kill()
        process.wait()


def memory(client: SleepClient) -> dict[str, int]:
    return dict(httpx.get(f"{client.base_url}/fake/memory", trust_env=False).json())


def chat(client: SleepClient) -> str:
    body = {"model": "m", "messages": [{"role": "user", "content": "hi"}]}
    answer = httpx.post(
        f"{client.base_url}/v1/chat/completions", json=body, timeout=30, trust_env=False
    )
    return str(answer.json()["choices"][0]["message"]["content"])


def test_level_one_keeps_the_residue_on_the_device_and_the_weights_on_the_host(
    engine: Engine,
) -> None:
    client, _ = engine()
    assert memory(client) == {"device_bytes": 6 * GIB, "host_bytes": 0}
    client.sleep(SleepLevel.OFFLOAD)
    assert client.is_sleeping()
    assert memory(client) == {"device_bytes": GIB // 2, "host_bytes": 4 * GIB}
    client.sleep(SleepLevel.OFFLOAD)  # again: vLLM's executor ignores it
    client.wake_up(SleepLevel.OFFLOAD)
    assert not client.is_sleeping()
    assert memory(client) == {"device_bytes": 6 * GIB, "host_bytes": 0}


def test_a_request_to_a_sleeping_engine_waits_for_the_wake(engine: Engine) -> None:
    """vLLM pauses its scheduler while asleep: the request is accepted and answered after
    the wake, never refused."""
    client, _ = engine()
    client.sleep(SleepLevel.OFFLOAD)
    answers: list[str] = []
    asking = threading.Thread(target=lambda: answers.append(chat(client)))
    asking.start()
    client.wake_up(SleepLevel.OFFLOAD)
    asking.join(timeout=30)
    assert answers == ["hello"]


def test_level_two_discards_the_weights_and_the_client_reloads_them(engine: Engine) -> None:
    client, _ = engine()
    client.sleep(SleepLevel.DISCARD)
    assert memory(client) == {"device_bytes": GIB // 2, "host_bytes": 0}
    client.wake_up(SleepLevel.DISCARD)
    assert chat(client) == "hello"


def test_a_level_two_wake_without_the_reload_serves_discarded_weights(engine: Engine) -> None:
    """Why the client reloads: vLLM's wake gives the weights' memory back, not their values."""
    client, _ = engine()
    client.sleep(SleepLevel.DISCARD)
    client.wake_up(SleepLevel.OFFLOAD)  # a plain /wake_up
    assert chat(client) == "<discarded weights>"


def test_a_failed_wake_is_an_error_and_the_engine_still_sleeps(engine: Engine) -> None:
    client, fail_wake = engine()
    client.sleep(SleepLevel.OFFLOAD)
    fail_wake.touch()
    with pytest.raises(SleepError, match="answered 500: CUDA error: out of memory"):
        client.wake_up(SleepLevel.OFFLOAD)
    assert client.is_sleeping()
    client.wake_up(SleepLevel.OFFLOAD)  # the failure was the next wake only
    assert not client.is_sleeping()


def test_without_dev_mode_vllm_has_no_sleep_routes(engine: Engine) -> None:
    client, _ = engine(dev_mode=False)
    with pytest.raises(SleepUnsupported, match="no /sleep route"):
        client.sleep(SleepLevel.OFFLOAD)
    with pytest.raises(SleepUnsupported):
        client.is_sleeping()


def test_without_sleep_mode_vllm_sleeps_in_name_only(engine: Engine) -> None:
    """vLLM answers 200 but its allocator holds no pool, so nothing is freed: why the
    launcher always passes --enable-sleep-mode with the development mode."""
    client, _ = engine(sleep_mode=False)
    client.sleep(SleepLevel.OFFLOAD)
    assert client.is_sleeping()
    assert memory(client) == {"device_bytes": 6 * GIB, "host_bytes": 0}


def test_a_sleep_level_that_is_not_a_number_is_vllms_500(engine: Engine) -> None:
    client, _ = engine()
    answer = httpx.post(f"{client.base_url}/sleep?level=deep", trust_env=False)
    assert answer.status_code == 500
    assert "invalid literal" in json.loads(answer.text)["error"]["message"]
