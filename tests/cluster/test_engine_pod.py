"""Every engine pod shape the builders make (resources.serving_pod), judged by a real API
server: created with dryRun=All, so the server runs its validation and every admission plugin
and stores nothing, in a namespace that enforces Pod Security `restricted` under a compute
ResourceQuota. An offline schema accepts what the server refuses: extended resources whose
requests differ from their limits, a container without cpu or memory under a quota (the
download init container had none), a volume type the profile forbids. No node, scheduler or
kubelet takes part.
"""

from __future__ import annotations

import json
from dataclasses import replace
from typing import Any

import pytest
from kubernetes import client
from kubernetes.client.exceptions import ApiException

from cohabit.kube.resources import serving_pod, serving_service
from tests.cluster.harness import enforce_pod_security, set_quota
from tests.kube.serving_targets import (
    AMD,
    CPU,
    GB10,
    MANAGED_T4,
    MIG_MIXED,
    ONE_T4,
    STANDALONE_T4,
    target,
)

VLLM = {"model": "Qwen/Qwen2.5-7B-Instruct", "engine": "vllm", "vram": "6GiB"}
GGUF = {"model": "q8.gguf", "engine": "llamacpp", "vram": "2GiB"}
HF = {"repo": "Qwen/Qwen3-0.6B-GGUF", "file": "Qwen3-0.6B-Q8_0.gguf", "tokenSecret": {"name": "hf"}}
QUOTA = {"requests.cpu": "64", "requests.memory": "512Gi", "limits.memory": "2Ti"}


@pytest.fixture
def restricted(api: client.ApiClient, namespace: str) -> str:
    """The test's namespace, enforcing `restricted` and counting cpu and memory."""
    enforce_pod_security(api, namespace, "restricted")
    set_quota(api, namespace, QUOTA)
    return namespace


def admit(api: client.ApiClient, namespace: str, body: dict[str, Any]) -> None:
    """Create with dryRun=All: validated and admitted as for real, not stored."""
    core = client.CoreV1Api(api)
    if body["kind"] == "Pod":
        core.create_namespaced_pod(namespace, body, dry_run="All")
    else:
        core.create_namespaced_service(namespace, body, dry_run="All")


@pytest.mark.parametrize(
    ("where", "spec", "options"),
    [
        pytest.param(ONE_T4, VLLM, {}, id="vllm-budget"),
        pytest.param(STANDALONE_T4, {**VLLM, "tensorParallelSize": 2}, {"inject": True},
                     id="vllm-two-budgets-status-patch-devices"),
        pytest.param(MANAGED_T4, VLLM, {}, id="whole-gpu-vendor-resource"),
        pytest.param(MIG_MIXED, {**VLLM, "vram": "9GiB"}, {}, id="mig-slice"),
        pytest.param(AMD, {**VLLM, "vram": "20GiB"}, {}, id="amd-partition"),
        pytest.param(GB10, {**GGUF, "vram": "4GiB"}, {}, id="unified-pool"),
        pytest.param(CPU, GGUF, {}, id="cpu-pool-memory-budget"),
        pytest.param(ONE_T4, {**GGUF, "storage": {"persistentVolumeClaim": {"claimName": "m"}}},
                     {}, id="pvc"),
        pytest.param(ONE_T4, {**GGUF, "model": HF["repo"], "storage": {"huggingFace": HF}},
                     {}, id="hugging-face-download-init-container"),
        pytest.param(CPU, {**GGUF, "model": HF["repo"], "storage": {"huggingFace": HF}},
                     {}, id="cpu-pool-hugging-face"),
        pytest.param(ONE_T4, VLLM, {"gated": True}, id="start-gate"),
    ],
)  # fmt: skip
def test_the_api_server_admits_every_engine_pod_under_restricted_pod_security(
    api: client.ApiClient,
    restricted: str,
    where: tuple[str, Any],
    spec: dict[str, Any],
    options: dict[str, Any],
) -> None:
    gated = options.pop("gated", False)
    built = replace(target(*where, spec, **options), namespace=restricted)
    pod = serving_pod(built, queued_at="2026-11-30T06:00:00.000001Z", gated=gated)
    admit(api, restricted, pod)
    admit(api, restricted, serving_service(built))


@pytest.mark.parametrize(
    ("profile", "refusal"),
    [
        pytest.param("baseline", 'violates PodSecurity "baseline:latest": hostPath volumes',
                     id="baseline"),
        pytest.param("restricted", 'violates PodSecurity "restricted:latest": restricted volume '
                     'types (volume "hami-core" uses restricted volume type "hostPath")',
                     id="restricted"),
    ],
)  # fmt: skip
def test_hami_core_enforcement_needs_a_namespace_that_allows_host_paths(
    api: client.ApiClient, namespace: str, profile: str, refusal: str
) -> None:
    """The chart's `enforce: hami-core` mounts HAMi-core's library from the node (a hostPath
    volume), which Pod Security's baseline profile already forbids
    (k8s.io/pod-security-admission policy/check_hostPathVolumes.go): such engines run only
    in a namespace enforcing `privileged`."""
    enforce_pod_security(api, namespace, profile)
    library = "/usr/local/vgpu/libvgpu.so"
    built = replace(target(*ONE_T4, VLLM, hard_limit_library=library), namespace=namespace)
    with pytest.raises(ApiException) as raised:
        admit(api, namespace, serving_pod(built))
    assert raised.value.status == 403
    assert refusal in json.loads(raised.value.body)["message"]
