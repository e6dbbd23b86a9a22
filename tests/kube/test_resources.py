"""The serving Pod and Service built for a placement: pinned by node affinity (never
nodeName), integer extended resources with requests == limits, the engine command from the
shared launcher (the same arguments a local process gets), the devices as the container
sees them and the model volume. Pure builders; nodes are recorded label fixtures. Whether
the API server admits these pods is tested on a real one (tests/cluster/test_engine_pod.py)."""

from __future__ import annotations

from dataclasses import replace
from pathlib import Path
from typing import Any

import pytest

from cohabit.estimate.checkpoint import load_shape
from cohabit.estimate.estimate import Estimate, estimate_shape
from cohabit.estimate.settings import EngineSettings
from cohabit.hardware.model import Topology
from cohabit.kube.crd import ModelDeploymentSpec
from cohabit.kube.fleetview import cluster_view
from cohabit.kube.resources import (
    DEFAULT_ENGINE_RESOURCES,
    ServingTarget,
    serving_pod,
)
from cohabit.placement.decision import Placement
from cohabit.placement.planner import plan
from cohabit.placement.request import PlacementRequest
from cohabit.runtime.engines.launch import build_launch
from cohabit.runtime.engines.spec import LaunchTarget
from cohabit.runtime.tinymodel import write_tiny_model
from cohabit.units import GIB
from tests.estimate.conftest import shape_of
from tests.kube.conftest import node_object
from tests.kube.manifestlint import lint
from tests.kube.serving_targets import (
    AMD,
    CPU,
    GB10,
    MANAGED_T4,
    MIG_MIXED,
    ONE_T4,
    STANDALONE_T4,
    launch_of,
    target,
)

VLLM_6G = {"model": "Qwen/Qwen2.5-7B-Instruct", "engine": "vllm", "vram": "6GiB"}
VLLM_10G = {**VLLM_6G, "vram": "10GiB"}  # room for qwen3-0.6b's estimate and a KV block
# What the local process and the pod may differ in, and nothing else: where the engine
# listens, its program's path (llama-server on PATH here, /app/llama-server in the image)
# and the model path (the host's file here, the pod's mount there).
LOCAL_PORT = 41234
LOCAL_PROGRAMS = {"vllm": "vllm", "llamacpp": "/usr/local/bin/llama-server"}
POD_PROGRAMS = {"vllm": "vllm", "llamacpp": "/app/llama-server"}


@pytest.fixture(scope="module")
def tiny_gguf(tmp_path_factory: pytest.TempPathFactory) -> Path:
    return write_tiny_model(tmp_path_factory.mktemp("tiny") / "tiny.gguf")


def qwen_estimate(context: int) -> Estimate:
    return estimate_shape(shape_of("qwen3-0.6b"), settings=EngineSettings(max_model_len=context))


def as_local(argv: list[str], *, engine: str, pod_model: str, local_model: str) -> list[str]:
    """The pod's command with exactly the stated differences put back to the local ones."""
    swapped = {
        POD_PROGRAMS[engine]: LOCAL_PROGRAMS[engine],
        pod_model: local_model,
    }
    out = [swapped.get(arg, arg) for arg in argv]
    out[out.index("--host") + 1] = "127.0.0.1"
    out[out.index("--port") + 1] = str(LOCAL_PORT)
    return out


