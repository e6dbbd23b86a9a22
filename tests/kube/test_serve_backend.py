"""`cohabit serve --backend kubernetes`: the control plane over ModelDeployments, against
kmock's emulated Kubernetes API server on 127.0.0.1 (no cluster here; see emulator.py) with
the real official client, the real kopf operator where the status must come from it, and a
real database (SQLite and, when COHABIT_TEST_DATABASE_URL is set, PostgreSQL; with CI=true a
missing URL fails the PostgreSQL cases, as in tests/service).

`FakeScheduler` (test-side, emulator.py) stands in for kube-scheduler's extended-resource
check. Nodes are the recorded label fixtures; no GPU is touched.
"""

from __future__ import annotations

import copy
import os
import signal
import socket
import subprocess
import sys
import threading
import time
from collections.abc import Iterator
from contextlib import contextmanager
from datetime import UTC, datetime
from pathlib import Path
from typing import Any

import httpx
import jsonschema
import pytest
import uvicorn
import yaml

from cohabit.estimate.checkpoint import load_shape
from cohabit.estimate.settings import EngineSettings
from cohabit.hardware.model import Fleet, Gpu, Node, Partition, Topology, Vendor
from cohabit.kube import crd
from cohabit.kube.cluster import KubernetesPort
from cohabit.kube.controller import ModelDeploymentRef, launch_request, reconcile, sized
from cohabit.kube.fleetview import fleet_less_held
from cohabit.kube.runtime import (
    LABEL_DEPLOYMENT_ID,
    BackendSettings,
    ClusterFleetSource,
    ClusterMeasure,
    KubernetesRuntime,
    engine_status,
    md_name,
    model_deployment,
)
from cohabit.placement.planner import Placement, plan
from cohabit.placement.request import PlacementRequest
from cohabit.placement.state import FleetState, Reservation
from cohabit.runtime.engines.launch import build_launch
from cohabit.runtime.engines.spec import LaunchTarget
from cohabit.runtime.interface import EngineState, LaunchRequest, RuntimeErrorCode
from cohabit.runtime.process import free_port
from cohabit.runtime.tinymodel import write_tiny_model
from cohabit.service.app import create_app
from cohabit.store import deployments
from cohabit.store.database import Database
from cohabit.units import GIB
from tests.kube.conftest import node_object
from tests.kube.emulator import (
    MODEL_DEPLOYMENTS,
    NODES,
    PODS,
    Emulator,
    FakeScheduler,
    wait_for,
)
from tests.kube.test_chart import crd_schema, of_kind, render, rules_for
from tests.kube.test_operator import NAMESPACE, STANDALONE, cluster, running_operator
from tests.service.server import register_tiny_gguf, settings_for, wait_status
from tests.store.databases import fresh_database_url, postgres_server_url

T4_BUDGET = "labels_t4_standalone.json"  # edge-t4-1: one T4, 15 GiB budget
BACKEND = BackendSettings(namespace=NAMESPACE, topology=Topology.STANDALONE_CLUSTER)
NOW = datetime(2026, 11, 30, 6, 0, tzinfo=UTC)


@contextmanager
def control_plane(
    emulator: Emulator, tmp_path: Path, database_url: str, **settings: Any
) -> Iterator[httpx.Client]:
    """The app wired as `cohabit serve --backend kubernetes` wires it (the meter reading the
    node agents' reports), served over HTTP on a loopback port from a thread; yields a client
    on …/api. `settings`: more `Settings` fields."""
    port = KubernetesPort(emulator.api())
    source = ClusterFleetSource(port, BACKEND)
    app = create_app(
        settings_for(tmp_path, database_url, **settings),
        runtime=KubernetesRuntime(port, namespace=NAMESPACE),
        fleet=source(),
        fleet_source=source,
        fleet_refresh_s=0.05,
        budget_unit_bytes=GIB,
        measure=ClusterMeasure(port),
    )
    # IPPROTO_TCP, not 0: asyncio turns Nagle off only on sockets that say they are TCP, and
    # Nagle against delayed ACKs holds every small keep-alive answer back ~40 ms.
    sock = socket.socket(socket.AF_INET, socket.SOCK_STREAM, socket.IPPROTO_TCP)
    sock.bind(("127.0.0.1", 0))
    server = uvicorn.Server(uvicorn.Config(app, log_level="warning", lifespan="on"))
    thread = threading.Thread(target=server.run, kwargs={"sockets": [sock]}, daemon=True)
    thread.start()
    try:
        wait_for(lambda: server.started or not thread.is_alive(), what="the API to start")
        assert server.started, "the API did not start"
        url = f"http://127.0.0.1:{sock.getsockname()[1]}/api"
        with httpx.Client(base_url=url, timeout=30) as client:
            yield client
    finally:
        server.should_exit = True
        thread.join(30)
        sock.close()


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


