"""On Kubernetes the control plane plans with what the node agents measured, as the local
server plans with its own meter: a node whose `cohabit.dev/memory` annotation reports 3 GiB
held outside cohabit on its GPU turns a deploy that fit into a NoFit naming that memory, and
fits again once the report is gone; a stale report is not used, and the log says so. The
operator, planning a ModelDeployment made by hand, is bounded by the same report.

Against kmock's emulated Kubernetes API server on 127.0.0.1 (no cluster here; emulator.py)
with the real official client and a real database (SQLite and, when
COHABIT_TEST_DATABASE_URL is set, PostgreSQL). The node is our agent's recorded T4 node
(tests/fixtures/kube/labels_t4_standalone.json: a 15 GiB budget); its annotation is what the
agent's meter writes (test_nodemeter.py shows it writing one from recorded NVML answers).
"""

from __future__ import annotations

import json
import logging
from collections.abc import Iterator
from contextlib import contextmanager
from datetime import UTC, datetime, timedelta
from pathlib import Path
from typing import Any

import httpx
import pytest
from prometheus_client.parser import text_string_to_metric_families

from cohabit.hardware.model import Topology
from cohabit.hardware.usage import DeviceUsage
from cohabit.kube.cluster import KubernetesPort
from cohabit.kube.controller import ModelDeploymentRef, Retry, reconcile
from cohabit.kube.fleetview import node_measurements
from cohabit.kube.nodememory import ANNOTATION_MEMORY, NodeMemory
from cohabit.kube.runtime import BackendSettings, ClusterMeasure, kubernetes_backend, md_name
from cohabit.service.app import create_app
from cohabit.units import GIB, MIB
from tests.kube.emulator import MODEL_DEPLOYMENTS, NODES, PODS, Emulator, wait_for
from tests.kube.test_operator import NAMESPACE, STANDALONE, cluster, status
from tests.kube.test_operator import deploy as operator_deploy
from tests.service.server import register_tiny_gguf, serving_app, settings_for, wait_status

T4_BUDGET = "labels_t4_standalone.json"  # edge-t4-1: one T4, 15 GiB budget
BACKEND = BackendSettings(namespace=NAMESPACE, topology=Topology.STANDALONE_CLUSTER)


@contextmanager
def control_plane(
    emulator: Emulator, tmp_path: Path, database_url: str, **settings: Any
) -> Iterator[httpx.Client]:
    """The app wired as `cohabit serve --backend kubernetes` wires it (the meter reading the
    node agents' reports), served over HTTP on a loopback port from a thread; yields a client
    on …/api. `settings`: more `Settings` fields."""
    wired = kubernetes_backend(KubernetesPort(emulator.api()), BACKEND)
    app = create_app(
        settings_for(tmp_path, database_url, **settings),
        runtime=wired.runtime,
        fleet=wired.fleet_source(),
        fleet_source=wired.fleet_source,
        fleet_refresh_s=0.05,
        budget_unit_bytes=GIB,
        measure=wired.measure,
    )
    with serving_app(app) as url, httpx.Client(base_url=url, timeout=30) as client:
        yield client


def deploy(client: httpx.Client, model_id: str, vram_bytes: float) -> str:
    response = client.post(
        "/serving/deploy_model", json={"m_id": model_id, "vram_allocation": vram_bytes}
    )
    assert response.status_code == 202, response.text
    deployment_id: str = response.json()
    return deployment_id


def model_deployments(emulator: Emulator) -> dict[str, dict[str, Any]]:
    return {md["metadata"]["name"]: md for md in emulator.objects(MODEL_DEPLOYMENTS)}


def pods(emulator: Emulator) -> dict[str, dict[str, Any]]:
    return {pod["metadata"]["name"]: pod for pod in emulator.objects(PODS)}


NODE = "edge-t4-1"
T4_BYTES = 15360 * MIB  # what NVML reports for a 16 GB T4
FOREIGN = 3 * GIB


