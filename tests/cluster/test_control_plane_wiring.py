"""The control plane's wiring over the real cluster, on SQLite and PostgreSQL: the app
`cohabit serve --backend kubernetes` builds, in this process (controlplane.control_plane) as
the chart's ServiceAccount, beside the chart's operator. What the ModelDeployment it makes
carries, what flows back from the operator, what it refuses by itself, what a restart
cleans up, how other tenants' pods count; and the operator honouring the pin.

kwok plays the kubelets: pods become Running and Ready, no engine runs."""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path

import httpx
import pytest
from kubernetes import client, config

from cohabit.estimate.settings import EngineSettings
from cohabit.hardware.model import Fleet, Gpu, Node, Vendor
from cohabit.kube import crd
from cohabit.kube.cluster import KubernetesPort
from cohabit.kube.runtime import (
    LABEL_DEPLOYMENT_ID,
    ClusterFleetSource,
    md_name,
    model_deployment,
)
from cohabit.placement.decision import Placement
from cohabit.placement.planner import plan
from cohabit.placement.request import PlacementRequest
from cohabit.placement.state import FleetState
from cohabit.runtime.interface import LaunchRequest
from cohabit.store import deployments
from cohabit.store.database import Database
from cohabit.units import GIB
from tests.cluster.conftest import Nodes, Releases
from tests.cluster.controlplane import (
    BUDGET,
    T4,
    backend_settings,
    control_plane,
    install_with_api,
    model_deployments,
    only_slot,
    pods,
    running_pod,
    tenant_pod,
)
from tests.cluster.harness import (
    Cluster,
    HostProcess,
    Release,
    run_operator,
    values_for,
    wait_for,
)
from tests.cluster.test_install import phase
from tests.conftest import recorded_node
from tests.service.server import register_tiny_gguf, wait_status

WAIT = {"timeout_s": 60.0}


@pytest.fixture
def release(cluster: Cluster, releases: Releases, database_url: str) -> Release:
    """The chart with its API enabled (its ServiceAccount and environment are what the app
    here runs with); its API Deployment's own pod is kwok's and runs nothing."""
    return install_with_api(releases, cluster, database_url)


@pytest.fixture
def operator(release: Release, log_dir: Path) -> Iterator[HostProcess]:
    process = run_operator(release, log_dir)
    yield process
    process.stop()


def deploy(http: httpx.Client, model_id: str, vram_bytes: float) -> str:
    response = http.post(
        "/serving/deploy_model", json={"m_id": model_id, "vram_allocation": vram_bytes}
    )
    assert response.status_code == 202, response.text
    deployment_id: str = response.json()
    return deployment_id


def test_deploy_makes_a_pinned_model_deployment_and_the_operator_status_flows_back(
    api: client.ApiClient,
    namespace: str,
    t4: str,
    release: Release,
    operator: HostProcess,
    database_url: str,
    tmp_path: Path,
) -> None:
    """Deploy → a ModelDeployment pinned where the control plane reserved (5.5 GiB asked,
    6 GiB held: budgets are whole GiB), accepted by the API server under strict validation
    → the operator creates the pod, the scheduler binds it, kwok runs it → DEPLOYED with the
    operator's placement fields → stop deletes the ModelDeployment, and the garbage
    collector its pod and Service."""
    with control_plane(release, tmp_path, database_url) as http:
        model = register_tiny_gguf(http, tmp_path)
        deployment_id = deploy(http, model["id"], 5.5 * GIB)
        name = md_name(deployment_id)
        md = wait_for(lambda: model_deployments(api, namespace).get(name), what="the MD")
        assert md["metadata"]["labels"][LABEL_DEPLOYMENT_ID] == deployment_id
        spec = md["spec"]
        assert (spec["model"], spec["engine"], spec["vram"], spec["tensorParallelSize"]) == (
            str(tmp_path / "tiny.gguf"),
            "llamacpp",
            "6GiB",
            1,
        )
        assert spec["placement"] == {"node": t4, "slots": [{"gpuIndex": 0}]}
        assert spec["servedModelName"] == "tiny"

        pod = running_pod(api, namespace, f"{name}-engine")
        (container,) = pod.spec.containers
        # llama.cpp's fit to the budget, made from the GGUF here (the operator cannot read
        # it), reaches the pod's command unchanged.
        carried, command = spec["sizing"]["settings"], container.command
        assert command[command.index("--alias") + 1] == "tiny"
        assert command[command.index("--ctx-size") + 1] == str(carried["max_model_len"])
        assert command[command.index("--n-gpu-layers") + 1] == str(carried["n_gpu_layers"])
        assert container.resources.requests[BUDGET.format(0)] == "6"
        assert pod.spec.node_name == t4

        record = wait_status(http, deployment_id, {"DEPLOYED", "FAILED", "ERROR"}, **WAIT)
        assert record["status"] == "DEPLOYED", record
        placed = crd.placement_fields(model_deployments(api, namespace)[name]["status"])
        assert (record["node_name"], record["gpu_indices"], record["allocated_bytes"]) == (
            placed["node"],
            placed["gpu_indices"],
            placed["allocated_bytes"],
        )
        assert (record["allocated_bytes"], record["allocated_capacity_gb"]) == (6 * GIB, 6)

        assert http.delete(f"/serving/deployment/{deployment_id}").status_code == 200
        core = client.CoreV1Api(api)
        wait_for(
            lambda: (
                name not in model_deployments(api, namespace)
                and f"{name}-engine" not in pods(api, namespace)
                and name
                not in {s.metadata.name for s in core.list_namespaced_service(namespace).items}
            ),
            what="the ModelDeployment, its pod and its Service to be gone",
        )
        assert wait_status(http, deployment_id, {"STOPPED"}, **WAIT)["status"] == "STOPPED"


