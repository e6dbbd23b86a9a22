"""The ModelDeployment CRD on a real kube-apiserver: the schema is structural (the server
refuses `additionalProperties` beside `properties`, which no offline validator checks),
unknown fields are refused under strict field validation, bad values and names are refused
with a message naming the field, and every example in examples/kubernetes is accepted."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pytest
import yaml
from kubernetes import client
from kubernetes.client.exceptions import ApiException

from cohabit.kube import crd
from cohabit.kube.cluster import KubernetesPort
from cohabit.kube.errors import ClusterError
from tests.cluster.harness import CHART, ROOT, Cluster, body, unique, wait_for

CRD_FILE = CHART / "crds" / "modeldeployments.cohabit.dev.yaml"
EXAMPLES = sorted((ROOT / "examples" / "kubernetes").glob("*.yaml"))


@pytest.fixture(scope="module")
def installed(cluster: Cluster) -> None:
    """The chart's CRD, applied as the chart ships it (helm installs it the same way)."""
    cluster.run("kubectl", "apply", "--server-side", "-f", str(CRD_FILE))
    cluster.run(
        "kubectl",
        "wait",
        "--for=condition=Established",
        "--timeout=60s",
        f"crd/{crd.PLURAL}.{crd.GROUP}",
    )


def model_deployment(name: str, spec: dict[str, Any], namespace: str) -> dict[str, Any]:
    return {
        "apiVersion": crd.API_VERSION,
        "kind": crd.KIND,
        "metadata": {"name": name, "namespace": namespace},
        "spec": spec,
    }


def create(api: client.ApiClient, doc: dict[str, Any], *, validation: str = "Strict") -> Any:
    custom = client.CustomObjectsApi(api)
    return body(
        custom.create_namespaced_custom_object(
            crd.GROUP,
            crd.VERSION,
            doc["metadata"]["namespace"],
            crd.PLURAL,
            doc,
            field_validation=validation,
            _preload_content=False,
        )
    )


def refused(api: client.ApiClient, doc: dict[str, Any], *, status: int = 422) -> str:
    """The API server's message for a create it refuses (422: an invalid value; 400: a
    body it cannot decode, an unknown field under strict validation)."""
    with pytest.raises(ApiException) as raised:
        create(api, doc)
    assert raised.value.status == status, raised.value.body
    return str(raised.value.body)


def test_the_api_server_refuses_additional_properties_beside_properties(cluster: Cluster) -> None:
    """What the chart's CRD used to say: every kube-apiserver refuses it, so `helm install`
    stopped at its first step. Dry run: nothing is stored."""
    document = yaml.safe_load(CRD_FILE.read_text())
    spec = document["spec"]["versions"][0]["schema"]["openAPIV3Schema"]["properties"]["spec"]
    spec["additionalProperties"] = False
    document["metadata"]["name"] = f"{crd.PLURAL}.{crd.GROUP}"
    with pytest.raises(ApiException) as raised:
        client.ApiextensionsV1Api(cluster.api()).create_custom_resource_definition(
            document, dry_run="All"
        )
    assert raised.value.status == 422
    assert "additionalProperties and properties are mutual exclusive" in raised.value.body


@pytest.mark.usefixtures("installed")
def test_the_crd_is_structural_and_established(cluster: Cluster) -> None:
    found = client.ApiextensionsV1Api(cluster.api()).read_custom_resource_definition(
        f"{crd.PLURAL}.{crd.GROUP}"
    )
    conditions = {c.type: c.status for c in found.status.conditions}
    assert conditions["Established"] == "True"
    assert conditions.get("NonStructuralSchema") is None


@pytest.mark.usefixtures("installed")
def test_a_typo_is_refused_under_strict_field_validation(
    api: client.ApiClient, namespace: str
) -> None:
    """A structural schema prunes unknown fields; kubectl's default (and our clients') strict
    field validation turns that into a 400 naming the field, so a typo never vanishes."""
    doc = model_deployment("typo", {"model": "m", "tensorParalelSize": 2}, namespace)
    message = refused(api, doc, status=400)
    assert 'strict decoding error: unknown field \\"spec.tensorParalelSize\\"' in message
    pruned = create(api, doc, validation="Ignore")  # without strictness: silently dropped
    assert "tensorParalelSize" not in pruned["spec"]


@pytest.mark.usefixtures("installed")
def test_our_client_asks_for_strict_validation_and_says_what_the_server_said(
    api: client.ApiClient, namespace: str
) -> None:
    port = KubernetesPort(api)
    doc = model_deployment("typo", {"model": "m", "stat": "stopped"}, namespace)
    with pytest.raises(ClusterError) as raised:
        port.create_model_deployment(doc)
    assert raised.value.status == 400
    assert 'unknown field "spec.stat"' in str(raised.value)
    assert port.get_model_deployment(namespace, "typo") is None


