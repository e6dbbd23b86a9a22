"""The one adapter between cohabit and a Kubernetes API server (the official client).

`KubernetesPort` serves the operator (`controller.ClusterPort`) and `NodePort` the node agent.
Objects travel as wire JSON (camelCase dicts), exactly what `kubectl get -o json` shows, so the
pure modules read the same shapes in tests and in clusters. The API server ignoring a label
selector (as the kmock emulator does) is harmless: selection happens here, client side.
"""

from __future__ import annotations

import json
from collections.abc import Callable, Mapping
from typing import Any

from kubernetes import client
from kubernetes import config as _config
from kubernetes.client.exceptions import ApiException

from cohabit.kube import crd
from cohabit.kube.errors import ClusterError

# The client's config loaders carry no annotations.
config: Any = _config
_NOT_FOUND = 404
_CONFLICT = 409
JSON_PATCH = "application/json-patch+json"


def api_client(*, host: str | None = None) -> client.ApiClient:
    """In a pod: its service account; elsewhere: the kubeconfig; `host` for a test server."""
    if host is not None:
        configuration = client.Configuration()
        configuration.host = host
        configuration.verify_ssl = False
        return client.ApiClient(configuration)
    try:
        config.load_incluster_config()
    except config.ConfigException:
        config.load_kube_config()
    return client.ApiClient()


def _body(response: Any) -> Any:
    return json.loads(response.data or b"null")


def _call(what: str, function: Any, *args: Any, missing_ok: bool = False, **kwargs: Any) -> Any:
    """Run one API call; a 404 is None when `missing_ok`, anything else a ClusterError."""
    try:
        return _body(function(*args, _preload_content=False, **kwargs))
    except ApiException as error:
        if missing_ok and error.status == _NOT_FOUND:
            return None
        raise ClusterError(f"{what}: {error.status} {error.reason}") from None