def report(*, foreign: int, at: datetime | None = None) -> str:
    """The annotation the agent writes for the T4 with `foreign` bytes held by others."""
    t4 = DeviceUsage(
        node=NODE,
        gpu_index=0,
        partition_index=None,
        total_bytes=T4_BYTES,
        used_bytes=foreign,
        free_bytes=T4_BYTES - foreign,
        cohabit_bytes=0,
    )
    moment = at or datetime.now(UTC)
    return NodeMemory(at=moment, interval_s=5, heartbeat_s=30, devices=(t4,)).to_annotation()


def annotate(emulator: Emulator, value: str | None) -> None:
    emulator.patch(NODES, NODE, {"metadata": {"annotations": {ANNOTATION_MEMORY: value}}})


def measured_foreign(api: httpx.Client) -> int | None:
    devices = api.get("/cluster/memory").json()["devices"]
    found = [d for d in devices if (d["node"], d["gpu_index"]) == (NODE, 0)]
    return found[0]["foreign_bytes"] if found else None


def metered_foreign(api: httpx.Client) -> float | None:
    """The T4's foreign bytes as /metrics shows them (no token set: open on loopback)."""
    text = httpx.get(str(api.base_url.copy_with(path="/metrics"))).text
    for family in text_string_to_metric_families(text):
        for sample in family.samples:
            if sample.name == "cohabit_device_foreign_bytes" and sample.labels["node"] == NODE:
                return sample.value
    return None


def placed(api: httpx.Client, emulator: Emulator, deployment_id: str) -> dict[str, Any]:
    """The deployment once reserved and handed to the cluster as a pinned ModelDeployment."""
    record = wait_status(api, deployment_id, {"INITIALIZING", "DEPLOYING", "FAILED"})
    assert record["status"] != "FAILED", record["last_error_message"]
    md = wait_for(lambda: model_deployments(emulator).get(md_name(deployment_id)), what="the pin")
    assert md["spec"]["placement"] == {"node": NODE, "slots": [{"gpuIndex": 0}]}
    return record


def test_memory_a_node_agent_reports_held_outside_cohabit_bounds_placement(
    emulator: Emulator, tmp_path: Path, database_url: str
) -> None:
    cluster(emulator, T4_BUDGET)
    with control_plane(emulator, tmp_path, database_url, meter_interval_s=0.1) as api:
        model = register_tiny_gguf(api, tmp_path)
        # 12 GiB of the 15 GiB budget: fits while nothing else holds the card.
        first = deploy(api, model["id"], 12 * GIB)
        placed(api, emulator, first)
        assert api.delete(f"/serving/deployment/{first}").status_code == 200
        wait_status(api, first, {"STOPPED"})

        annotate(emulator, report(foreign=FOREIGN))
        wait_for(lambda: measured_foreign(api) == FOREIGN, what="the meter to read the report")
        assert metered_foreign(api) == FOREIGN
        refused = wait_status(api, deploy(api, model["id"], 12 * GIB))
        assert refused["status"] == "FAILED"
        assert refused["last_error_code"] == "NoFitError"
        message = refused["last_error_message"]
        assert message.endswith(f"; 3 GiB held by processes outside cohabit on {NODE} gpu 0")
        assert refused["no_fit"]["foreign_location"] == f"{NODE} gpu 0"
        assert refused["no_fit"]["foreign_bytes"] == FOREIGN

        annotate(emulator, None)
        wait_for(lambda: measured_foreign(api) is None, what="the meter to drop the report")
        placed(api, emulator, deploy(api, model["id"], 12 * GIB))


