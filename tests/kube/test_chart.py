"""The Helm chart rendered offline with helm-python-sdk (Helm v4's Go engine as a bundled
library: no helm binary, no cluster), then: our lint (integer device budgets, requests ==
limits for them, cpu and memory requested, no nodeName), least-privilege RBAC per mode, what
each value reaches, and the CRD's fields against the pydantic models. Whether a real API
server accepts what the chart renders, and refuses bad ModelDeployments, is tested against
one: tests/cluster/test_install.py and test_crd.py."""

from __future__ import annotations

import json
from functools import cache
from pathlib import Path
from typing import Any

import helm_python as helm
import pytest
import yaml

from cohabit.kube import crd, dra
from cohabit.kube.agent import parser
from cohabit.service.telemetry.logformat import LogFormat
from tests.kube.manifestlint import lint, pod_specs

ROOT = Path(__file__).resolve().parents[2]
CHART = ROOT / "deploy" / "helm" / "cohabit"
CRD_FILE = CHART / "crds" / "modeldeployments.cohabit.dev.yaml"

VALUES: dict[str, dict[str, Any]] = {
    "standalone-device-plugin": {},
    "standalone-status-patch": {"agent": {"budgetBackend": "status-patch"}},
    "standalone-whole-gpu": {"placement": {"vramPluginV2": {"enabled": False}}},
    "standalone-dra": {"placement": {"backend": "dra"}},
    "managed": {"mode": "managed"},
    "managed-with-api": {"mode": "managed", "api": {"enabled": True}},
    "api-with-metrics-token": {
        "api": {"enabled": True, "metrics": {"tokenSecret": "cohabit-metrics"}}
    },
}


@cache
def chart() -> helm.Chart:
    return helm.Chart.load(str(CHART))


def render(values: dict[str, Any]) -> list[dict[str, Any]]:
    rendered = chart().render(values, name="cohabit", namespace="cohabit-system")
    docs: list[dict[str, Any]] = []
    for path, text in sorted(rendered.items()):
        if path.endswith(".yaml"):
            docs.extend(doc for doc in yaml.safe_load_all(text) if doc)
    return docs


def of_kind(docs: list[dict[str, Any]], kind: str) -> list[dict[str, Any]]:
    return [doc for doc in docs if doc["kind"] == kind]


def crd_schema() -> dict[str, Any]:
    document = yaml.safe_load(CRD_FILE.read_text())
    schema: dict[str, Any] = document["spec"]["versions"][0]["schema"]["openAPIV3Schema"]
    return schema


@pytest.mark.parametrize("values", list(VALUES.values()), ids=list(VALUES))
def test_rendered_manifests_pass_our_lint(values: dict[str, Any]) -> None:
    problems = [problem for doc in render(values) for problem in lint(doc)]
    assert problems == []


def test_helm_lint_is_clean_and_the_crd_is_in_crds() -> None:
    report = helm.lint(str(CHART), strict=True)
    assert (report["errors"], report["messages"]) == ([], [])
    assert [entry["name"] for entry in chart().crds] == ["crds/modeldeployments.cohabit.dev.yaml"]


@pytest.mark.parametrize(
    ("values", "message"),
    [
        pytest.param({"mode": "manged"}, "at '/mode': value must be one of", id="bad-mode"),
        pytest.param(
            {"placement": {"vramPluginV2": {"enabled": "no"}}},
            "at '/placement/vramPluginV2/enabled'",
            id="bad-bool",
        ),
        pytest.param({"agnet": {}}, "additional properties 'agnet' not allowed", id="typo"),
    ],
)
def test_values_schema_refuses_typos(values: dict[str, Any], message: str) -> None:
    with pytest.raises(helm.HelmValuesError) as raised:
        render(values)
    assert message in str(raised.value)


def rules_for(docs: list[dict[str, Any]]) -> list[dict[str, Any]]:
    return [rule for doc in docs if doc["kind"] in ("ClusterRole", "Role") for rule in doc["rules"]]


def writes_nodes(rule: dict[str, Any]) -> bool:
    node_resources = {"nodes", "nodes/status"}
    reads = {"get", "list", "watch"}
    return bool(node_resources & set(rule["resources"])) and not set(rule["verbs"]) <= reads


def test_managed_mode_reads_nodes_only_and_runs_nothing_privileged() -> None:
    docs = render({"mode": "managed"})
    assert of_kind(docs, "DaemonSet") == []
    assert [rule for rule in rules_for(docs) if writes_nodes(rule)] == []
    cluster_rules = [rule for doc in of_kind(docs, "ClusterRole") for rule in doc["rules"]]
    assert {verb for rule in cluster_rules for verb in rule["verbs"]} == {"get", "list", "watch"}
    assert {doc["kind"] for doc in docs} >= {"Role", "RoleBinding"}
    for doc in docs:
        for spec in pod_specs(doc):
            for container in spec["containers"]:
                assert not container.get("securityContext", {}).get("privileged")