@pytest.mark.parametrize(
    ("where", "spec", "sizing"),
    [
        pytest.param(ONE_T4, {**VLLM_10G, "config": {"maxModelLen": 8192}}, "estimate",
                     id="vllm-gpu-fraction"),
        pytest.param(STANDALONE_T4, {**VLLM_10G, "tensorParallelSize": 2}, "estimate",
                     id="vllm-gpu-tp2"),
        pytest.param(ONE_T4, VLLM_6G, "budget", id="vllm-gpu-no-estimate"),
        pytest.param(MANAGED_T4, VLLM_10G, "estimate", id="vllm-gpu-whole"),
        pytest.param(MIG_MIXED, {**VLLM_6G, "vram": "12GiB"}, "estimate", id="vllm-mig"),
        pytest.param(AMD, {**VLLM_6G, "vram": "20GiB"}, "estimate", id="vllm-amd-partition"),
        pytest.param(ONE_T4, {"model": "tiny.gguf", "engine": "llamacpp", "vram": "2GiB",
                              "config": {"maxModelLen": 256}}, "shape", id="llamacpp-gpu"),
        pytest.param(GB10, {"model": "tiny.gguf", "engine": "llamacpp", "vram": "4GiB"},
                     "shape", id="llamacpp-unified"),
        pytest.param(CPU, {"model": "tiny.gguf", "engine": "llamacpp", "vram": "2GiB",
                           "config": {"maxModelLen": 256}}, "shape", id="llamacpp-cpu"),
        pytest.param(ONE_T4, {"model": "tiny.gguf", "engine": "llamacpp", "vram": "2GiB"},
                     "none", id="llamacpp-gpu-shape-unknown"),
    ],
)  # fmt: skip
def test_pod_engine_arguments_equal_the_local_ones(
    where: tuple[str, Topology], spec: dict[str, Any], sizing: str, tiny_gguf: Path
) -> None:
    """Every engine x hardware class that runs on Kubernetes: the pod's command is the
    shared launcher's for the same request, differing only in host, port, program path and
    model path. (MLX runs on Apple silicon only, never in a pod; the launcher refuses it.)"""
    engine = spec["engine"]
    pod_model = f"/models/{spec['model']}" if engine == "llamacpp" else spec["model"]
    spec = {**spec, "model": pod_model}
    context = (spec.get("config") or {}).get("maxModelLen") or 4096
    estimate = qwen_estimate(context) if sizing == "estimate" else None
    shape = load_shape(tiny_gguf) if sizing == "shape" else None
    built = target(*where, spec, estimate=estimate, shape=shape)
    local_model = str(tiny_gguf) if engine == "llamacpp" else pod_model
    local = build_launch(
        built.launch,
        # Device variables differ by design (host numbering here, the container's there;
        # see the tests below), so only the arguments are compared.
        LaunchTarget(
            port=LOCAL_PORT,
            executable=LOCAL_PROGRAMS[engine],
            model_path=local_model,
            device_env=False,
        ),
        shape=shape,
    )
    command = serving_pod(built)["spec"]["containers"][0]["command"]
    assert as_local(command, engine=engine, pod_model=pod_model, local_model=local_model) == list(
        local.argv
    )
    assert command[command.index("--host") + 1] == "0.0.0.0"
    assert command[command.index("--port") + 1] == "8080"
    limits = {"--max-model-len", "--ctx-size", "--gpu-memory-utilization", "--n-gpu-layers"}
    assert limits & set(command), "the pod carries the flags that hold the engine to its budget"


@pytest.mark.parametrize(
    ("where", "spec", "requests"),
    [
        pytest.param(STANDALONE_T4, VLLM_6G, {"cohabit.dev/vram-gb-gpu-0": "6"}, id="budget"),
        pytest.param(
            STANDALONE_T4, {**VLLM_6G, "vram": "5.5GiB"}, {"cohabit.dev/vram-gb-gpu-0": "6"},
            id="budget-rounds-up-to-whole-gib",
        ),
        pytest.param(
            STANDALONE_T4, {**VLLM_6G, "tensorParallelSize": 2},
            {"cohabit.dev/vram-gb-gpu-0": "6", "cohabit.dev/vram-gb-gpu-1": "6"},
            id="tensor-parallel-one-budget-per-gpu",
        ),
        pytest.param(MANAGED_T4, VLLM_6G, {"nvidia.com/gpu": "1"}, id="whole-gpu"),
        pytest.param(MIG_MIXED, {**VLLM_6G, "vram": "9GiB"}, {"nvidia.com/mig-1g.10gb": "1"},
                     id="mig-slice"),
    ],
)  # fmt: skip
def test_pod_asks_for_exactly_its_budget(
    where: tuple[str, Topology], spec: dict[str, Any], requests: dict[str, str]
) -> None:
    """Devices exactly (requests == limits, as the scheduler counts them), beside the
    chart's host cpu and memory."""
    pod = serving_pod(target(*where, spec))
    resources = pod["spec"]["containers"][0]["resources"]
    host = DEFAULT_ENGINE_RESOURCES
    assert resources == {
        "requests": {**host["requests"], **requests},
        "limits": {**host["limits"], **requests},
    }
    assert lint(pod) == []