def mark_ready(emulator: Emulator, pod: str) -> None:
    """The kubelet's part: the engine answers its readiness probe."""
    conditions = [{"type": "PodScheduled", "status": "True"}, {"type": "Ready", "status": "True"}]
    emulator.patch(PODS, pod, {"status": {"phase": "Running", "conditions": conditions}})


# --- through the REST API -----------------------------------------------------------------


def test_deploy_creates_a_pinned_model_deployment_and_the_operator_status_flows_back(
    emulator: Emulator, tmp_path: Path, database_url: str
) -> None:
    """Deploy → a ModelDeployment pinned where the control plane reserved (5.5 GiB asked,
    6 GiB held: budgets are whole GiB) → the real operator creates the pod → the scheduler
    stand-in binds it, the test marks it ready → DEPLOYED with the placement fields →
    stop deletes the ModelDeployment."""
    cluster(emulator, T4_BUDGET)
    with (
        running_operator(emulator, STANDALONE),
        control_plane(emulator, tmp_path, database_url) as api,
    ):
        model = register_tiny_gguf(api, tmp_path)
        deployment_id = deploy(api, model["id"], 5.5 * GIB)
        name = md_name(deployment_id)
        md = wait_for(lambda: model_deployments(emulator).get(name), what="the ModelDeployment")

        jsonschema.validate(md, crd_schema())
        assert md["metadata"]["labels"][LABEL_DEPLOYMENT_ID] == deployment_id
        spec = md["spec"]
        assert (spec["model"], spec["engine"], spec["vram"], spec["tensorParallelSize"]) == (
            str(tmp_path / "tiny.gguf"),
            "llamacpp",
            "6GiB",
            1,
        )
        assert spec["placement"] == {"node": "edge-t4-1", "slots": [{"gpuIndex": 0}]}
        assert spec["servedModelName"] == "tiny"
        # llama.cpp's fit to the budget, made from the GGUF here (the operator cannot read
        # it), reaches the pod's command unchanged.
        carried = spec["sizing"]["settings"]
        command = wait_for(lambda: pods(emulator).get(f"{name}-engine"), what="the pod")["spec"][
            "containers"
        ][0]["command"]
        assert command[command.index("--alias") + 1] == "tiny"
        assert command[command.index("--ctx-size") + 1] == str(carried["max_model_len"])
        assert command[command.index("--n-gpu-layers") + 1] == str(carried["n_gpu_layers"])

        engine_pod = wait_for(lambda: pods(emulator).get(f"{name}-engine"), what="the pod")
        requests = engine_pod["spec"]["containers"][0]["resources"]["requests"]
        assert requests == {"cohabit.dev/vram-gb-gpu-0": "6"}
        assert wait_status(api, deployment_id, {"INITIALIZING"})["node_name"] == "edge-t4-1"

        FakeScheduler(emulator).step()
        mark_ready(emulator, f"{name}-engine")
        record = wait_status(api, deployment_id, {"DEPLOYED", "FAILED", "ERROR"})
        assert record["status"] == "DEPLOYED", record
        placed = crd.placement_fields(model_deployments(emulator)[name]["status"])
        assert (record["node_name"], record["gpu_indices"], record["allocated_bytes"]) == (
            placed["node"],
            placed["gpu_indices"],
            placed["allocated_bytes"],
        )
        assert (record["allocated_bytes"], record["allocated_capacity_gb"]) == (6 * GIB, 6)

        assert api.delete(f"/serving/deployment/{deployment_id}").status_code == 200
        wait_for(lambda: name not in model_deployments(emulator), what="the deletion")
        assert wait_status(api, deployment_id, {"STOPPED"})["status"] == "STOPPED"


