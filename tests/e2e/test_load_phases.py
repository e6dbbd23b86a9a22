"""A load's phases end to end, over real HTTP on loopback against the app with the real
LocalRuntime and SQLite:

- a request through the gateway for an unloaded deployment of the tiny GGUF on the real
  llama-cpp-python server: its timeline shows the engine's milestones from its log, the
  `healthy` event every phase of the load (the engine's parts summing to `engine_load`),
  then `first_token` for the held request; `/metrics` has one series per phase;
- a vLLM deployment (tests/fixtures/runtime/fake_vllm.py, printing vLLM's own lines) held
  mid-way through reading its weights: the API's record, the web page and `cohabit ps` show
  the phase under way and the finished ones while it lasts, and nothing once it serves.
"""

from __future__ import annotations

import re
from collections.abc import Iterator
from pathlib import Path
from typing import Any, TypeVar

import httpx
import pytest

from cohabit.runtime.spawner import LocalRuntime
from cohabit.runtime.tinymodel import write_tiny_model
from cohabit.service.control.loadphases import ENGINE_PARTS, LOAD_PHASES
from cohabit.units import GIB
from tests.conftest import run_cli
from tests.e2e.engines import eventually, kill_engines
from tests.estimate.tinymodels import write_safetensors_model
from tests.placement.fleets import fleet, gpu, node
from tests.runtime.conftest import fake_vllm_on_path
from tests.service.server import T4_FLEET, settings_for, wait_status
from tests.service.server import serving as app_serving

T = TypeVar("T")
CHAT = {"messages": [{"role": "user", "content": "hello"}], "max_tokens": 4}
LOAD_KINDS = [
    "loading", "placed", "reserved", "started", "engine_imported", "weights_loaded", "healthy",
    "first_token",
]  # fmt: skip
# A card vLLM runs on (the stand-in needs no GPU; the launcher refuses CPU pools).
NVIDIA = fleet(node("node-a", gpu(0, 80, product="H100", uuid="GPU-h100-0")))


@pytest.fixture
def runtime(tmp_path: Path) -> Iterator[LocalRuntime]:
    made = LocalRuntime(tmp_path / "data", stop_grace_s=3.0)
    try:
        yield made
    finally:
        kill_engines(tmp_path / "data")


def events_of(client: httpx.Client, deployment_id: str) -> list[dict[str, Any]]:
    answer = client.get(f"/serving/deployment/{deployment_id}/events")
    assert answer.status_code == 200, answer.text
    found: list[dict[str, Any]] = answer.json()["events"]
    return found


def metric_samples(root: str, name: str) -> dict[str, float]:
    """`name`'s samples on /metrics, by their label text."""
    text = httpx.get(f"{root}/metrics", timeout=30, trust_env=False).text
    return {
        line.split(" ")[0].removeprefix(name): float(line.split(" ")[1])
        for line in text.splitlines()
        if line.startswith(name + "{")
    }


@pytest.mark.slow
def test_a_load_on_demand_records_every_phase_and_the_first_token(
    tmp_path: Path, runtime: LocalRuntime
) -> None:
    """Admitted unloaded; a chat through the gateway is held while the real engine loads."""
    settings = settings_for(tmp_path, f"sqlite:///{tmp_path / 'cohabit.db'}")
    model = write_tiny_model(tmp_path / "tiny.gguf", seed=5)
    with (
        app_serving(settings, runtime, fleet=T4_FLEET) as api,
        httpx.Client(base_url=api, timeout=120, trust_env=False) as client,
    ):
        model_id = client.post("/models/", json={"name": "tiny", "path": str(model)}).json()["id"]
        body = {"m_id": model_id, "vram_allocation": GIB, "min_copies": 0, "starting_copies": 0}
        deployed = client.post("/serving/deploy_model", json=body)
        assert deployed.status_code == 202, deployed.text
        deployment_id = deployed.json()
        wait_status(client, deployment_id, {"UNLOADED"})
        root = api.removesuffix("/api")

        answer = httpx.post(
            f"{root}/v1/chat/completions", json={**CHAT, "model": "tiny"}, timeout=120,
            trust_env=False,
        )  # fmt: skip
        assert answer.status_code == 200, answer.text

        def loaded() -> list[dict[str, Any]] | None:
            found = events_of(client, deployment_id)
            return found if found[-1]["kind"] == "first_token" else None

        timeline = eventually(loaded)
        samples = metric_samples(root, "cohabit_load_phase_seconds_count")

    kinds = [event["kind"] for event in timeline]
    assert kinds[kinds.index("loading") :] == LOAD_KINDS, kinds
    moments = [event["at"] for event in timeline[kinds.index("loading") :]]
    assert moments == sorted(moments)
    healthy, first_token = timeline[-2], timeline[-1]
    phases = healthy["data"]["load_phases_s"]
    assert list(phases) == [name for name in LOAD_PHASES if name != "first_token"]
    assert all(seconds >= 0 for seconds in phases.values())
    parts = sum(phases[name] for name in ENGINE_PARTS)
    assert parts == pytest.approx(phases["engine_load"], abs=0.004)
    assert first_token["data"]["seconds"] >= 0
    assert (
        "llama_model_loader: loaded meta data with"
        in timeline[kinds.index("engine_imported")]["data"]["line"]
    )
    assert {
        label: count
        for label, count in samples.items()
        if 'engine="llamacpp"' in label
    } == {f'{{engine="llamacpp",phase="{name}"}}': 1.0 for name in LOAD_PHASES}  # fmt: skip