def test_no_fit_is_immediate_and_creates_no_model_deployment(
    api: client.ApiClient,
    namespace: str,
    t4: str,
    release: Release,
    database_url: str,
    tmp_path: Path,
) -> None:
    """Two 6 GiB deployments share the 15 GiB budget; a third is refused by the control
    plane itself with the structured reason, and no ModelDeployment is made for it. No
    operator runs: nothing here waits on one."""
    with control_plane(release, tmp_path, database_url) as http:
        model = register_tiny_gguf(http, tmp_path)
        placed = [deploy(http, model["id"], 6 * GIB) for _ in range(2)]
        for deployment_id in placed:
            assert wait_status(http, deployment_id, {"INITIALIZING"}, **WAIT)["node_name"] == t4
        refused_id = deploy(http, model["id"], 6 * GIB)
        refused = wait_status(http, refused_id, {"FAILED", "INITIALIZING"}, **WAIT)

        assert (refused["status"], refused["last_error_code"]) == ("FAILED", "NoFitError")
        assert refused["last_error_message"] == (
            f"insufficient_capacity: 0/1 nodes fit: 1 insufficient GPU memory "
            f"(largest free 3 GiB on {t4} gpu 0); preemption cannot help: no idle copy it "
            "may unload (priority below 0, or 0 with min_copies 0) holds budget where it could "
            "go; 2 still starting"
        )
        assert sorted(model_deployments(api, namespace)) == sorted(md_name(d) for d in placed)


def test_a_restart_deletes_the_model_deployment_of_an_ended_deployment(
    api: client.ApiClient,
    namespace: str,
    t4: str,
    release: Release,
    database_url: str,
    tmp_path: Path,
) -> None:
    """The control plane died between ending a deployment and deleting its ModelDeployment:
    the next one's first pass finds it by its label and deletes it; the live one's stays."""
    with control_plane(release, tmp_path, database_url) as http:
        model = register_tiny_gguf(http, tmp_path)
        kept, ended = (deploy(http, model["id"], 6 * GIB) for _ in range(2))
        for deployment_id in (kept, ended):
            wait_status(http, deployment_id, {"INITIALIZING"}, **WAIT)
    db = Database(database_url)
    assert deployments.end(db, ended) is not None  # the stop's transaction, and no more
    db.dispose()
    assert md_name(ended) in model_deployments(api, namespace)
    with control_plane(release, tmp_path, database_url):
        wait_for(lambda: md_name(ended) not in model_deployments(api, namespace), what="the sweep")
        assert md_name(kept) in model_deployments(api, namespace)


def test_other_tenants_pods_count_and_our_own_do_not_count_twice(
    api: client.ApiClient,
    namespace: str,
    tenant_namespace: str,
    t4: str,
    release: Release,
    operator: HostProcess,
    database_url: str,
    tmp_path: Path,
) -> None:
    """Another namespace's pod holds 10 GiB of the card: a 6 GiB deployment does not fit,
    a 4 GiB one does; the pod the operator makes for ours is not subtracted again."""
    tenant_pod(api, tenant_namespace, "their-model", node=t4, gib=10)
    with control_plane(release, tmp_path, database_url) as http:
        model = register_tiny_gguf(http, tmp_path)
        # What others hold is gone from the fleet the control plane sees, so admission
        # refuses at once (409) with the structured NoFit.
        too_big = http.post(
            "/serving/deploy_model", json={"m_id": model["id"], "vram_allocation": 6 * GIB}
        )
        assert too_big.status_code == 409, too_big.text
        refusal = too_big.json()["detail"]
        assert (refusal["reason"], refusal["largest_available_capacity_gb"]) == (
            "insufficient_capacity",
            5,
        )
        assert model_deployments(api, namespace) == {}

        small = deploy(http, model["id"], 4 * GIB)
        running_pod(api, namespace, f"{md_name(small)}-engine")
        # A fleet refresh after our pod runs, made visible: the other tenant takes 1 GiB more.
        tenant_pod(api, tenant_namespace, "their-second", node=t4, gib=1)
        slot = wait_for(
            lambda: (
                (found := only_slot(http.get("/cluster/hardware").json()))["capacity_gb"] != 5
                and found
            ),
            what="a fleet refresh with the second tenant pod",
        )
        # 15 GiB budget, 11 held by their pods; ours is held once, by our ledger.
        assert (slot["capacity_gb"], slot["reserved_bytes"], slot["free_gb"]) == (4, 4 * GIB, 0)
        kubeconfig = release.kubeconfig("Deployment", "api", tmp_path)
        with config.new_client_from_config(str(kubeconfig)) as account:
            port = KubernetesPort(account, node_selector=backend_settings(release).node_selector)
            fleet = ClusterFleetSource(port, backend_settings(release))()
        assert fleet.nodes[0].gpus[0].memory_bytes == 4 * GIB