@pytest.mark.parametrize(
    ("values", "privileged", "status_patch"),
    [
        pytest.param({}, True, False, id="device-plugin-is-privileged"),
        pytest.param(
            {"agent": {"budgetBackend": "status-patch"}}, False, True, id="status-patch-is-not"
        ),
        pytest.param(
            {"placement": {"vramPluginV2": {"enabled": False}}},
            True,
            False,
            id="whole-gpus-still-need-the-device-plugin",
        ),
    ],
)
def test_standalone_agent_privilege_and_rbac(
    values: dict[str, Any], privileged: bool, status_patch: bool
) -> None:
    docs = render(values)
    (daemonset,) = of_kind(docs, "DaemonSet")
    container = daemonset["spec"]["template"]["spec"]["containers"][0]
    assert bool(container["securityContext"].get("privileged")) is privileged
    mounts = [m["mountPath"] for m in container.get("volumeMounts", [])]
    assert (mounts == ["/var/lib/kubelet/device-plugins"]) is privileged
    patches_status = any(
        "nodes/status" in rule["resources"] and "patch" in rule["verbs"] for rule in rules_for(docs)
    )
    assert patches_status is status_patch


@pytest.mark.parametrize("enabled", [True, False])
def test_whole_gpu_mode_makes_the_agent_advertise_whole_devices(enabled: bool) -> None:
    (daemonset,) = of_kind(
        render({"placement": {"vramPluginV2": {"enabled": enabled}}}), "DaemonSet"
    )
    args = daemonset["spec"]["template"]["spec"]["containers"][0]["args"]
    assert args[:4] == ["--backend", "device-plugin", "--allocate", "cdi"]
    assert ("--whole-gpus" in args) is not enabled


@pytest.mark.parametrize("interval", [5, 0])
def test_the_agents_memory_report_reads_host_pids_and_lists_pods_only_when_on(
    interval: int,
) -> None:
    docs = render({"agent": {"meter": {"intervalSeconds": interval}}})
    (daemonset,) = of_kind(docs, "DaemonSet")
    spec = daemonset["spec"]["template"]["spec"]
    args = spec["containers"][0]["args"]
    flags = {args[i]: args[i + 1] for i, arg in enumerate(args) if arg.startswith("--meter-")}
    assert flags == {
        "--meter-interval": str(interval),
        "--meter-heartbeat": "30",
        "--meter-change": "256MiB",
    }
    assert spec.get("hostPID", False) is bool(interval)
    lists_pods = [
        rule
        for doc in of_kind(docs, "ClusterRole")
        if doc["metadata"]["name"].endswith("-agent")
        for rule in doc["rules"]
        if "pods" in rule["resources"]
    ]
    assert lists_pods == (
        [{"apiGroups": [""], "resources": ["pods"], "verbs": ["list"]}] if interval else []
    )


def test_the_agent_accepts_the_charts_meter_flags() -> None:
    """The chart's flags are the agent's own (argparse, no prefix matching)."""
    (daemonset,) = of_kind(render({}), "DaemonSet")
    args = parser().parse_args(daemonset["spec"]["template"]["spec"]["containers"][0]["args"])
    assert (args.meter_interval, args.meter_heartbeat, args.meter_change) == (5.0, 30.0, 256 << 20)


def operator_env(values: dict[str, Any]) -> dict[str, Any]:
    (operator,) = [
        d
        for d in of_kind(render(values), "Deployment")
        if d["metadata"]["name"].endswith("operator")
    ]
    return {
        e["name"]: e.get("value")
        for e in operator["spec"]["template"]["spec"]["containers"][0]["env"]
    }


def test_engine_images_and_enforcement_reach_the_operator() -> None:
    env = operator_env({"enforce": "hami-core"})
    assert json.loads(env["COHABIT_ENGINE_IMAGES"]) == {
        "vllm": {"nvidia": "vllm/vllm-openai:v0.18.0", "amd": "vllm/vllm-openai-rocm:v0.18.0"},
        "llamacpp": {
            "nvidia": "ghcr.io/ggml-org/llama.cpp:server-cuda",
            "amd": "ghcr.io/ggml-org/llama.cpp:server-rocm",
            "cpu": "ghcr.io/ggml-org/llama.cpp:server",
        },
    }
    assert (env["COHABIT_ENFORCE"], env["COHABIT_HAMI_LIBRARY"]) == (
        "hami-core",
        "/usr/local/vgpu/libvgpu.so",
    )
    assert operator_env({})["COHABIT_ENFORCE"] == "none"
    with pytest.raises(helm.HelmValuesError):
        render({"enforce": "cgroups"})