class KubernetesPort:
    """The operator's API calls (see `controller.ClusterPort`)."""

    def __init__(self, api: client.ApiClient) -> None:
        self._core = client.CoreV1Api(api)
        self._custom = client.CustomObjectsApi(api)

    def list_nodes(self) -> list[dict[str, Any]]:
        return list(_call("list nodes", self._core.list_node).get("items") or [])

    def list_pods(self, namespace: str | None) -> list[dict[str, Any]]:
        if namespace is None:
            found = _call("list pods", self._core.list_pod_for_all_namespaces)
        else:
            found = _call(f"list pods in {namespace}", self._core.list_namespaced_pod, namespace)
        return list(found.get("items") or [])

    def get_pod(self, namespace: str, name: str) -> dict[str, Any] | None:
        found = _call(
            f"get pod {namespace}/{name}",
            self._core.read_namespaced_pod,
            name,
            namespace,
            missing_ok=True,
        )
        return dict(found) if found else None

    def create(self, body: Mapping[str, Any]) -> None:
        meta = body["metadata"]
        create: Callable[..., Any] = getattr(
            self._core, f"create_namespaced_{body['kind'].lower()}"
        )
        try:
            create(meta["namespace"], body, _preload_content=False)
        except ApiException as error:
            if error.status != _CONFLICT:  # already there: an earlier try of the same decision
                raise ClusterError(
                    f"create {body['kind']} {meta['namespace']}/{meta['name']}: "
                    f"{error.status} {error.reason}"
                ) from None

    def delete_pod(self, namespace: str, name: str) -> None:
        _call(
            f"delete pod {namespace}/{name}",
            self._core.delete_namespaced_pod,
            name,
            namespace,
            missing_ok=True,
        )

    def delete_service(self, namespace: str, name: str) -> None:
        _call(
            f"delete service {namespace}/{name}",
            self._core.delete_namespaced_service,
            name,
            namespace,
            missing_ok=True,
        )

    def open_gate(self, namespace: str, name: str) -> None:
        """Remove the pod's scheduling gates (a JSON patch: a list body is sent as
        application/json-patch+json; the API server allows gates only to be removed)."""
        _call(
            f"release pod {namespace}/{name}",
            self._core.patch_namespaced_pod,
            name,
            namespace,
            [{"op": "remove", "path": "/spec/schedulingGates"}],
            missing_ok=True,
        )

    def patch_status(self, namespace: str, name: str, status: Mapping[str, Any]) -> None:
        _call(
            f"patch {crd.PLURAL} {namespace}/{name} status",
            self._custom.patch_namespaced_custom_object_status,
            crd.GROUP,
            crd.VERSION,
            namespace,
            crd.PLURAL,
            name,
            {"status": dict(status)},
        )

    # --- what `cohabit serve --backend kubernetes` (kube/runtime.py) also needs ----------

    def list_model_deployments(self, namespace: str) -> list[dict[str, Any]]:
        found = _call(
            f"list {crd.PLURAL} in {namespace}",
            self._custom.list_namespaced_custom_object,
            crd.GROUP,
            crd.VERSION,
            namespace,
            crd.PLURAL,
        )
        return list(found.get("items") or [])

    def get_model_deployment(self, namespace: str, name: str) -> dict[str, Any] | None:
        found = _call(
            f"get {crd.PLURAL} {namespace}/{name}",
            self._custom.get_namespaced_custom_object,
            crd.GROUP,
            crd.VERSION,
            namespace,
            crd.PLURAL,
            name,
            missing_ok=True,
        )
        return dict(found) if found else None

    def create_model_deployment(self, body: Mapping[str, Any]) -> None:
        """Create a ModelDeployment; one of that name already there is a ClusterError."""
        meta = body["metadata"]
        _call(
            f"create {crd.PLURAL} {meta['namespace']}/{meta['name']}",
            self._custom.create_namespaced_custom_object,
            crd.GROUP,
            crd.VERSION,
            meta["namespace"],
            crd.PLURAL,
            dict(body),
        )

    def patch_model_deployment(self, namespace: str, name: str, patch: Mapping[str, Any]) -> None:
        """Merge-patch a ModelDeployment (its spec; the status has `patch_status`)."""
        _call(
            f"patch {crd.PLURAL} {namespace}/{name}",
            self._custom.patch_namespaced_custom_object,
            crd.GROUP,
            crd.VERSION,
            namespace,
            crd.PLURAL,
            name,
            dict(patch),
        )

    def delete_model_deployment(self, namespace: str, name: str) -> None:
        _call(
            f"delete {crd.PLURAL} {namespace}/{name}",
            self._custom.delete_namespaced_custom_object,
            crd.GROUP,
            crd.VERSION,
            namespace,
            crd.PLURAL,
            name,
            missing_ok=True,
        )

    def pod_log(self, namespace: str, name: str, *, tail: int) -> list[str] | None:
        """The last `tail` lines of a pod's log; None when the pod is not there."""
        try:
            response: Any = self._core.read_namespaced_pod_log(
                name, namespace, tail_lines=tail, _preload_content=False
            )
        except ApiException as error:
            if error.status == _NOT_FOUND:
                return None
            raise ClusterError(
                f"read log of pod {namespace}/{name}: {error.status} {error.reason}"
            ) from None
        text = (response.data or b"").decode("utf-8", errors="replace")
        return text.splitlines()[-tail:] if tail > 0 else []


class NodePort:
    """The node agent's API calls: read its own Node, merge its labels and annotations,
    JSON-patch its status capacity (the documented way to advertise an extended resource),
    list the pods bound to it."""

    def __init__(self, api: client.ApiClient) -> None:
        self._core = client.CoreV1Api(api)

    def list_pods_on(self, node: str) -> list[dict[str, Any]]:
        """Pods bound to `node`, in every namespace (selected here too: see the module)."""
        found = _call(
            f"list pods on {node}",
            self._core.list_pod_for_all_namespaces,
            field_selector=f"spec.nodeName={node}",
        )
        return [
            pod
            for pod in found.get("items") or []
            if (pod.get("spec") or {}).get("nodeName") == node
        ]

    def get_node(self, name: str) -> dict[str, Any]:
        return dict(_call(f"get node {name}", self._core.read_node, name))

    def patch_labels(
        self,
        name: str,
        labels: Mapping[str, str | None],
        annotations: Mapping[str, str | None] | None = None,
    ) -> None:
        metadata: dict[str, Any] = {"labels": dict(labels)}
        if annotations:
            metadata["annotations"] = dict(annotations)
        _call(
            f"label node {name}",
            self._core.patch_node,
            name,
            {"metadata": metadata},
        )

    def patch_capacity(self, name: str, operations: list[dict[str, Any]]) -> None:
        """`operations`: JSON-patch ops on /status/capacity (a list body is sent as
        application/json-patch+json by the client)."""
        _call(f"patch node {name} status", self._core.patch_node_status, name, operations)
