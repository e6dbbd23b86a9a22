"""The serving Pod and Service built for a placement: pinned by node affinity (never
nodeName), integer extended resources with requests == limits, the engine's self-limit flags,
and a valid manifest for kubernetes-validate --strict. Pure builders, recorded nodes."""

from __future__ import annotations

from typing import Any

import kubernetes_validate
import pytest

from cohabit.hardware.model import Topology
from cohabit.kube.crd import ModelDeploymentSpec
from cohabit.kube.fleetview import cluster_view
from cohabit.kube.resources import ServingTarget, serving_pod, serving_service
from cohabit.placement.planner import Placement, plan
from cohabit.placement.request import PlacementRequest
from cohabit.units import GIB
from tests.kube.conftest import node_object
from tests.kube.manifestlint import lint

KUBE_VERSIONS = ("1.34.0", "1.37.0")


def target(
    fixture: str,
    topology: Topology,
    spec: dict[str, Any],
    *,
    inject: bool = False,
    fractional: bool = True,
) -> ServingTarget:
    parsed = ModelDeploymentSpec.model_validate(spec)
    view = cluster_view([node_object(fixture)], [], topology=topology, fractional=fractional)
    request = PlacementRequest(
        name="team-a/chat",
        vram_bytes=parsed.vram_bytes or GIB,
        tensor_parallel=parsed.tensor_parallel_size,
        engine=parsed.engine,
    )
    placement = plan(view.state, request)
    assert isinstance(placement, Placement), placement
    return ServingTarget(
        name="chat",
        namespace="team-a",
        uid="3f1c9a52-8a7e-4c43-9d3b-6a0f2f6f7b10",
        generation=1,
        spec=parsed,
        placement=placement,
        naming=view.resources[placement.node],
        inject_visible_devices=inject,
    )


STANDALONE_T4 = ("labels_cohabit_standalone.json", Topology.STANDALONE_CLUSTER)
MANAGED_T4 = ("labels_t4.json", Topology.MANAGED_CLUSTER)
MIG_MIXED = ("labels_mig_mixed.json", Topology.MANAGED_CLUSTER)
VLLM_6G = {"model": "Qwen/Qwen2.5-7B-Instruct", "engine": "vllm", "vram": "6GiB"}


@pytest.mark.parametrize(
    ("where", "spec", "args"),
    [
        pytest.param(
            STANDALONE_T4, {**VLLM_6G, "config": {"maxModelLen": 8192}},
            ["--model", "Qwen/Qwen2.5-7B-Instruct", "--host", "0.0.0.0", "--port", "8080",
             "--gpu-memory-utilization", "0.4000", "--max-model-len", "8192"],
            id="vllm-budget-is-a-fraction-of-the-card",
        ),
        pytest.param(
            MANAGED_T4, VLLM_6G,
            ["--model", "Qwen/Qwen2.5-7B-Instruct", "--host", "0.0.0.0", "--port", "8080"],
            id="vllm-whole-card-keeps-its-default",
        ),
        pytest.param(
            STANDALONE_T4,
            {"model": "/models/qwen3-0.6b-q8_0.gguf", "engine": "llamacpp", "vram": "2GiB",
             "config": {"maxModelLen": 4096, "maxNumSeqs": 2}},
            ["--model", "/models/qwen3-0.6b-q8_0.gguf", "--host", "0.0.0.0", "--port", "8080",
             "--n-gpu-layers", "999", "--ctx-size", "4096", "--parallel", "2"],
            id="llamacpp-all-layers-on-gpu",
        ),
    ],
)  # fmt: skip
def test_engine_flags(where: tuple[str, Topology], spec: dict[str, Any], args: list[str]) -> None:
    pod = serving_pod(target(*where, spec))
    assert pod["spec"]["containers"][0]["args"] == args


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
    pod = serving_pod(target(*where, spec))
    resources = pod["spec"]["containers"][0]["resources"]
    assert resources == {"requests": requests, "limits": requests}
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
    ("inject", "env"),
    [
        pytest.param(False, None, id="device-plugin-allocate-sets-it"),
        pytest.param(
            True,
            [{"name": "NVIDIA_VISIBLE_DEVICES", "value": "0"},
             {"name": "CUDA_VISIBLE_DEVICES", "value": "0"}],
            id="status-patch-backend-operator-sets-it",
        ),
    ],
)  # fmt: skip
def test_visible_devices_env(inject: bool, env: list[dict[str, str]] | None) -> None:
    pod = serving_pod(target(*STANDALONE_T4, VLLM_6G, inject=inject))
    assert pod["spec"]["containers"][0].get("env") == env


@pytest.mark.parametrize("version", KUBE_VERSIONS)
@pytest.mark.parametrize("where", [STANDALONE_T4, MANAGED_T4, MIG_MIXED], ids=str)
def test_pod_and_service_validate_strictly(where: tuple[str, Topology], version: str) -> None:
    built = target(*where, VLLM_6G)
    for manifest in (serving_pod(built), serving_service(built)):
        kubernetes_validate.validate(manifest, version, strict=True)


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
             "resources": {"requests": {"cohabit.dev/vram-gb-gpu-0": "0.5"},
                           "limits": {"cohabit.dev/vram-gb-gpu-0": "0.5"}}}]}},
            "Pod/p container c: cohabit.dev/vram-gb-gpu-0='0.5' is not a whole number",
            id="fractional-extended-resource",
        ),
        pytest.param(
            {"kind": "Deployment", "metadata": {"name": "d"}, "spec": {"template": {"spec": {
             "containers": [{"name": "c", "resources": {"requests": {"cpu": "1"},
                                                          "limits": {"cpu": "2"}}}]}}}},
            "Deployment/d container c: requests {'cpu': '1'} != limits {'cpu': '2'}",
            id="requests-differ-from-limits",
        ),
    ],
)  # fmt: skip
def test_lint_catches_what_the_schema_does_not(manifest: dict[str, Any], problem: str) -> None:
    assert lint(manifest) == [problem]