def test_pod_is_pinned_by_hostname_affinity_not_node_name() -> None:
    pod = serving_pod(target(*MANAGED_T4, VLLM_6G))
    terms = pod["spec"]["affinity"]["nodeAffinity"][
        "requiredDuringSchedulingIgnoredDuringExecution"
    ]
    assert terms["nodeSelectorTerms"] == [
        {
            "matchExpressions": [
                {"key": "kubernetes.io/hostname", "operator": "In", "values": ["ip-10-0-3-17"]}
            ]
        }
    ]
    assert "nodeName" not in pod["spec"]


def test_pod_records_its_placement_and_owner() -> None:
    pod = serving_pod(target(*STANDALONE_T4, VLLM_6G))
    assert pod["metadata"]["annotations"] == {
        "cohabit.dev/deployment": "team-a/chat",
        "cohabit.dev/generation": "1",
        "cohabit.dev/node": "edge-t4-0",
        "cohabit.dev/slots": "[[0,null]]",
        "cohabit.dev/allocated-bytes": str(6 * GIB),
        "cohabit.dev/sharing-class": "fractional",
    }
    owner = pod["metadata"]["ownerReferences"][0]
    assert (owner["kind"], owner["name"], owner["controller"]) == ("ModelDeployment", "chat", True)


@pytest.mark.parametrize(
    ("manifest", "problem"),
    [
        pytest.param(
            {"kind": "Pod", "metadata": {"name": "p"}, "spec": {"nodeName": "n", "containers": []}},
            "Pod/p: spec.nodeName bypasses the scheduler",
            id="node-name",
        ),
        pytest.param(
            {"kind": "Pod", "metadata": {"name": "p"}, "spec": {"containers": [{"name": "c",
             "resources": {"requests": {"cpu": "1", "memory": "1Gi",
                                        "cohabit.dev/vram-gb-gpu-0": "0.5"},
                           "limits": {"cohabit.dev/vram-gb-gpu-0": "0.5"}}}]}},
            "Pod/p container c: cohabit.dev/vram-gb-gpu-0='0.5' is not a whole number",
            id="fractional-extended-resource",
        ),
        pytest.param(
            {"kind": "Deployment", "metadata": {"name": "d"}, "spec": {"template": {"spec": {
             "containers": [{"name": "c", "resources": {
                 "requests": {"cpu": "1", "memory": "1Gi", "cohabit.dev/vram-gb-gpu-0": "6"},
                 "limits": {"cpu": "2", "cohabit.dev/vram-gb-gpu-0": "8"}}}]}}}},
            "Deployment/d container c: cohabit.dev/vram-gb-gpu-0 requests != limits",
            id="device-requests-differ-from-limits",
        ),
    ],
)  # fmt: skip
def test_lint_catches_what_the_schema_does_not(manifest: dict[str, Any], problem: str) -> None:
    assert lint(manifest) == [problem]


def env_of(pod: dict[str, Any]) -> dict[str, str]:
    return {e["name"]: e["value"] for e in pod["spec"]["containers"][0].get("env", [])}


UUIDS = ("GPU-5f0c2b7e-9a1d-4c3e-8b6a-1d2e3f405a61", "GPU-7a1b3c5d-2e4f-4a6b-9c8d-0e1f2a3b4c52")


def on_second_gpu(*, inject: bool, uuids: bool = False) -> ServingTarget:
    """A 6 GiB vLLM pinned to GPU 1 of a two-T4 standalone node (GPU 0 held by another);
    `uuids`: our agent annotated the cards' UUIDs."""
    node = node_object("labels_cohabit_standalone.json")
    if uuids:
        node["metadata"]["annotations"] = {
            f"cohabit.dev/gpu-{i}-uuid": uuid for i, uuid in enumerate(UUIDS)
        }
    view = cluster_view([node], [], topology=Topology.STANDALONE_CLUSTER)
    busy = plan(view.state, PlacementRequest(name="other", vram_bytes=14 * GIB))
    assert isinstance(busy, Placement) and busy.gpu_indices == [0]
    parsed = ModelDeploymentSpec.model_validate(VLLM_6G)
    placement = plan(
        view.state.with_reservations(busy.reservations()),
        PlacementRequest(name="team-a/chat", vram_bytes=6 * GIB),
    )
    assert isinstance(placement, Placement) and placement.gpu_indices == [1]
    return ServingTarget(
        name="chat",
        namespace="team-a",
        uid=None,
        generation=1,
        spec=parsed,
        placement=placement,
        naming=view.resources[placement.node],
        launch=launch_of(parsed, placement, None),
        inject_visible_devices=inject,
    )