def test_no_fit_is_immediate_and_creates_no_model_deployment(
    emulator: Emulator, tmp_path: Path, database_url: str
) -> None:
    """Two 6 GiB deployments share the 15 GiB budget; a third is refused by the control
    plane itself with the structured reason, and no ModelDeployment is made for it. No
    operator runs: nothing here waits on one."""
    cluster(emulator, T4_BUDGET)
    with control_plane(emulator, tmp_path, database_url) as api:
        model = register_tiny_gguf(api, tmp_path)
        placed = [deploy(api, model["id"], 6 * GIB) for _ in range(2)]
        for deployment_id in placed:
            assert wait_status(api, deployment_id, {"INITIALIZING"})["node_name"] == "edge-t4-1"
        refused_id = deploy(api, model["id"], 6 * GIB)
        refused = wait_status(api, refused_id, {"FAILED", "INITIALIZING"})

        assert (refused["status"], refused["last_error_code"]) == ("FAILED", "NoFitError")
        assert refused["last_error_message"] == (
            "insufficient_capacity: 0/1 nodes fit: 1 insufficient GPU memory "
            "(largest free 3 GiB on edge-t4-1 gpu 0); preemption cannot help: no idle copy it "
            "may unload (priority below 0, or 0 with min_copies 0) holds budget where it could "
            "go; 2 still starting"
        )
        assert sorted(model_deployments(emulator)) == sorted(md_name(d) for d in placed)


def test_a_restart_deletes_the_model_deployment_of_an_ended_deployment(
    emulator: Emulator, tmp_path: Path, database_url: str
) -> None:
    """The control plane died between ending a deployment and deleting its ModelDeployment:
    the next one's first pass finds it by its label and deletes it; the live one's stays."""
    cluster(emulator, T4_BUDGET)
    with control_plane(emulator, tmp_path, database_url) as api:
        model = register_tiny_gguf(api, tmp_path)
        kept, ended = (deploy(api, model["id"], 6 * GIB) for _ in range(2))
        for deployment_id in (kept, ended):
            wait_status(api, deployment_id, {"INITIALIZING"})
    db = Database(database_url)
    assert deployments.end(db, ended) is not None  # the stop's transaction, and no more
    db.dispose()
    assert md_name(ended) in model_deployments(emulator)
    with control_plane(emulator, tmp_path, database_url):
        wait_for(lambda: md_name(ended) not in model_deployments(emulator), what="the sweep")
        assert md_name(kept) in model_deployments(emulator)


def test_other_tenants_pods_count_and_our_own_do_not_count_twice(
    emulator: Emulator, tmp_path: Path, database_url: str
) -> None:
    """Another namespace's pod holds 10 GiB of the card: a 6 GiB deployment does not fit,
    a 4 GiB one does; the pod the operator makes for ours is not subtracted again."""
    cluster(emulator, T4_BUDGET)
    emulator.put(PODS, {
        "metadata": {"name": "their-model", "namespace": "team-b"},
        "spec": {"nodeName": "edge-t4-1", "containers": [{"name": "c", "resources": {
            "requests": {"cohabit.dev/vram-gb-gpu-0": "10"},
            "limits": {"cohabit.dev/vram-gb-gpu-0": "10"}}}]},
        "status": {"phase": "Running"},
    })  # fmt: skip
    with (
        running_operator(emulator, STANDALONE),
        control_plane(emulator, tmp_path, database_url) as api,
    ):
        model = register_tiny_gguf(api, tmp_path)
        # What others hold is gone from the fleet the control plane sees, so admission
        # refuses at once (409) with the structured NoFit.
        too_big = api.post(
            "/serving/deploy_model", json={"m_id": model["id"], "vram_allocation": 6 * GIB}
        )
        assert too_big.status_code == 409, too_big.text
        refusal = too_big.json()["detail"]
        assert (refusal["reason"], refusal["largest_available_capacity_gb"]) == (
            "insufficient_capacity",
            5,
        )
        assert len(model_deployments(emulator)) == 0

        small = deploy(api, model["id"], 4 * GIB)
        wait_for(lambda: pods(emulator).get(f"{md_name(small)}-engine"), what="our pod")
        fleet = ClusterFleetSource(KubernetesPort(emulator.api()), BACKEND)()
        assert fleet.nodes[0].gpus[0].memory_bytes == 5 * GIB  # 15 less theirs, not ours
        time.sleep(0.2)  # several fleet refreshes by the reconciler, with our pod there
        (node,) = api.get("/cluster/hardware").json()
        (slot,) = node["slots"]
        # 15 GiB budget, 10 held by their pod; ours is held once, by our ledger.
        assert (slot["capacity_gb"], slot["reserved_bytes"], slot["free_gb"]) == (5, 4 * GIB, 1)


