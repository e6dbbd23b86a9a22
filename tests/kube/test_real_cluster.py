"""Against a real cluster, opt-in only: `pytest -m kube_cluster` with KUBECONFIG pointing at
a cluster where the chart (or at least crds/) is installed and the current user may create
ModelDeployments in $COHABIT_TEST_NAMESPACE (default "default"). Deselected otherwise."""

from __future__ import annotations

import os
import uuid

import pytest
from kubernetes import client

from cohabit.hardware.model import Topology
from cohabit.kube import crd
from cohabit.kube.cluster import KubernetesPort, api_client
from cohabit.kube.fleetview import cluster_view

pytestmark = pytest.mark.kube_cluster
NAMESPACE = os.environ.get("COHABIT_TEST_NAMESPACE", "default")


def test_every_node_is_read_into_the_fleet() -> None:
    port = KubernetesPort(api_client())
    nodes = port.list_nodes()
    view = cluster_view(nodes, port.list_pods(None), topology=Topology.MANAGED_CLUSTER)
    assert [node.name for node in view.state.fleet.nodes] == [
        node["metadata"]["name"] for node in nodes
    ]


def test_a_stopped_model_deployment_round_trips_through_the_crd() -> None:
    """The API server accepts our CRD's schema and a spec written by our models."""
    api = client.CustomObjectsApi(api_client())
    name = f"cohabit-test-{uuid.uuid4().hex[:8]}"
    spec = crd.ModelDeploymentSpec(model="Qwen/Qwen3-0.6B", vram="1GiB", state="stopped")
    body = {
        "apiVersion": crd.API_VERSION,
        "kind": crd.KIND,
        "metadata": {"name": name},
        "spec": spec.model_dump(by_alias=True, exclude_none=True, mode="json"),
    }
    api.create_namespaced_custom_object(crd.GROUP, crd.VERSION, NAMESPACE, crd.PLURAL, body)
    try:
        stored = api.get_namespaced_custom_object(
            crd.GROUP, crd.VERSION, NAMESPACE, crd.PLURAL, name
        )
        assert crd.parse_spec(stored["spec"], name=name) == spec
    finally:
        api.delete_namespaced_custom_object(crd.GROUP, crd.VERSION, NAMESPACE, crd.PLURAL, name)