@pytest.mark.parametrize(
    ("inject", "env"),
    [
        pytest.param(
            False, {"CUDA_DEVICE_ORDER": "PCI_BUS_ID", "CUDA_VISIBLE_DEVICES": "0",
                    "HOME": "/tmp"},
            id="device-plugin-cdi-puts-gpu-1-in-as-ordinal-0",
        ),
        pytest.param(
            True,
            {"CUDA_DEVICE_ORDER": "PCI_BUS_ID", "CUDA_VISIBLE_DEVICES": "0",
             "NVIDIA_VISIBLE_DEVICES": "1", "HOME": "/tmp"},
            id="status-patch-runtime-gets-host-1-cuda-gets-ordinal-0",
        ),
    ],
)  # fmt: skip
def test_devices_are_numbered_as_the_container_sees_them(inject: bool, env: dict[str, str]) -> None:
    """The container holds only its GPU, as ordinal 0: passing the host index 1 to CUDA
    there would name a device that does not exist. The host's numbering goes only to the
    NVIDIA container runtime (NVIDIA_VISIBLE_DEVICES), which selects the card."""
    assert env_of(serving_pod(on_second_gpu(inject=inject))) == env


@pytest.mark.parametrize("inject", [False, True], ids=["device-plugin", "status-patch"])
def test_devices_are_named_by_uuid_when_the_agent_published_them(inject: bool) -> None:
    """A UUID names the same card inside the container and out, whatever the numbering."""
    env = env_of(serving_pod(on_second_gpu(inject=inject, uuids=True)))
    assert env["CUDA_VISIBLE_DEVICES"] == UUIDS[1]
    assert env.get("NVIDIA_VISIBLE_DEVICES") == (UUIDS[1] if inject else None)


def test_tensor_parallel_pod_sees_all_its_devices_numbered_from_zero() -> None:
    built = target(*STANDALONE_T4, {**VLLM_6G, "tensorParallelSize": 2}, inject=True)
    env = env_of(serving_pod(built))
    assert (env["NVIDIA_VISIBLE_DEVICES"], env["CUDA_VISIBLE_DEVICES"]) == ("0,1", "0,1")
    command = serving_pod(built)["spec"]["containers"][0]["command"]
    assert command[command.index("--tensor-parallel-size") + 1] == "2"


@pytest.mark.parametrize(
    ("where", "spec", "image"),
    [
        pytest.param(ONE_T4, VLLM_6G, "vllm/vllm-openai:v0.18.0", id="vllm-cuda"),
        pytest.param(AMD, {**VLLM_6G, "vram": "20GiB"}, "vllm/vllm-openai-rocm:v0.18.0",
                     id="vllm-rocm"),
        pytest.param(ONE_T4, {"model": "/m/x.gguf", "engine": "llamacpp", "vram": "2GiB"},
                     "ghcr.io/ggml-org/llama.cpp:server-cuda", id="llamacpp-cuda"),
        pytest.param(AMD, {"model": "/m/x.gguf", "engine": "llamacpp", "vram": "20GiB"},
                     "ghcr.io/ggml-org/llama.cpp:server-rocm", id="llamacpp-rocm"),
        pytest.param(CPU, {"model": "/m/x.gguf", "engine": "llamacpp", "vram": "2GiB"},
                     "ghcr.io/ggml-org/llama.cpp:server", id="llamacpp-cpu-only-on-cpu"),
    ],
)  # fmt: skip
def test_image_follows_the_engine_and_the_placed_vendor(
    where: tuple[str, Topology], spec: dict[str, Any], image: str
) -> None:
    assert serving_pod(target(*where, spec))["spec"]["containers"][0]["image"] == image