# --- the operator honours the pin -----------------------------------------------------------


def two_t4_node() -> dict[str, Any]:
    """The recorded T4 box with a second card and its budget (two 15 GiB budgets)."""
    node = copy.deepcopy(node_object(T4_BUDGET))
    node["metadata"]["labels"]["cohabit.dev/gpu-count"] = "2"
    for field in ("capacity", "allocatable"):
        node["status"][field]["cohabit.dev/vram-gb-gpu-1"] = "15"
    return node


@pytest.mark.parametrize(
    ("pinned_gpu", "held_on_0", "phase", "requests"),
    [
        pytest.param(1, 0, "DEPLOYING", {"cohabit.dev/vram-gb-gpu-1": "6"}, id="binpack-says-0"),
        pytest.param(0, 12, "FAILED", None, id="pinned-full-though-gpu-1-is-free"),
    ],
)
def test_the_operator_places_only_on_the_pinned_gpu(
    emulator: Emulator,
    pinned_gpu: int,
    held_on_0: int,
    phase: str,
    requests: dict[str, str] | None,
) -> None:
    """Driven through the controller (no kopf): the plan is made on the pinned GPU alone."""
    emulator.put(("v1", "namespaces"), {"metadata": {"name": NAMESPACE}})
    emulator.put(NODES, two_t4_node())
    if held_on_0:
        emulator.put(PODS, {
            "metadata": {"name": "theirs", "namespace": "team-b"},
            "spec": {"nodeName": "edge-t4-1", "containers": [{"name": "c", "resources": {
                "limits": {"cohabit.dev/vram-gb-gpu-0": str(held_on_0)}}}]},
            "status": {"phase": "Running"},
        })  # fmt: skip
    spec = {
        "model": "Qwen/Qwen2.5-1.5B-Instruct",
        "vram": "6GiB",
        "placement": {"node": "edge-t4-1", "slots": [{"gpuIndex": pinned_gpu}]},
    }
    meta = {"name": "m", "namespace": NAMESPACE}
    body = {"apiVersion": crd.API_VERSION, "kind": crd.KIND, "metadata": meta, "spec": spec}
    jsonschema.validate(body, crd_schema())
    emulator.put(MODEL_DEPLOYMENTS, body)
    ref = ModelDeploymentRef(
        name="m", namespace=NAMESPACE, uid="u-1", generation=1, spec=spec, status={}
    )
    outcome = reconcile(KubernetesPort(emulator.api()), STANDALONE, ref, now=NOW)

    assert outcome.status.phase.value == phase
    engine = pods(emulator).get("m-engine")
    if requests is None:
        assert engine is None
        assert outcome.status.last_error_message == (
            "insufficient_capacity: 0/1 nodes fit: 1 insufficient GPU memory "
            "(largest free 3 GiB on edge-t4-1 gpu 0)"
        )
    else:
        assert engine is not None
        assert engine["spec"]["containers"][0]["resources"]["requests"] == requests
        assert outcome.status.gpu_indices == (pinned_gpu,)


# --- pure pieces: the spec, the status mapping, the fleet less what others hold -------------

T4 = Gpu(index=0, vendor=Vendor.NVIDIA, product="Tesla T4", memory_bytes=15 * GIB)


def placed(fleet: Fleet, vram_gib: int, tp: int = 1) -> Placement:
    request = PlacementRequest(name="d", vram_bytes=vram_gib * GIB, tensor_parallel=tp)
    decision = plan(FleetState(fleet=fleet), request)
    assert isinstance(decision, Placement)
    return decision


def launch(placement: Placement, model_path: str, engine: str = "vllm") -> LaunchRequest:
    return LaunchRequest(
        deployment_id="0b6c1f8e-6f4e-4b4e-9d53-3c1c2d7e9a10",
        engine=engine,
        model_path=model_path,
        served_model_name="chat",
        placement=placement,
        budget_bytes=placement.allocated_bytes,
        device_total_bytes=placement.first.total_bytes,
        settings=EngineSettings(max_model_len=4096),
    )