# --- the operator honours the pin -----------------------------------------------------------


@pytest.mark.parametrize(
    ("pinned_gpu", "held_on_0", "wanted", "requests"),
    [
        pytest.param(1, 0, "DEPLOYED", {BUDGET.format(1): "6"}, id="binpack-says-0"),
        pytest.param(0, 12, "FAILED", None, id="pinned-full-though-gpu-1-is-free"),
    ],
)
def test_the_operator_places_only_on_the_pinned_gpu(
    api: client.ApiClient,
    namespace: str,
    tenant_namespace: str,
    nodes: Nodes,
    releases: Releases,
    log_dir: Path,
    pinned_gpu: int,
    held_on_0: int,
    wanted: str,
    requests: dict[str, str] | None,
) -> None:
    """A ModelDeployment pinned to one GPU of a two-T4 box is placed there or nowhere: on
    the pinned GPU though the operator's own bin-packing would pick the other, and refused
    when the pinned GPU is full though the other is free."""
    recorded = recorded_node(T4)
    labels = {k: v for k, v in recorded["labels"].items() if k != "kubernetes.io/hostname"}
    two = {**recorded["capacity"], BUDGET.format(1): "15"}
    node = nodes.add(
        "t4x2",
        labels={**labels, "cohabit.dev/gpu-count": "2"},
        capacity=two,
        allocatable={**recorded["allocatable"], BUDGET.format(1): "15"},
    )
    if held_on_0:
        tenant_pod(api, tenant_namespace, "theirs", node=node, gib=held_on_0)
    release = releases.install(values_for(namespace))
    process = run_operator(release, log_dir)
    try:
        body = {
            "apiVersion": crd.API_VERSION,
            "kind": crd.KIND,
            "metadata": {"name": "m", "namespace": namespace},
            "spec": {
                "model": "Qwen/Qwen2.5-1.5B-Instruct",
                "vram": "6GiB",
                "placement": {"node": node, "slots": [{"gpuIndex": pinned_gpu}]},
            },
        }
        client.CustomObjectsApi(api).create_namespaced_custom_object(
            crd.GROUP, crd.VERSION, namespace, crd.PLURAL, body, field_validation="Strict"
        )
        status = phase(api, namespace, "m", "DEPLOYED", "FAILED", "ERROR")
        assert status["phase"] == wanted, status
        if requests is None:
            assert "m-engine" not in pods(api, namespace)
            assert status["lastErrorMessage"] == (
                "insufficient_capacity: 0/1 nodes fit: 1 insufficient GPU memory "
                f"(largest free 3 GiB on {node} gpu 0)"
            )
        else:
            pod = running_pod(api, namespace, "m-engine")
            ours = {
                k: v
                for k, v in pod.spec.containers[0].resources.requests.items()
                if k.startswith("cohabit.dev/")
            }
            assert (ours, pod.spec.node_name, status["gpuIndices"]) == (
                requests,
                node,
                [pinned_gpu],
            )
    finally:
        process.stop()


HOLD = "cohabit-test/hold"  # a finalizer: the ModelDeployment stays, being deleted