def test_whole_gpu_mode_on_a_standalone_cluster_asks_for_our_per_device_resource() -> None:
    """With fractional placement off our agent advertises `cohabit.dev/gpu-<i>: 1`; the
    pod asks for that device (not `nvidia.com/gpu`, which this mode does not have)."""
    node = node_object("labels_cohabit_standalone.json")
    node["status"]["allocatable"] = {"cohabit.dev/gpu-0": "1", "cohabit.dev/gpu-1": "1"}
    view = cluster_view([node], [], topology=Topology.STANDALONE_CLUSTER, fractional=False)
    placement = plan(view.state, PlacementRequest(name="team-a/chat", vram_bytes=6 * GIB))
    assert isinstance(placement, Placement)
    assert (placement.sharing_class, placement.allocated_bytes) == ("whole_gpu", 15 * GIB)
    parsed = ModelDeploymentSpec.model_validate(VLLM_6G)
    built = ServingTarget(
        name="chat",
        namespace="team-a",
        uid=None,
        generation=1,
        spec=parsed,
        placement=placement,
        naming=view.resources[placement.node],
        launch=launch_of(parsed, placement, None),
    )
    pod = serving_pod(built)
    wanted = {"cohabit.dev/gpu-0": "1"}
    host = DEFAULT_ENGINE_RESOURCES
    assert pod["spec"]["containers"][0]["resources"] == {
        "requests": {**host["requests"], **wanted},
        "limits": {**host["limits"], **wanted},
    }
    assert lint(pod) == []


@pytest.mark.parametrize(
    ("storage", "model", "volume", "engine_path", "init"),
    [
        pytest.param(
            {"persistentVolumeClaim": {"claimName": "models"}}, "qwen/q8.gguf",
            {"name": "models", "persistentVolumeClaim": {"claimName": "models", "readOnly": True}},
            "/models/qwen/q8.gguf", None, id="pvc",
        ),
        pytest.param(
            {"hostPath": {"path": "/srv/llm"}, "mountPath": "/weights"}, "q8.gguf",
            {"name": "models", "hostPath": {"path": "/srv/llm", "type": "Directory"}},
            "/weights/q8.gguf", None, id="host-path",
        ),
        pytest.param(
            {"huggingFace": {"repo": "Qwen/Qwen3-0.6B-GGUF", "file": "Qwen3-0.6B-Q8_0.gguf",
                             "revision": "main", "claimName": "hf-cache",
                             "tokenSecret": {"name": "hf"}}},
            "Qwen/Qwen3-0.6B-GGUF",
            {"name": "models", "persistentVolumeClaim": {"claimName": "hf-cache"}},
            "/models/Qwen/Qwen3-0.6B-GGUF/Qwen3-0.6B-Q8_0.gguf",
            {"name": "download", "image": "vllm/vllm-openai:v0.18.0",
             "command": ["hf", "download", "Qwen/Qwen3-0.6B-GGUF", "Qwen3-0.6B-Q8_0.gguf",
                         "--revision", "main", "--local-dir", "/models/Qwen/Qwen3-0.6B-GGUF"],
             "volumeMounts": [{"name": "models", "mountPath": "/models"}],
             "env": [{"name": "HOME", "value": "/tmp"},
                     {"name": "HF_TOKEN",
                      "valueFrom": {"secretKeyRef": {"name": "hf", "key": "token"}}}],
             "resources": {"requests": {"cpu": "1", "memory": "4Gi"},
                           "limits": {"memory": "32Gi"}},
             "securityContext": {"allowPrivilegeEscalation": False,
                                 "capabilities": {"drop": ["ALL"]}}},
            id="hugging-face-download",
        ),
    ],
)  # fmt: skip
def test_model_volume_reaches_the_engine(
    storage: dict[str, Any],
    model: str,
    volume: dict[str, Any],
    engine_path: str,
    init: dict[str, Any] | None,
) -> None:
    spec = {"model": model, "engine": "llamacpp", "vram": "2GiB", "storage": storage}
    pod = serving_pod(target(*ONE_T4, spec))
    container = pod["spec"]["containers"][0]
    assert pod["spec"]["volumes"] == [volume]
    mount_path = storage.get("mountPath", "/models")
    assert container["volumeMounts"] == [
        {"name": "models", "mountPath": mount_path, "readOnly": True}
    ]
    command = container["command"]
    assert command[command.index("--model") + 1] == engine_path
    assert pod["spec"].get("initContainers") == ([init] if init else None)
    assert lint(pod) == []