def test_the_model_deployment_names_the_repo_of_a_hub_snapshot_and_pins_every_shard() -> None:
    fleet = Fleet(nodes=(Node(name="n", gpus=(T4, Gpu(**{**_gpu(T4), "index": 1}))),))
    request = launch(
        placed(fleet, 6, tp=2),
        "/root/.cache/huggingface/hub/models--Qwen--Qwen2.5-7B-Instruct/snapshots/a1b2c3",
    )
    body = model_deployment(request, namespace="team-a")
    jsonschema.validate(body, crd_schema())
    assert body["metadata"]["name"] == "cohabit-0b6c1f8e-6f4e-4b4e-9d53-3c1c2d7e9a10"
    spec = crd.parse_spec(body["spec"], name="team-a/x")
    assert (spec.model, spec.engine, spec.tensor_parallel_size, spec.vram) == (
        "Qwen/Qwen2.5-7B-Instruct",
        "vllm",
        2,
        "6GiB",
    )
    assert (spec.served_model_name, spec.config.extra_args) == ("chat", ())
    assert spec.sizing is not None
    assert spec.sizing.settings == EngineSettings(max_model_len=4096).to_dict()
    assert spec.placement is not None
    assert [(s.gpu_index, s.partition_index) for s in spec.placement.slots] == [
        (0, None),
        (1, None),
    ]


def test_llamacpp_pod_gets_the_fit_the_local_launcher_makes(tmp_path: Path) -> None:
    """The operator cannot read the GGUF (it is in the pod's volume); the control plane fits
    the layers and context from it and carries them, so the pod's llama-server gets what a
    local one would for the same budget."""
    gguf = write_tiny_model(tmp_path / "tiny.gguf")
    request = launch(placed(Fleet(nodes=(Node(name="n", gpus=(T4,)),)), 2), str(gguf), "llamacpp")
    body = model_deployment(request, namespace="team-a")
    jsonschema.validate(body, crd_schema())
    spec = crd.parse_spec(body["spec"], name="team-a/x")
    ref = ModelDeploymentRef(
        name="x", namespace="team-a", uid=None, generation=1, spec=body["spec"], status={}
    )
    in_pod = launch_request(ref, spec, request.placement, sized(ref.key, spec))
    where = LaunchTarget(port=8080, executable="llama-server")
    local = build_launch(request, where, shape=load_shape(gguf))
    assert build_launch(in_pod, where).argv == local.argv


def _gpu(gpu: Gpu) -> dict[str, Any]:
    return {name: getattr(gpu, name) for name in gpu.__dataclass_fields__}


@pytest.mark.parametrize(
    ("status", "state", "code", "message"),
    [
        pytest.param({}, EngineState.STARTING, None, None, id="no-status-yet"),
        pytest.param(
            {"phase": "DEPLOYED", "conditions": [{"type": "Ready", "status": "True",
             "lastTransitionTime": "2026-11-30T06:00:00Z"}]},
            EngineState.READY, None, None, id="ready",
        ),
        pytest.param(
            {"phase": "ERROR", "lastErrorCode": "OOM", "lastErrorMessage": "killed",
             "lastErrorAt": "2026-11-30T05:59:00Z"},
            EngineState.FAILED, RuntimeErrorCode.OOM, "killed", id="runtime-code-kept",
        ),
        pytest.param(
            {"phase": "FAILED", "lastErrorCode": "NoFitError",
             "lastErrorMessage": "insufficient_capacity: 0/1 nodes are available"},
            EngineState.FAILED, RuntimeErrorCode.RUNTIME_ERROR,
            "NoFitError: insufficient_capacity: 0/1 nodes are available",
            id="cluster-refused-the-pin",
        ),
        pytest.param(
            {"phase": "FAILED", "lastErrorCode": "NoFitError", "observedGeneration": 1},
            EngineState.STARTING, None, None, id="stale-status-of-an-older-spec",
        ),
        pytest.param({"phase": "STOPPED"}, EngineState.STOPPED, None, None, id="stopped-by-hand"),
    ],
)  # fmt: skip
def test_status_maps_to_engine_status(
    status: dict[str, Any],
    state: EngineState,
    code: RuntimeErrorCode | None,
    message: str | None,
) -> None:
    md = {"metadata": {"name": "x", "generation": 2}, "status": status}
    found = engine_status(md, key="team-a/x", now=NOW)
    assert (found.state, found.error_code) == (state, code)
    if message is not None:
        assert found.error_message == message
        assert found.error_at is not None