@pytest.mark.usefixtures("installed")
@pytest.mark.parametrize(
    ("spec", "error"),
    [
        pytest.param({"engine": "vllm"}, "spec.model: Required value", id="no-model"),
        pytest.param({"model": "m", "vram": "6 gigs"}, "spec.vram: Invalid value", id="bad-size"),
        pytest.param(
            {"model": "m", "state": "sleeping"}, "spec.state: Unsupported value", id="bad-state"
        ),
        pytest.param(
            {"model": "m", "tensorParallelSize": 0},
            "spec.tensorParallelSize: Invalid value",
            id="tp-0",
        ),
        pytest.param(
            {
                "model": "m",
                "storage": {
                    "hostPath": {"path": "/a"},
                    "persistentVolumeClaim": {"claimName": "b"},
                },
            },
            "spec.storage: Invalid value",
            id="two-model-sources",
        ),
    ],
)
def test_bad_specs_are_refused_naming_the_field(
    api: client.ApiClient, namespace: str, spec: dict[str, Any], error: str
) -> None:
    assert error in refused(api, model_deployment(unique("bad"), spec, namespace))


@pytest.mark.usefixtures("installed")
@pytest.mark.parametrize(
    "name",
    [
        pytest.param("llama-3.1-8b", id="a-dot"),
        pytest.param("8b-llama", id="a-leading-digit"),
        pytest.param("m" * 64, id="64-characters"),
    ],
)
def test_names_a_service_cannot_take_are_refused_at_admission(
    api: client.ApiClient, namespace: str, name: str
) -> None:
    """The CRD alone would take these (a custom resource's name is a DNS subdomain), and the
    engine's Service then failed with 422 after its pod existed; now the API server refuses
    the ModelDeployment itself, and says how to name it."""
    message = refused(api, model_deployment(name, {"model": "m", "state": "stopped"}, namespace))
    assert "metadata.name must be a DNS-1035 label" in message
    assert "llama-3-1-8b" in message


@pytest.mark.usefixtures("installed")
def test_a_63_character_name_is_taken(api: client.ApiClient, namespace: str) -> None:
    name = "m" * 63
    stored = create(api, model_deployment(name, {"model": "m", "state": "stopped"}, namespace))
    assert stored["metadata"]["name"] == name


@pytest.mark.usefixtures("installed")
def test_defaults_and_the_status_subresource(api: client.ApiClient, namespace: str) -> None:
    """Defaults come from the server; the status is written only through /status, and the
    generation moves with the spec alone."""
    custom = client.CustomObjectsApi(api)
    stored = create(api, model_deployment("defaults", {"model": "m"}, namespace))
    assert stored["spec"]["engine"] == "vllm"
    assert stored["spec"]["state"] == "running"
    assert stored["spec"]["tensorParallelSize"] == 1
    assert stored["spec"]["servicePort"] == 8080
    assert stored["metadata"]["generation"] == 1
    status = crd.ModelDeploymentStatus(phase=crd.Phase.DEPLOYING).to_wire()
    custom.patch_namespaced_custom_object_status(
        crd.GROUP, crd.VERSION, namespace, crd.PLURAL, "defaults", {"status": status}
    )
    after = custom.get_namespaced_custom_object(
        crd.GROUP, crd.VERSION, namespace, crd.PLURAL, "defaults"
    )
    assert after["status"]["phase"] == "DEPLOYING"
    assert after["metadata"]["generation"] == 1
    custom.patch_namespaced_custom_object(
        crd.GROUP, crd.VERSION, namespace, crd.PLURAL, "defaults", {"spec": {"state": "stopped"}}
    )
    wait_for(
        lambda: (
            custom.get_namespaced_custom_object(
                crd.GROUP, crd.VERSION, namespace, crd.PLURAL, "defaults"
            )["metadata"]["generation"]
            == 2
        ),
        what="the generation to follow the spec",
    )


@pytest.mark.usefixtures("installed")
def test_a_status_written_by_the_operator_round_trips(
    api: client.ApiClient, namespace: str
) -> None:
    """Every field of the operator's status model survives the server's pruning."""
    custom = client.CustomObjectsApi(api)
    create(api, model_deployment("status", {"model": "m"}, namespace))
    status = crd.ModelDeploymentStatus(
        phase=crd.Phase.FAILED,
        node="n",
        gpu_indices=(0, 1),
        allocated_bytes=6 * 2**30,
        allocated_capacity_gb=6,
        notices=("SharingNotConfigured",),
        last_error_code=crd.NO_FIT_ERROR,
        last_error_message="insufficient_capacity: 0/1 nodes fit",
        last_error_at="2026-12-01T00:00:00Z",
        no_fit=crd.NoFitStatus(
            reason="insufficient_capacity", message="0/1 nodes fit", permanent=True
        ),
        conditions=(crd.condition(crd.READY, ok=False, reason="NoFitError"),),
        observed_generation=1,
    )
    custom.patch_namespaced_custom_object_status(
        crd.GROUP, crd.VERSION, namespace, crd.PLURAL, "status", {"status": status.to_wire()}
    )
    stored = custom.get_namespaced_custom_object(
        crd.GROUP, crd.VERSION, namespace, crd.PLURAL, "status"
    )
    assert crd.parse_status(stored["status"]) == status


@pytest.mark.usefixtures("installed")
@pytest.mark.parametrize("example", EXAMPLES, ids=lambda path: path.name)
def test_every_example_is_accepted(api: client.ApiClient, namespace: str, example: Path) -> None:
    for doc in yaml.safe_load_all(example.read_text()):
        doc["metadata"]["namespace"] = namespace
        stored = create(api, doc)
        assert crd.parse_spec(stored["spec"], name=doc["metadata"]["name"])