def test_model_storage_needs_exactly_one_source() -> None:
    with pytest.raises(ValueError, match="exactly one of persistentVolumeClaim, hostPath"):
        ModelDeploymentSpec.model_validate(
            {"model": "m", "storage": {"hostPath": {"path": "/a"},
                                       "persistentVolumeClaim": {"claimName": "b"}}}
        )  # fmt: skip


def test_hami_core_enforcement_sets_the_launchers_env_and_mounts_the_library() -> None:
    library = "/usr/local/vgpu/libvgpu.so"
    pod = serving_pod(target(*ONE_T4, VLLM_6G, hard_limit_library=library))
    env = env_of(pod)
    assert env["LD_PRELOAD"] == library
    assert env["CUDA_DEVICE_MEMORY_LIMIT_0"] == "6144m"
    assert env["CUDA_DEVICE_MEMORY_SHARED_CACHE"] == "/tmp/cohabit-hami-chat.cache"
    container = pod["spec"]["containers"][0]
    assert {"name": "hami-core", "mountPath": library, "readOnly": True} in container[
        "volumeMounts"
    ]
    assert {"name": "hami-core", "hostPath": {"path": library, "type": "File"}} in pod["spec"][
        "volumes"
    ]


def test_a_gated_pod_waits_for_the_start_gate() -> None:
    pod = serving_pod(target(*ONE_T4, VLLM_6G), queued_at="2026-11-30T06:00:00.000001Z", gated=True)
    assert pod["spec"]["schedulingGates"] == [{"name": "cohabit.dev/one-start-per-device"}]
    assert pod["metadata"]["annotations"]["cohabit.dev/queued-at"].endswith("01Z")


@pytest.mark.parametrize(
    ("run_as_user", "user"),
    [pytest.param(65532, {"runAsUser": 65532}, id="the-charts-user"),
     pytest.param(None, {}, id="openshift-assigns-one")],
)  # fmt: skip
def test_pod_meets_pod_security_restricted(run_as_user: int | None, user: dict[str, int]) -> None:
    """What the `restricted` profile checks (k8s.io/pod-security-admission policy/check_*.go:
    runAsNonRoot, seccomp, allowPrivilegeEscalation, capabilities), on the pod and every
    container; the real admission is tested in tests/cluster/test_admission.py."""
    spec = {"model": "Qwen/Qwen3-0.6B-GGUF", "engine": "llamacpp", "vram": "2GiB",
            "storage": {"huggingFace": {"repo": "Qwen/Qwen3-0.6B-GGUF"}}}  # fmt: skip
    built = target(*ONE_T4, spec)
    pod = serving_pod(replace(built, run_as_user=run_as_user))
    assert pod["spec"]["securityContext"] == {
        "runAsNonRoot": True,
        "seccompProfile": {"type": "RuntimeDefault"},
        **user,
    }
    for container in [*pod["spec"]["containers"], *pod["spec"]["initContainers"]]:
        assert container["securityContext"] == {
            "allowPrivilegeEscalation": False,
            "capabilities": {"drop": ["ALL"]},
        }
        assert {"name": "HOME", "value": "/tmp"} in container["env"]


def test_the_download_init_container_asks_for_the_engines_host_share_and_no_more() -> None:
    """Under a compute quota every container must ask for cpu and memory; an init
    container's requests raise the pod's only where they exceed the engine's, so on a CPU
    pool (memory is the budget) it asks for exactly the engine's."""
    spec = {"model": "Qwen/Qwen3-0.6B-GGUF", "engine": "llamacpp", "vram": "2GiB",
            "storage": {"huggingFace": {"repo": "Qwen/Qwen3-0.6B-GGUF"}}}  # fmt: skip
    pod = serving_pod(target(*CPU, spec))
    (init,) = pod["spec"]["initContainers"]
    assert init["resources"] == {
        "requests": {"cpu": "1", "memory": "2Gi"},
        "limits": {"memory": "2Gi"},
    }
    assert pod["spec"]["containers"][0]["resources"] == init["resources"]
