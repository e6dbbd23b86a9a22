"""The issue's end-to-end run, as a user does it, with no GPU and no network: `cohabit serve
--fleet` a simulated 16 GiB card (the engines run on the CPU), register the tiny model (written
here), deploy it twice with 6 GiB each — both DEPLOYED on gpu 0, each answering chat through
its own /runtime/models/{id}/v1 and through /v1 by name, streaming too — a third refused with
NoFitError / insufficient_capacity; stopping one frees its budget and its process group."""

from __future__ import annotations

import json
import time
from pathlib import Path
from typing import Any

import httpx

from cohabit.runtime.process import group_alive
from cohabit.runtime.tinymodel import write_tiny_model
from cohabit.units import GIB
from tests.cli.test_serve import T4, cohabit_serve
from tests.e2e.engines import kill_engines

ENDED = {"ERROR", "FAILED", "MUST_REDOWNLOAD", "STOPPED"}
CHAT = {"messages": [{"role": "user", "content": "hello"}], "max_tokens": 8}


def wait_status(client: httpx.Client, deployment_id: str, wanted: set[str]) -> dict[str, Any]:
    deadline = time.monotonic() + 120
    while (record := client.get(f"/serving/deployment/{deployment_id}").json())[
        "status"
    ] not in wanted:
        assert time.monotonic() < deadline, record
        time.sleep(0.2)
    result: dict[str, Any] = record
    return result


def reply_of(response: httpx.Response) -> str:
    assert response.status_code == 200, response.text
    content: str = response.json()["choices"][0]["message"]["content"]
    return content


def test_two_tiny_models_share_a_16_gib_card(tmp_path: Path) -> None:
    model_path = write_tiny_model(tmp_path / "tiny.gguf")
    pids: list[int] = []
    with (
        cohabit_serve(tmp_path, T4) as (api, _process),
        httpx.Client(base_url=api, timeout=60, trust_env=False) as client,
    ):
        root = api.removesuffix("/api")
        try:
            model = client.post("/models/", json={"name": "tiny", "path": str(model_path)})
            assert model.status_code == 201, model.text
            body = {"m_id": model.json()["id"], "vram_allocation": 6 * GIB}
            first, second, third = (
                client.post("/serving/deploy_model", json=body).json() for _ in range(3)
            )
            records = [wait_status(client, d, {"DEPLOYED", *ENDED}) for d in (first, second)]
            for record in records:
                assert record["status"] == "DEPLOYED", record["last_error_message"]
                assert (record["node_name"], record["gpu_index"]) == ("node-a", 0)
                assert (record["hardware_class"], record["sharing_class"]) == (
                    "software_shared",
                    "fractional",
                )
                assert record["allocated_capacity_gb"] == 6
                assert record["endpoint"] == f"{root}/runtime/models/{record['id']}/v1"
                pids.append(int(record["instances"][0]["container_id"]))
                reply = reply_of(
                    httpx.post(
                        f"{record['endpoint']}/chat/completions",
                        json={"model": "tiny", **CHAT},
                        timeout=60,
                        trust_env=False,
                    )
                )
                assert len(reply) >= 1

            refused = wait_status(client, third, ENDED)
            assert (refused["status"], refused["last_error_code"]) == ("FAILED", "NoFitError")
            assert refused["last_error_message"].startswith(
                "insufficient_capacity: 0/1 nodes fit: 1 insufficient GPU memory "
                "(largest free 4 GiB on node-a gpu 0)"
            )

            assert len(reply_of(chat_by_name(root))) >= 1
            events = stream_chat(f"{records[1]['endpoint']}/chat/completions")
            assert events[-1] == "[DONE]"
            assert all(json.loads(e)["object"] == "chat.completion.chunk" for e in events[:-1])

            assert client.delete(f"/serving/deployment/{first}").json() is True
            deadline = time.monotonic() + 30
            while group_alive(pids[0]):
                assert time.monotonic() < deadline, "the engine outlived its deployment"
                time.sleep(0.1)
            slot = client.get("/cluster/hardware").json()[0]["slots"][0]
            assert (slot["reserved_bytes"], slot["free_bytes"]) == (6 * GIB, 10 * GIB)
            gone = httpx.post(
                f"{records[0]['endpoint']}/chat/completions", json=CHAT, trust_env=False
            )
            assert gone.status_code == 503
            assert group_alive(pids[1])
            assert len(reply_of(chat_by_name(root))) >= 1  # the other one still serves
        finally:
            kill_engines(tmp_path / "data")  # a failing test must not leave engines behind


def chat_by_name(root: str) -> httpx.Response:
    """A chat completion through /v1, routed by the `model` field."""
    return httpx.post(
        f"{root}/v1/chat/completions",
        json={"model": "tiny", **CHAT},
        timeout=60,
        trust_env=False,
    )


def stream_chat(url: str) -> list[str]:
    """The `data:` payloads of a streamed chat completion, as they arrive through the proxy."""
    events: list[str] = []
    body = {"model": "tiny", "stream": True, **CHAT}
    with httpx.stream("POST", url, json=body, timeout=60, trust_env=False) as response:
        assert response.status_code == 200
        assert response.headers["content-type"].startswith("text/event-stream")
        for line in response.iter_lines():
            if line.startswith("data: "):
                events.append(line.removeprefix("data: ").strip())
    return events