def test_the_dra_backend_runs_the_agents_dra_backend_and_tells_the_operator() -> None:
    """placement.backend dra: the agent publishes ResourceSlices (its own `--backend dra`,
    the flags its parser takes) and serves the kubelet plugin from the kubelet's plugin
    directories; the operator and the API are told; the agent may write slices and read
    claims, the operator make claim templates; the DeviceClass is the one `dra.py` names
    (left out when another install made it)."""
    docs = render({"placement": {"backend": "dra"}, "api": {"enabled": True}})
    (daemonset,) = of_kind(docs, "DaemonSet")
    container = daemonset["spec"]["template"]["spec"]["containers"][0]
    assert parser().parse_args(container["args"]).backend == "dra"
    assert container["securityContext"]["privileged"] is True
    assert [m["mountPath"] for m in container["volumeMounts"]] == [
        "/var/lib/kubelet/plugins",
        "/var/lib/kubelet/plugins_registry",
        "/var/run/cdi",
    ]
    for deployment in of_kind(docs, "Deployment"):
        env = {
            e["name"]: e.get("value")
            for e in deployment["spec"]["template"]["spec"]["containers"][0]["env"]
        }
        assert env[dra.PLACEMENT_BACKEND_ENV] == dra.DRA_BACKEND, deployment["metadata"]["name"]
    granted = {
        (resource, verb)
        for rule in rules_for(docs)
        if rule["apiGroups"] == ["resource.k8s.io"]
        for resource in rule["resources"]
        for verb in rule["verbs"]
    }
    assert granted == {
        *((r, v) for r in ["resourceslices"] for v in ["list", "create", "update", "delete"]),
        *(("resourceclaims", v) for v in ["get", "list", "watch"]),
        *(("resourceclaimtemplates", v) for v in ["get", "create", "delete"]),
    }
    (device_class,) = of_kind(docs, "DeviceClass")
    assert device_class["spec"] == dra.device_class()["spec"]
    assert device_class["metadata"]["name"] == dra.DEVICE_CLASS
    others = render({"placement": {"backend": "dra", "createDeviceClass": False}})
    assert of_kind(others, "DeviceClass") == []
    default = render({})
    assert of_kind(default, "DeviceClass") == []
    assert operator_env({})[dra.PLACEMENT_BACKEND_ENV] == "extendedResources"


def test_fractional_switch_reaches_the_operator() -> None:
    for enabled in (True, False):
        docs = render({"placement": {"vramPluginV2": {"enabled": enabled}}})
        (operator,) = [
            d for d in of_kind(docs, "Deployment") if d["metadata"]["name"].endswith("operator")
        ]
        env = {
            e["name"]: e.get("value")
            for e in operator["spec"]["template"]["spec"]["containers"][0]["env"]
        }
        assert env["COHABIT_FRACTIONAL"] == str(enabled).lower()


@pytest.mark.parametrize(
    ("path", "model"),
    [
        pytest.param(("spec",), crd.ModelDeploymentSpec, id="spec"),
        pytest.param(("spec", "config"), crd.EngineConfig, id="spec.config"),
        pytest.param(("status",), crd.ModelDeploymentStatus, id="status"),
        pytest.param(("status", "noFit"), crd.NoFitStatus, id="status.noFit"),
    ],
)
def test_crd_schema_and_pydantic_models_name_the_same_fields(
    path: tuple[str, ...], model: type
) -> None:
    node = crd_schema()
    for key in path:
        node = node["properties"][key]
    aliases = {field.alias or name for name, field in model.model_fields.items()}
    assert set(node["properties"]) == aliases


def api_objects(values: dict[str, Any]) -> tuple[dict[str, Any], dict[str, Any]]:
    """The API's Deployment and Service."""
    docs = render({"api": {"enabled": True, **values}})
    (deployment,) = [
        d for d in of_kind(docs, "Deployment") if d["metadata"]["name"].endswith("-api")
    ]
    (service,) = of_kind(docs, "Service")
    return deployment, service


@pytest.mark.parametrize("scrape", [True, False])
def test_the_api_carries_scrape_annotations_when_asked(scrape: bool) -> None:
    deployment, service = api_objects({"metrics": {"scrape": scrape}})
    pod = deployment["spec"]["template"]
    wanted = {
        "prometheus.io/scrape": "true",
        "prometheus.io/port": str(pod["spec"]["containers"][0]["ports"][0]["containerPort"]),
        "prometheus.io/path": "/metrics",
    }
    for metadata in (pod["metadata"], service["metadata"]):
        assert metadata.get("annotations", {}) == (wanted if scrape else {})


def test_the_metrics_token_and_log_format_reach_the_api() -> None:
    deployment, _service = api_objects({"metrics": {"tokenSecret": "scraper"}})
    container = deployment["spec"]["template"]["spec"]["containers"][0]
    env = {e["name"]: e.get("valueFrom") for e in container["env"]}
    assert env["COHABIT_METRICS_TOKEN"] == {"secretKeyRef": {"name": "scraper", "key": "token"}}
    command = container["command"]
    assert LogFormat(command[command.index("--log-format") + 1]) is LogFormat.JSON
    plain, _service = api_objects({"logFormat": "text"})
    container = plain["spec"]["template"]["spec"]["containers"][0]
    assert "COHABIT_METRICS_TOKEN" not in {e["name"] for e in container["env"]}
    assert container["command"][-2:] == ["--log-format", "text"]
    with pytest.raises(helm.HelmValuesError):
        render({"api": {"logFormat": "xml"}})
