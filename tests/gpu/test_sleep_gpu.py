"""On a real NVIDIA GPU with vLLM: two models alternate on one card that holds only one of
them awake. Each sleeps when idle, and NVML's per-process figure for the sleeping engine
shows what it really keeps: no more than the residue the ledger holds for it (plus the
headroom vLLM's own sleep leaves, which this test prints).

Needs `vllm` on PATH (a CUDA build) and COHABIT_GPU_VLLM_MODEL: a local model directory
vLLM can serve (config, safetensors and tokenizer; a small one, e.g. Qwen3-0.6B). Opt-in with
`pytest -m gpu` like the other GPU checks; it fails, saying why, without them.
"""

from __future__ import annotations

import os
import shutil
import time
from dataclasses import replace
from pathlib import Path
from typing import Any

import httpx
import pytest

from cohabit.hardware.fleetfile import dump_fleet
from cohabit.hardware.model import Fleet, Gpu, Node
from cohabit.units import GIB
from tests.cli.test_serve import cohabit_serve
from tests.e2e.engines import wait_deployed
from tests.gpu.test_on_gpu import used_on

pytestmark = pytest.mark.gpu

# A sleeping vLLM keeps its CUDA context, CUDA graphs and library workspaces; the ledger holds
# the estimate of those. What NVML shows may exceed it by what vLLM's allocator does not
# return at once; this much more is tolerated, and the figure is printed.
SLACK_BYTES = GIB // 2


@pytest.fixture
def vllm_model() -> Path:
    if shutil.which("vllm") is None:
        pytest.fail("this check needs vLLM's `vllm` command (a CUDA build) on PATH")
    given = os.environ.get("COHABIT_GPU_VLLM_MODEL")
    if not given or not Path(given, "config.json").is_file():
        pytest.fail("set COHABIT_GPU_VLLM_MODEL to a local model directory vLLM can serve")
    return Path(given)


def deploy_sleeper(client: httpx.Client, model: Path, name: str, vram_bytes: int) -> str:
    registered = client.post("/models/", json={"name": name, "path": str(model)})
    assert registered.status_code == 201, registered.text
    body = {
        "m_id": registered.json()["id"],
        "engine_name": "vllm",
        "vram_allocation": vram_bytes,
        "min_copies": 0,
        "keep_alive": 2,
    }
    answer = client.post("/serving/deploy_model", json=body)
    assert answer.status_code == 202, answer.text
    deployment_id: str = answer.json()
    return deployment_id


def wait_for_event(client: httpx.Client, deployment_id: str, kind: str, after: int = 0) -> int:
    """The id of the first `kind` event after `after`, waiting for it (5 minutes at most)."""
    deadline = time.monotonic() + 300
    while True:
        found = client.get(f"/serving/deployment/{deployment_id}/events?after={after}").json()
        for event in found["events"]:
            if event["kind"] == kind:
                return int(event["id"])
        assert time.monotonic() < deadline, f"no {kind} event for {deployment_id}"
        time.sleep(0.5)


def chat(api: str, name: str) -> dict[str, Any]:
    body = {"model": name, "messages": [{"role": "user", "content": "Say hi."}], "max_tokens": 4}
    answer = httpx.post(f"{api.removesuffix('/api')}/v1/chat/completions", json=body, timeout=600)
    assert answer.status_code == 200, answer.text
    return dict(answer.json())


def test_two_models_alternate_on_one_card_and_a_sleeper_keeps_only_its_residue(
    tmp_path: Path, machine: Node, vllm_model: Path, data_dir: Path
) -> None:
    whole = [gpu for gpu in machine.gpus if not gpu.partitions]
    if not whole or not whole[0].uuid:
        pytest.fail("needs a GPU without MIG, with a UUID")
    card: Gpu = whole[0]
    budget = int(card.memory_bytes * 0.6)  # one awake at a time: two do not fit
    fleet = dump_fleet(Fleet(nodes=(replace(machine, gpus=(card,), notices=()),)))
    with (
        cohabit_serve(tmp_path, fleet) as (api, _process),
        httpx.Client(base_url=api, timeout=60) as client,
    ):
        first = deploy_sleeper(client, vllm_model, "first", budget)
        pid = int(wait_deployed(client, first, timeout_s=900)["instances"][0]["container_id"])
        chat(api, "first")
        wait_for_event(client, first, "slept")
        reservations = client.get(f"/serving/deployment/{first}").json()
        used = used_on(card.uuid or "", pid)
        print(f"first asleep: NVML {used} bytes; record {reservations.get('allocated_bytes')}")
        assert used is not None, "the sleeping engine's process left the GPU"

        second = deploy_sleeper(client, vllm_model, "second", budget)  # fits: first sleeps
        wait_deployed(client, second, timeout_s=900)
        chat(api, "second")
        slept = wait_for_event(client, second, "slept")
        chat(api, "first")  # wakes first, in its own process
        woke = wait_for_event(client, first, "woke")
        assert woke and slept
        again = client.get(f"/serving/deployment/{first}").json()
        assert int(again["instances"][0]["container_id"]) == pid

        # The ledger's residue for a sleeper, against what NVML shows it keeping.
        wait_for_event(client, first, "slept", after=woke)
        events = client.get(f"/serving/deployment/{first}/events?after={woke}").json()
        residue = next(e for e in events["events"] if e["kind"] == "slept")["data"]
        used = used_on(card.uuid or "", pid)
        print(f"first asleep again: NVML {used} bytes, ledger residue {residue['residue_bytes']}")
        assert used is not None and used <= residue["residue_bytes"] + SLACK_BYTES