def test_the_record_and_the_page_show_the_phase_under_way(
    tmp_path: Path, runtime: LocalRuntime, monkeypatch: pytest.MonkeyPatch
) -> None:
    """The stand-in waits for `gate` after `Starting to load model`: the load sits in
    `weights_load` until the test lets it finish."""
    gate = tmp_path / "weights-may-finish"
    fake_vllm_on_path(tmp_path, monkeypatch, load_gate=gate)
    write_safetensors_model(tmp_path / "m")
    settings = settings_for(tmp_path, f"sqlite:///{tmp_path / 'cohabit.db'}")
    with (
        app_serving(settings, runtime, fleet=NVIDIA) as api,
        httpx.Client(base_url=api, timeout=60, trust_env=False) as client,
    ):
        registered = client.post("/models/", json={"name": "tiny", "path": str(tmp_path / "m")})
        body = {"m_id": registered.json()["id"], "engine_name": "vllm"}
        deployment_id = client.post("/serving/deploy_model", json=body).json()

        def reading_weights() -> dict[str, Any] | None:
            record: dict[str, Any] = client.get(f"/serving/deployment/{deployment_id}").json()
            assert record["status"] in {"REQUESTED", "DEPLOYING", "INITIALIZING"}, record
            loading = record["loading"]
            return record if loading and loading["phase"] == "weights_load" else None

        record = eventually(reading_weights, timeout_s=60)
        listed = client.get("/serving/deployments").json()
        again = client.get("/serving/deployments").json()
        ui = api.removesuffix("/api") + "/ui"
        page = client.get(f"{ui}/deployments")
        details = client.get(f"{ui}/deployments/{deployment_id}")
        monkeypatch.setenv("COHABIT_BASE_URL", api)
        listed_by_ps = run_cli("ps", "--wide")
        gate.touch()
        served = wait_status(client, deployment_id, {"DEPLOYED"}, timeout_s=60)
        # `healthy` is written right after the record says DEPLOYED
        healthy = eventually(
            lambda: next(
                (e for e in events_of(client, deployment_id) if e["kind"] == "healthy"), None
            )
        )

    loading = record["loading"]
    assert record["status"] == "INITIALIZING"
    assert list(loading["phases_s"]) == ["placing", "starting", "engine_import"]
    assert all(seconds >= 0 for seconds in loading["phases_s"].values())
    assert loading["elapsed_s"] >= 0
    assert loading["began_at"] <= loading["since"] <= loading["as_of"]
    (first,), (second,) = listed, again
    assert first["loading"]["phase"] == second["loading"]["phase"] == "weights_load"
    assert second["loading"]["as_of"] > first["loading"]["as_of"]  # made afresh, not kept
    assert page.status_code == 200 and "loading: weights_load " in page.text
    assert details.status_code == 200 and "loading: weights_load " in details.text
    assert "engine_import " in details.text
    assert listed_by_ps.returncode == 0, listed_by_ps.stderr
    (row,) = [line for line in listed_by_ps.stdout.splitlines() if deployment_id[:8] in line]
    assert re.search(r"INITIALIZING .* loading: weights_load \d+\.\d s$", row), row
    assert served["loading"] is None
    assert set(ENGINE_PARTS) <= set(healthy["data"]["load_phases_s"])
