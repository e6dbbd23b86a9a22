"""Our operator beside another kopf operator on a real API server. kopf's peering lets
operators that share a peering object pause for one another: one that sees a live peer of the
same priority pauses every operator, itself included ("Pausing all operators, including
self", kopf/_core/engines/peering.py, process_peering_event). Peering is auto-detected: an
operator not told otherwise takes part as soon as kopf's peering CRDs exist, and any other
team's kopf operator in the namespace (or cluster-wide) then stops ours placing, with no
error anywhere. Ours runs standalone.

The peering CRDs are kopf's own (its repository's peering.yaml), applied as a cluster
administrator installing that other operator would, and left for the run like the chart's
CRD. The other operator is a tiny kopf program run here as the administrator.
"""

from __future__ import annotations

import textwrap
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
import yaml
from kubernetes import client

from tests.cluster.conftest import ClusterRbac, Nodes, Operators, Releases
from tests.cluster.harness import (
    Cluster,
    HostProcess,
    deploy,
    free_port,
    start_process,
    values_for,
    wait_for,
)

T4 = "labels_t4_standalone.json"
PEERING = ("kopf.dev", "v1", "kopfpeerings")


def peering_crd(kind: str, scope: str) -> dict[str, Any]:
    """One of kopf's peering CRDs: its keep-alives live in `status`, kept as written."""
    plural = f"{kind.lower()}s"
    return {
        "apiVersion": "apiextensions.k8s.io/v1",
        "kind": "CustomResourceDefinition",
        "metadata": {"name": f"{plural}.kopf.dev"},
        "spec": {
            "scope": scope,
            "group": "kopf.dev",
            "names": {"kind": kind, "plural": plural, "singular": kind.lower()},
            "versions": [
                {
                    "name": "v1",
                    "served": True,
                    "storage": True,
                    "schema": {
                        "openAPIV3Schema": {
                            "type": "object",
                            "properties": {
                                "status": {
                                    "type": "object",
                                    "x-kubernetes-preserve-unknown-fields": True,
                                }
                            },
                        }
                    },
                }
            ],
        },
    }


@pytest.fixture
def default_peering(cluster: Cluster, api: client.ApiClient, namespace: str, tmp_path: Path) -> str:
    """kopf's peering CRDs, and the namespace's `default` peering object."""
    crds = tmp_path / "peering.yaml"
    documents = [
        peering_crd("ClusterKopfPeering", "Cluster"),
        peering_crd("KopfPeering", "Namespaced"),
    ]
    crds.write_text(yaml.safe_dump_all(documents))
    cluster.run("kubectl", "apply", "--server-side", "--force-conflicts", "-f", str(crds))
    for document in documents:
        name = document["metadata"]["name"]
        cluster.run("kubectl", "wait", "--for=condition=Established", f"crd/{name}")
    group, version, plural = PEERING
    name = "default"
    client.CustomObjectsApi(api).create_namespaced_custom_object(
        group,
        version,
        namespace,
        plural,
        {"apiVersion": f"{group}/{version}", "kind": "KopfPeering", "metadata": {"name": name}},
    )
    return name


OTHER_OPERATOR = textwrap.dedent(
    """
    # Another team's operator: kopf's defaults, so peering is auto-detected, priority 0.
    import sys

    import kopf


    @kopf.on.event("v1", "configmaps")
    def noticed(**_):
        pass


    kopf.run(namespaces=[sys.argv[1]], liveness_endpoint=sys.argv[2])
    """
)


@pytest.fixture
def other_operator(
    cluster: Cluster, namespace: str, default_peering: str, tmp_path: Path
) -> Iterator[HostProcess]:
    script = tmp_path / "other_operator.py"
    script.write_text(OTHER_OPERATOR)
    liveness = f"http://127.0.0.1:{free_port()}/healthz"
    process = start_process(
        "other-operator",
        [str(script), namespace, liveness],
        env={},
        kubeconfig=cluster.kubeconfig,
        log_dir=tmp_path,
    )
    yield process
    process.stop()


def peers(api: client.ApiClient, namespace: str) -> dict[str, Any]:
    """The identities keeping themselves alive in the namespace's default peering."""
    group, version, plural = PEERING
    found = client.CustomObjectsApi(api).get_namespaced_custom_object(
        group, version, namespace, plural, "default"
    )
    return {key: value for key, value in (found.get("status") or {}).items() if value}


# What an administrator grants where operators are meant to peer (kopf's docs list these
# verbs for the peering resources): with it, a peering operator pauses beside another.
PEERING_RULES = [
    {
        "apiGroups": ["kopf.dev"],
        "resources": ["kopfpeerings", "clusterkopfpeerings"],
        "verbs": ["get", "list", "watch", "patch"],
    }
]


@pytest.mark.parametrize("peering_allowed", [False, True], ids=["chart-rbac", "peering-allowed"])
def test_another_kopf_operator_in_the_default_peering_does_not_stop_ours(
    api: client.ApiClient,
    namespace: str,
    nodes: Nodes,
    releases: Releases,
    operators: Operators,
    cluster_rbac: ClusterRbac,
    other_operator: HostProcess,
    peering_allowed: bool,
) -> None:
    """Layer: operator.main and its startup handler (kopf run standalone). With kopf's
    peering CRDs present our operator joined the namespace's default peering: allowed to,
    it and the other operator, of the same priority, paused each other and nothing was
    placed; under the chart's RBAC its peering calls were refused (403) and retried until
    kopf gave up and the operator stopped. Standalone, it never touches the peering."""
    nodes.recorded(T4, "t4")
    release = releases.install(values_for(namespace))
    if peering_allowed:
        pod_spec = release.workload("Deployment", "operator")["spec"]["template"]["spec"]
        account = (namespace, pod_spec["serviceAccountName"])
        name = f"{namespace}-peering"
        cluster_rbac.bind(name, PEERING_RULES, name, account)
    ours = operators.run(release)
    wait_for(lambda: peers(api, namespace), what="the other operator's keep-alive")

    placed = deploy(api, namespace, "chat", vram="6GiB")
    assert placed["phase"] == "DEPLOYED", placed
    assert len(peers(api, namespace)) == 1  # the other's: ours takes no part
    assert "kopfpeerings" not in ours.output()
    assert "Pausing" not in other_operator.output()
    assert ours.alive() and other_operator.alive()