def test_a_pin_waits_for_the_pod_of_a_model_deployment_being_deleted(
    api: client.ApiClient, namespace: str, nodes: Nodes, releases: Releases, log_dir: Path
) -> None:
    """The control plane stops B by deleting its ModelDeployment and gives B's budget to C at
    once; the garbage collector deletes B's pod only a moment later. C, pinned to the slot B
    held, waits for that pod instead of being refused for the budget it still holds. A
    finalizer holds B being deleted, so the moment between lasts until the test lets go."""
    node = nodes.recorded(T4, "t4")
    process = run_operator(releases.install(values_for(namespace)), log_dir)
    custom = client.CustomObjectsApi(api)
    core = client.CoreV1Api(api)

    def create(name: str, vram: str, **more: object) -> None:
        body = {
            "apiVersion": crd.API_VERSION,
            "kind": crd.KIND,
            "metadata": {"name": name, "namespace": namespace, **more},
            "spec": {
                "model": "Qwen/Qwen2.5-1.5B-Instruct",
                "vram": vram,
                "placement": {"node": node, "slots": [{"gpuIndex": 0}]},
            },
        }
        custom.create_namespaced_custom_object(
            crd.GROUP, crd.VERSION, namespace, crd.PLURAL, body, field_validation="Strict"
        )

    try:
        create("b", "12GiB", finalizers=[HOLD])
        assert phase(api, namespace, "b", "DEPLOYED", "FAILED", "ERROR")["phase"] == "DEPLOYED"
        custom.delete_namespaced_custom_object(crd.GROUP, crd.VERSION, namespace, crd.PLURAL, "b")
        b = custom.get_namespaced_custom_object(crd.GROUP, crd.VERSION, namespace, crd.PLURAL, "b")
        assert b["metadata"].get("deletionTimestamp"), b["metadata"]
        assert core.read_namespaced_pod("b-engine", namespace).metadata.deletion_timestamp is None

        create("c", "6GiB")
        waiting = wait_for(
            lambda: (
                (status := (model_deployments(api, namespace).get("c") or {}).get("status"))
                and status.get("conditions")
                and status
            ),
            what="the operator to take up C",
        )
        assert waiting["phase"] == "DEPLOYING", waiting
        assert f"{namespace}/b-engine" in waiting["conditions"][-1]["message"], waiting
        assert "c-engine" not in pods(api, namespace)

        custom.patch_namespaced_custom_object(
            crd.GROUP, crd.VERSION, namespace, crd.PLURAL, "b", {"metadata": {"finalizers": None}}
        )
        placed = phase(api, namespace, "c", "DEPLOYED", "FAILED", "ERROR")
        assert (placed["phase"], placed["gpuIndices"]) == ("DEPLOYED", [0]), placed
        assert running_pod(api, namespace, "c-engine").spec.node_name == node
    finally:
        if model_deployments(api, namespace).get("b"):
            custom.patch_namespaced_custom_object(
                crd.GROUP,
                crd.VERSION,
                namespace,
                crd.PLURAL,
                "b",
                {"metadata": {"finalizers": None}},
            )
        process.stop()


# --- the ModelDeployment the control plane writes ---------------------------------------------

T4_GPU = Gpu(index=0, vendor=Vendor.NVIDIA, product="Tesla T4", memory_bytes=15 * GIB)


def test_a_hub_snapshot_is_named_by_its_repo_and_every_shard_is_pinned(
    api: client.ApiClient, namespace: str, releases: Releases, tmp_path: Path
) -> None:
    """A vLLM model found in the Hub cache is loaded by repo id in the pod; a two-way
    tensor-parallel placement pins both GPUs. The body is accepted as the chart's
    ServiceAccount under strict field validation and stored as written."""
    second = Gpu(**{**{f: getattr(T4_GPU, f) for f in T4_GPU.__dataclass_fields__}, "index": 1})
    fleet = Fleet(nodes=(Node(name="n", gpus=(T4_GPU, second)),))
    wanted = PlacementRequest(name="d", vram_bytes=6 * GIB, tensor_parallel=2)
    placement = plan(FleetState(fleet=fleet), wanted)
    assert isinstance(placement, Placement)
    request = LaunchRequest(
        deployment_id="0b6c1f8e-6f4e-4b4e-9d53-3c1c2d7e9a10",
        engine="vllm",
        model_path="/root/.cache/huggingface/hub/models--Qwen--Qwen2.5-7B-Instruct/snapshots/a1",
        served_model_name="chat",
        placement=placement,
        budget_bytes=placement.allocated_bytes,
        device_total_bytes=placement.first.total_bytes,
        settings=EngineSettings(max_model_len=4096),
    )
    body = model_deployment(request, namespace=namespace)
    assert body["metadata"]["name"] == "cohabit-0b6c1f8e-6f4e-4b4e-9d53-3c1c2d7e9a10"
    # The chart's one ServiceAccount, the API's and the operator's.
    kubeconfig = releases.install(values_for(namespace)).kubeconfig(
        "Deployment", "operator", tmp_path
    )
    with config.new_client_from_config(str(kubeconfig)) as account:
        KubernetesPort(account).create_model_deployment(body)
    stored = model_deployments(api, namespace)[body["metadata"]["name"]]
    spec = crd.parse_spec(stored["spec"], name="stored")
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
    assert {k: v for k, v in stored["spec"].items() if k in body["spec"]} == body["spec"]