def test_a_stale_report_is_not_used_and_the_log_says_so_once(
    emulator: Emulator, caplog: pytest.LogCaptureFixture
) -> None:
    """Older than its heartbeat plus three samples (30 + 3 × 5 s): the agent is gone."""
    cluster(emulator, T4_BUDGET)
    now = datetime.now(UTC)
    measure = ClusterMeasure(KubernetesPort(emulator.api()), clock=lambda: now)
    annotate(emulator, report(foreign=FOREIGN, at=now - timedelta(seconds=44)))
    (t4,) = measure(fleet=None)  # type: ignore[arg-type]  # the fleet is not read
    assert (t4.key, t4.used_bytes, t4.cohabit_bytes) == ((NODE, 0, None), FOREIGN, 0)

    annotate(emulator, report(foreign=FOREIGN, at=now - timedelta(seconds=46)))
    with caplog.at_level(logging.WARNING, logger="cohabit.kube.runtime"):
        assert measure(fleet=None) == []  # type: ignore[arg-type]
        assert measure(fleet=None) == []  # type: ignore[arg-type]
        annotate(emulator, report(foreign=FOREIGN, at=now))
        assert len(measure(fleet=None)) == 1  # type: ignore[arg-type]
        annotate(emulator, "{not json")
        assert measure(fleet=None) == []  # type: ignore[arg-type]
    lines = [r.getMessage() for r in caplog.records]
    assert lines == [
        f"node {NODE}: memory report not used: its memory report is 46 s old (stale after "
        "45 s): is the node agent running?",
        f"node {NODE}: memory report used again",
        f"node {NODE}: memory report not used: its {ANNOTATION_MEMORY} annotation is "
        "unreadable: not JSON (Expecting property name enclosed in double quotes: line 1 "
        "column 2 (char 1))",
    ]


def test_the_operator_plans_a_model_deployment_made_by_hand_with_the_report_too(
    emulator: Emulator,
) -> None:
    """No pin (made with kubectl): the operator plans alone, and the same report bounds it;
    the refusal may fit later (retried), since the memory may be given back."""
    cluster(emulator, T4_BUDGET)
    port = KubernetesPort(emulator.api())
    now = datetime.now(UTC)
    operator_deploy(emulator, "by-hand", model="Qwen/Qwen2.5-7B-Instruct", vram="12GiB")

    def attempt() -> Any:
        body = emulator.get(MODEL_DEPLOYMENTS, "by-hand") or {}
        ref = ModelDeploymentRef(
            name="by-hand", namespace=NAMESPACE, uid=body["metadata"]["uid"], generation=1,
            spec=body["spec"], status={},
        )  # fmt: skip
        return reconcile(port, STANDALONE, ref, now=now)

    annotate(emulator, report(foreign=FOREIGN, at=now))
    assert attempt().retry is Retry.LATER
    refused = status(emulator, "by-hand")
    assert refused["lastErrorCode"] == "NoFitError"
    assert refused["lastErrorMessage"].endswith(
        f"; 3 GiB held by processes outside cohabit on {NODE} gpu 0"
    )
    assert "by-hand-engine" not in pods(emulator)

    annotate(emulator, None)
    assert attempt().retry is Retry.NONE
    assert status(emulator, "by-hand")["phase"] == "DEPLOYING"
    assert "by-hand-engine" in pods(emulator)


def test_a_reports_slices_stay_out_and_other_versions_are_refused_by_name() -> None:
    """A MIG slice's indices need not name the same slot in the cluster view (built from the
    vendor's labels); a document of another version is not guessed at."""
    now = datetime.now(UTC)

    def on(*devices: DeviceUsage, version: int = 1) -> dict[str, Any]:
        document = json.loads(
            NodeMemory(at=now, interval_s=5, heartbeat_s=30, devices=devices).to_annotation()
        )
        document["version"] = version
        return {
            "metadata": {"name": "node-a", "annotations": {ANNOTATION_MEMORY: json.dumps(document)}}
        }

    def gpu(index: int, partition: int | None) -> DeviceUsage:
        return DeviceUsage(
            node="elsewhere", gpu_index=index, partition_index=partition, total_bytes=40 * GIB,
            used_bytes=GIB, free_bytes=39 * GIB, cohabit_bytes=0,
        )  # fmt: skip

    devices, problems = node_measurements([on(gpu(0, 0), gpu(0, 1), gpu(1, None))], now=now)
    assert [d.key for d in devices] == [("node-a", 1, None)]  # named by the Node, not the text
    assert problems == {}
    devices, problems = node_measurements([on(gpu(1, None), version=2)], now=now)
    assert devices == []
    assert problems == {
        "node-a": f"its {ANNOTATION_MEMORY} annotation is unreadable: version 2; this control "
        "plane reads 1"
    }