def test_status_of_a_vanished_or_slow_model_deployment() -> None:
    gone = engine_status(None, key="team-a/x", now=NOW)
    assert (gone.state, gone.error_code) == (EngineState.FAILED, RuntimeErrorCode.CONTAINER_EXITED)
    slow = engine_status(
        {
            "metadata": {"creationTimestamp": "2026-11-30T05:00:00Z"},
            "status": {"phase": "DEPLOYING"},
        },
        key="team-a/x",
        now=NOW,
        startup_timeout_s=600,
    )
    assert (slow.state, slow.error_code) == (EngineState.FAILED, RuntimeErrorCode.STARTUP_TIMEOUT)


@pytest.mark.parametrize(
    ("node", "held", "expected"),
    [
        pytest.param(Node(name="n", gpus=(T4,)), [(0, None, 4)], 11 * GIB, id="shared-gpu"),
        pytest.param(
            Node(name="n", gpus=(Gpu(**{**_gpu(T4), "partitions": (
                Partition(profile="1g.5gb", memory_bytes=5 * GIB),
                Partition(profile="1g.5gb", memory_bytes=5 * GIB))}),)),
            [(0, 1, 5)], 5 * GIB, id="mig-slice-taken",
        ),
        pytest.param(
            Node(name="n", memory_bytes=64 * GIB), [(None, None, 16)], 40 * GIB, id="cpu-pool",
        ),
    ],
)  # fmt: skip
def test_fleet_less_held_takes_off_others_but_not_ours(
    node: Node, held: list[tuple[int | None, int | None, int]], expected: int
) -> None:
    """`expected`: the total free capacity left to the control plane; ours never subtracts."""
    theirs = [
        Reservation(deployment="team-b/x", node="n", gpu_index=g, partition_index=p,
                    reserved_bytes=size * GIB)
        for g, p, size in held
    ]  # fmt: skip
    state = FleetState(fleet=Fleet(nodes=(node,)), reservations=tuple(theirs))
    mine = Reservation(
        deployment="team-a/cohabit-1",
        node="n",
        gpu_index=held[0][0],
        partition_index=held[0][1],
        reserved_bytes=GIB,
    )
    fleet = fleet_less_held(state.with_reservations([mine]), keep={"team-a/cohabit-1"})
    assert sum(FleetState(fleet=fleet).free_bytes()) == expected


# --- the chart's API Deployment --------------------------------------------------------------


@pytest.mark.parametrize("mode", ["managed", "standalone"])
def test_the_chart_runs_the_api_on_the_kubernetes_backend_with_what_it_needs(mode: str) -> None:
    """Rendered offline (test_chart.py validates every manifest strictly); here: the command,
    its PostgreSQL URL and token from Secrets, the probe on a real route, and the RBAC the
    runtime uses (ModelDeployments create/get/list/patch/delete, their status, pod logs)."""
    docs = render({"mode": mode, "api": {"enabled": True}})
    (api,) = [d for d in of_kind(docs, "Deployment") if d["metadata"]["name"].endswith("-api")]
    container = api["spec"]["template"]["spec"]["containers"][0]
    assert container["command"][:4] == ["cohabit", "serve", "--backend", "kubernetes"]
    env = {e["name"]: e for e in container["env"]}
    assert env["COHABIT_DATABASE_URL"]["valueFrom"]["secretKeyRef"]["key"] == "url"
    assert env["COHABIT_API_TOKEN"]["valueFrom"]["secretKeyRef"]["key"] == "token"
    assert container["readinessProbe"]["httpGet"]["path"] == "/api/serving/health"
    granted = {
        (resource, verb)
        for rule in rules_for(docs)
        for resource in rule["resources"]
        for verb in rule["verbs"]
    }
    needed = {("modeldeployments", v) for v in ("create", "get", "list", "patch", "delete")}
    assert needed | {("modeldeployments/status", "patch"), ("pods/log", "get")} <= granted


# --- the command line ---------------------------------------------------------------------


def kubeconfig(path: Path, server: str) -> Path:
    path.write_text(
        yaml.safe_dump({
            "apiVersion": "v1", "kind": "Config", "current-context": "test",
            "clusters": [{"name": "test", "cluster": {"server": server}}],
            "users": [{"name": "test", "user": {"token": "t"}}],
            "contexts": [{"name": "test", "context": {"cluster": "test", "user": "test"}}],
        })
    )  # fmt: skip
    return path


def serve_env(tmp_path: Path, **extra: str) -> dict[str, str]:
    env = {k: v for k, v in os.environ.items() if not k.startswith(("COHABIT_", "KUBERNETES_"))}
    return {**env, "COHABIT_DATA_DIR": str(tmp_path / "data"), **extra}


def serve_command(port: int) -> list[str]:
    return [
        sys.executable,
        "-m",
        "cohabit",
        "serve",
        "--backend",
        "kubernetes",
        "--port",
        str(port),
    ]


@pytest.mark.parametrize(
    ("database_url", "config", "code", "message"),
    [
        pytest.param(None, None, 2, "--backend kubernetes stores deployments in PostgreSQL",
                     id="no-database-url"),
        pytest.param("sqlite:////tmp/x.db", None, 2, "set COHABIT_DATABASE_URL to a postgresql",
                     id="sqlite-refused"),
        pytest.param("postgresql+psycopg://u@127.0.0.1:1/x", "missing", 1,
                     "Kubernetes: no Kubernetes cluster configured", id="no-kubeconfig"),
        pytest.param("postgresql+psycopg://u@127.0.0.1:1/x", "closed", 1,
                     "Kubernetes: cannot reach the Kubernetes API server", id="cluster-down"),
    ],
)  # fmt: skip
def test_serve_refuses_without_postgresql_or_a_cluster(
    tmp_path: Path, database_url: str | None, config: str | None, code: int, message: str
) -> None:
    extra = {"COHABIT_DATABASE_URL": database_url} if database_url else {}
    if config == "missing":
        extra["KUBECONFIG"] = str(tmp_path / "no-such-kubeconfig")
    elif config == "closed":
        server = f"http://127.0.0.1:{free_port()}"
        extra["KUBECONFIG"] = str(kubeconfig(tmp_path / "kubeconfig", server))
    result = subprocess.run(
        serve_command(free_port()),
        capture_output=True,
        text=True,
        timeout=120,
        check=False,
        env=serve_env(tmp_path, **extra),
    )
    assert result.returncode == code, result.stderr
    last = result.stderr.strip().splitlines()[-1]  # after the no-token notice, if any
    assert last.startswith("error: ") and message in last, result.stderr
    assert "Traceback" not in result.stderr


def test_cohabit_serve_backend_kubernetes_deploys_through_the_cluster(
    emulator: Emulator, tmp_path: Path
) -> None:
    """The real command, as the chart runs it, on PostgreSQL and the emulated cluster (its
    kubeconfig): a deployment becomes a pinned ModelDeployment; stopping deletes it."""
    server_url = postgres_server_url()
    urls = fresh_database_url("postgresql", tmp_path)
    database = next(urls)
    cluster(emulator, T4_BUDGET)
    port = free_port()
    env = serve_env(
        tmp_path,
        COHABIT_DATABASE_URL=database,
        COHABIT_NAMESPACE=NAMESPACE,
        KUBECONFIG=str(kubeconfig(tmp_path / "kubeconfig", emulator.url)),
    )
    assert server_url
    stderr_path = tmp_path / "stderr.txt"
    with stderr_path.open("w") as stderr:
        process = subprocess.Popen(
            serve_command(port), stdout=subprocess.DEVNULL, stderr=stderr, text=True, env=env
        )
    try:
        api = f"http://127.0.0.1:{port}/api"
        wait_for(lambda: _answers(api) or process.poll() is not None, timeout_s=60, what="serve")
        assert process.poll() is None, stderr_path.read_text()
        assert "1 node(s) from the cluster" in stderr_path.read_text()
        with httpx.Client(base_url=api, timeout=30) as client:
            model = register_tiny_gguf(client, tmp_path)
            deployment_id = deploy(client, model["id"], 2 * GIB)
            name = md_name(deployment_id)
            md = wait_for(lambda: model_deployments(emulator).get(name), what="the MD")
            assert md["spec"]["placement"] == {"node": "edge-t4-1", "slots": [{"gpuIndex": 0}]}
            assert client.delete(f"/serving/deployment/{deployment_id}").status_code == 200
            wait_for(lambda: name not in model_deployments(emulator), what="the deletion")
    finally:
        process.send_signal(signal.SIGTERM)
        try:
            process.wait(timeout=30)
        except subprocess.TimeoutExpired:
            process.kill()
            process.wait(timeout=30)
        urls.close()


def _answers(api: str) -> bool:
    try:
        return httpx.get(f"{api}/serving/health", timeout=5).status_code == 200
    except httpx.TransportError:
        return False
