"""The one adapter between cohabit and a Kubernetes API server (the official client).

`KubernetesPort` serves the operator (`controller.ClusterPort`) and the control plane
(`runtime.RuntimePort`), `NodePort` the node agent. Every refusal becomes a ClusterError that
carries the API server's own message, so a 403 or 422 can be recorded where users look.
Objects travel as wire JSON (camelCase dicts), exactly what `kubectl get -o json` shows, so the
pure modules read the same shapes in tests and in clusters.
"""

from __future__ import annotations

import json
import threading
from collections.abc import Callable, Mapping
from dataclasses import dataclass, field
from typing import Any

import urllib3
from kubernetes import client
from kubernetes import config as _config
from kubernetes.client.exceptions import ApiException

from cohabit.kube import crd, dra
from cohabit.kube.errors import AlreadyExists, ClusterError

# The client's config loaders carry no annotations.
config: Any = _config
_NOT_FOUND = 404
_CONFLICT = 409
JSON_PATCH = "application/json-patch+json"
MERGE_PATCH = "application/merge-patch+json"
APPLY_PATCH = "application/apply-patch+yaml"
FIELD_MANAGER = "cohabit"
# Writes of objects whose fields a person may have typed ask the API server to refuse
# unknown fields (422) instead of pruning them silently, as kubectl does by default.
STRICT = "Strict"


def api_client(*, host: str | None = None, connections: int | None = None) -> client.ApiClient:
    """In a pod: its service account; elsewhere: the kubeconfig; `host` for a test server.
    `connections`: how many it keeps open for calls made at once (the client's default is
    five per CPU; a call beyond them opens, and then drops, a connection of its own)."""
    if host is not None:
        configuration = client.Configuration()
        configuration.host = host
        configuration.verify_ssl = False
    else:
        try:
            config.load_incluster_config()
        except config.ConfigException:
            config.load_kube_config()
        configuration = client.Configuration.get_default_copy()
    if connections is not None:
        configuration.connection_pool_maxsize = connections
    return client.ApiClient(configuration)


def _body(response: Any) -> Any:
    return json.loads(response.data or b"null")


def said(error: ApiException) -> str:
    """What the API server said about a refused call (its Status message), or ''."""
    try:
        status = json.loads(error.body or b"null")
    except (TypeError, ValueError):
        return ""
    message = status.get("message") if isinstance(status, dict) else None
    return str(message) if message else ""


def failure(what: str, error: ApiException) -> ClusterError:
    """A refused call as a ClusterError naming the call, the status and the server's words:
    `create pods ns/x-engine: 403 Forbidden: pods "x-engine" is forbidden: ...`."""
    message = f"{what}: {error.status} {error.reason}"
    if words := said(error):
        message += f": {words}"
    kind = (
        AlreadyExists if error.status == _CONFLICT and what.startswith("create") else ClusterError
    )
    return kind(message, status=error.status)


def _call(what: str, function: Any, *args: Any, missing_ok: bool = False, **kwargs: Any) -> Any:
    """Run one API call; a 404 is None when `missing_ok`, anything else a ClusterError."""
    try:
        return _body(function(*args, _preload_content=False, **kwargs))
    except ApiException as error:
        if missing_ok and error.status == _NOT_FOUND:
            return None
        raise failure(what, error) from None
    except (urllib3.exceptions.HTTPError, OSError) as error:
        raise ClusterError(f"{what}: cannot reach the Kubernetes API server: {error}") from None


def key_of(obj: Mapping[str, Any]) -> tuple[str, str]:
    """(namespace, name); a cluster-scoped object's namespace is \"\"."""
    meta = obj.get("metadata") or {}
    return (str(meta.get("namespace", "")), str(meta.get("name", "")))


def _listing(found: Mapping[str, Any]) -> tuple[list[dict[str, Any]], str]:
    """A list answer's items and its resourceVersion."""
    meta = found.get("metadata") or {}
    return list(found.get("items") or []), str(meta.get("resourceVersion") or "")


@dataclass(frozen=True, slots=True, kw_only=True)
class Listed:
    """One kind a port lists, then watches from the list's version: the client's list call,
    its arguments, and what the errors call it (`pods in team-a`)."""

    what: str
    function: Callable[..., Any]
    args: tuple[Any, ...] = ()
    selectors: Mapping[str, Any] = field(default_factory=dict)

    def listing(self) -> tuple[list[dict[str, Any]], str]:
        """The items, and the resourceVersion a watch of them goes on from."""
        found = _call(f"list {self.what}", self.function, *self.args, **self.selectors)
        return _listing(found)

    def watch(self, version: str, timeout_s: int) -> Any:
        """The raw watch response (one JSON event a line, bookmarks included) of what
        `listing` lists, from `version`, for at most `timeout_s`."""
        what = f"watch {self.what}"
        try:
            return self.function(
                *self.args,
                watch=True,
                resource_version=version,
                allow_watch_bookmarks=True,
                timeout_seconds=timeout_s,
                _preload_content=False,
                _request_timeout=(10, timeout_s + 30),
                **self.selectors,
            )
        except ApiException as error:
            raise failure(what, error) from None
        except (urllib3.exceptions.HTTPError, OSError) as error:
            raise ClusterError(f"{what}: cannot reach the Kubernetes API server: {error}") from None


class KubernetesPort:
    """The operator's and the control plane's API calls. `node_selector`: a label selector
    (`pool=gpu,team=ml`) naming the nodes cohabit may place on; empty: every node."""

    def __init__(self, api: client.ApiClient, *, node_selector: str = "") -> None:
        self._core = client.CoreV1Api(api)
        self._custom = client.CustomObjectsApi(api)
        self._resource = client.ResourceV1Api(api)
        self.node_selector = node_selector
        self._assumed: dict[tuple[str, str], dict[str, Any]] = {}
        self._assumed_lock = threading.Lock()

    def list_nodes(self, *, listed_since: float | None = None) -> list[dict[str, Any]]:
        """The nodes `node_selector` names, listed now (so after `listed_since` always)."""
        return self.nodes_and_version()[0]

    def nodes_and_version(self) -> tuple[list[dict[str, Any]], str]:
        """`list_nodes`, and the resourceVersion a watch of them goes on from."""
        return self.listed_nodes().listing()

    def listed_nodes(self) -> Listed:
        """The nodes `list_nodes` lists, to list or watch."""
        return Listed(
            what="nodes",
            function=self._core.list_node,
            selectors={"label_selector": self.node_selector},
        )

    def list_claims(self, *, listed_since: float | None = None) -> list[dict[str, Any]]:
        """Every namespace's ResourceClaims, listed now (so after `listed_since` always):
        what the DRA backend's view counts beside the pods (`fleetview.cluster_view`)."""
        return self.claims_and_version()[0]

    def claims_and_version(self) -> tuple[list[dict[str, Any]], str]:
        """`list_claims`, and the resourceVersion a watch of them goes on from."""
        return self.listed_claims().listing()

    def listed_claims(self) -> Listed:
        """The claims `list_claims` lists, to list or watch."""
        return Listed(
            what="resourceclaims", function=self._resource.list_resource_claim_for_all_namespaces
        )

    def list_pods(
        self,
        namespace: str | None,
        *,
        seen: str | None = None,
        listed_since: float | None = None,
    ) -> list[dict[str, Any]]:
        """The pods of `namespace` (None: all), listed now (so newer than `seen`, the
        version a read must include, and after `listed_since`), and those assumed."""
        assumed = self.assumed(namespace)  # first: see `assumed`
        return self.pods_and_version(namespace)[0] + assumed

    def assume(self, pod: dict[str, Any]) -> None:
        """Count `pod` in every pod list until `forget(pod)` (controller.ClusterPort)."""
        with self._assumed_lock:
            self._assumed[key_of(pod)] = pod

    def forget(self, pod: dict[str, Any]) -> None:
        with self._assumed_lock:
            if self._assumed.get(key_of(pod)) is pod:
                del self._assumed[key_of(pod)]

    def assumed(self, namespace: str | None) -> list[dict[str, Any]]:
        """The assumed pods of `namespace` (None: all). Take them before the pods listed:
        a pod forgotten after this was created before the list, so the list has it (a pod
        may then be counted twice for a moment, never missed)."""
        with self._assumed_lock:
            return [p for k, p in self._assumed.items() if namespace in (None, k[0])]

    def pods_and_version(self, namespace: str | None) -> tuple[list[dict[str, Any]], str]:
        """`list_pods`, and the resourceVersion a watch of them goes on from."""
        return self.listed_pods(namespace).listing()

    def listed_pods(self, namespace: str | None) -> Listed:
        """The pods `list_pods` lists (without those assumed), to list or watch."""
        if namespace is None:
            return Listed(what="pods", function=self._core.list_pod_for_all_namespaces)
        return Listed(
            what=f"pods in {namespace}", function=self._core.list_namespaced_pod, args=(namespace,)
        )

    def get_pod(
        self, namespace: str, name: str, *, seen: str | None = None
    ) -> dict[str, Any] | None:
        found = _call(
            f"get pod {namespace}/{name}",
            self._core.read_namespaced_pod,
            name,
            namespace,
            missing_ok=True,
        )
        return dict(found) if found else None

    def create(self, body: Mapping[str, Any]) -> None:
        """Create a Pod, Service or ResourceClaimTemplate; AlreadyExists when one of that
        name is there."""
        self._create(body)

    def _create(self, body: Mapping[str, Any]) -> Mapping[str, Any]:
        """`create`, returning the object as the API server stored it."""
        meta = body["metadata"]
        create: Callable[..., Any]
        if body["kind"] == "ResourceClaimTemplate":
            create = self._resource.create_namespaced_resource_claim_template
        else:
            create = getattr(self._core, f"create_namespaced_{body['kind'].lower()}")
        return dict(
            _call(
                f"create {body['kind'].lower()}s {meta['namespace']}/{meta['name']}",
                create,
                meta["namespace"],
                body,
            )
        )

    def apply(self, body: Mapping[str, Any]) -> None:
        """Server-side apply of a Service: created, or brought to this body (a port that
        changed with the spec), with the fields we set owned by cohabit."""
        meta = body["metadata"]
        _call(
            f"apply services {meta['namespace']}/{meta['name']}",
            self._core.patch_namespaced_service,
            meta["name"],
            meta["namespace"],
            dict(body),
            field_manager=FIELD_MANAGER,
            force=True,
            _content_type=APPLY_PATCH,
        )

    def delete_pod(self, namespace: str, name: str) -> None:
        self._delete_pod(namespace, name)

    def _delete_pod(self, namespace: str, name: str) -> Mapping[str, Any] | None:
        """`delete_pod`, returning the API server's answer: the pod as it now stands
        (being deleted), None when it was gone already."""
        found = _call(
            f"delete pod {namespace}/{name}",
            self._core.delete_namespaced_pod,
            name,
            namespace,
            missing_ok=True,
        )
        return dict(found) if isinstance(found, dict) else None

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
        self._open_gate(namespace, name)

    def _open_gate(self, namespace: str, name: str) -> Mapping[str, Any] | None:
        """`open_gate`, returning the pod as the API server now holds it (None: gone)."""
        found = _call(
            f"release pod {namespace}/{name}",
            self._core.patch_namespaced_pod,
            name,
            namespace,
            [{"op": "remove", "path": "/spec/schedulingGates"}],
            missing_ok=True,
        )
        return dict(found) if isinstance(found, dict) else None

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

    def list_model_deployments(self, namespace: str | None) -> list[dict[str, Any]]:
        """The ModelDeployments of `namespace`, or of every namespace when None."""
        if namespace is None:
            found = _call(
                f"list {crd.PLURAL}",
                self._custom.list_cluster_custom_object,
                crd.GROUP,
                crd.VERSION,
                crd.PLURAL,
            )
        else:
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
        """Create a ModelDeployment, unknown fields refused (AlreadyExists: that name is
        taken)."""
        meta = body["metadata"]
        _call(
            f"create {crd.PLURAL} {meta['namespace']}/{meta['name']}",
            self._custom.create_namespaced_custom_object,
            crd.GROUP,
            crd.VERSION,
            meta["namespace"],
            crd.PLURAL,
            dict(body),
            field_validation=STRICT,
        )

    def replace_model_deployment_spec(
        self, namespace: str, name: str, spec: Mapping[str, Any]
    ) -> None:
        """Make a ModelDeployment's spec exactly `spec`: a JSON patch replacing /spec, so no
        key of the old spec survives (a merge patch would keep every key not named). The
        content type is named: the client sends custom-object patches as merge patches
        whatever the body, and the API server refuses a list as one (400)."""
        self._patch(
            "replace",
            namespace,
            name,
            [{"op": "replace", "path": "/spec", "value": dict(spec)}],
            what="spec",
            field_validation=STRICT,
            _content_type=JSON_PATCH,
        )

    def annotate_model_deployment(
        self, namespace: str, name: str, annotations: Mapping[str, str]
    ) -> None:
        """Set these annotations (a merge patch), leaving the others as they are."""
        self._patch("annotate", namespace, name, {"metadata": {"annotations": dict(annotations)}})

    def _patch(
        self, verb: str, namespace: str, name: str, body: object, *, what: str = "", **options: Any
    ) -> None:
        """Patch ModelDeployment `name` with `body` (a merge patch unless `options` name
        another content type); a refusal raises as `verb` … `what` says."""
        _call(
            f"{verb} {crd.PLURAL} {namespace}/{name} {what}".rstrip(),
            self._custom.patch_namespaced_custom_object,
            crd.GROUP,
            crd.VERSION,
            namespace,
            crd.PLURAL,
            name,
            body,
            **options,
        )

    def delete_model_deployment(self, namespace: str, name: str) -> None:
        """Delete a ModelDeployment in the foreground: it stays, marked for deletion, until
        the garbage collector has deleted its pod and Service and they are gone (their owner
        references block its deletion), so whoever lists ModelDeployments still sees whose
        a terminating pod is (k8s.io/apiserver registry/generic/registry/store.go
        deletionFinalizersForGarbageCollection; kubernetes pkg/controller/garbagecollector
        garbagecollector.go processDeletingDependentsItem)."""
        _call(
            f"delete {crd.PLURAL} {namespace}/{name}",
            self._custom.delete_namespaced_custom_object,
            crd.GROUP,
            crd.VERSION,
            namespace,
            crd.PLURAL,
            name,
            propagation_policy="Foreground",
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
            raise failure(f"read log of pod {namespace}/{name}", error) from None
        text = (response.data or b"").decode("utf-8", errors="replace")
        return text.splitlines()[-tail:] if tail > 0 else []


class NodePort:
    """The node agent's API calls: read its own Node, merge its labels and annotations,
    JSON-patch its status capacity (the documented way to advertise an extended resource),
    list the pods bound to it; on the DRA backend, write its ResourceSlices and read the
    claims its kubelet plugin prepares. Each PATCH names its content type: the client would
    otherwise guess one from the body's shape."""

    def __init__(self, api: client.ApiClient) -> None:
        self._core = client.CoreV1Api(api)
        self._resource = client.ResourceV1Api(api)

    def node_slices(self, node: str, *, driver: str | None = dra.DRIVER) -> list[dict[str, Any]]:
        """The ResourceSlices of `driver` for `node`, or of every driver with None (the API
        server selects on both fields)."""
        selector = f"spec.nodeName={node}" + (f",spec.driver={driver}" if driver else "")
        found = _call(
            f"list resourceslices of {node}",
            self._resource.list_resource_slice,
            field_selector=selector,
        )
        return list(found.get("items") or [])

    def put_slice(self, body: Mapping[str, Any], *, version: str | None) -> None:
        """Create the slice, or with `version` (the resourceVersion read) replace it."""
        name = str(body["metadata"]["name"])
        if version is None:
            _call(f"create resourceslices {name}", self._resource.create_resource_slice, body)
            return
        replaced = {**body, "metadata": {**body["metadata"], "resourceVersion": version}}
        _call(
            f"replace resourceslices {name}",
            self._resource.replace_resource_slice,
            name,
            replaced,
        )

    def delete_slice(self, name: str) -> None:
        _call(
            f"delete resourceslices {name}",
            self._resource.delete_resource_slice,
            name,
            missing_ok=True,
        )

    def read_claim(self, namespace: str, name: str) -> dict[str, Any] | None:
        """A ResourceClaim as the API server has it; None when there is none."""
        found = _call(
            f"get resourceclaims {namespace}/{name}",
            self._resource.read_namespaced_resource_claim,
            name,
            namespace,
            missing_ok=True,
        )
        return None if found is None else dict(found)

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
        """A JSON merge patch (RFC 7386) of the Node's metadata: a value sets a key, None
        removes it."""
        metadata: dict[str, Any] = {"labels": dict(labels)}
        if annotations:
            metadata["annotations"] = dict(annotations)
        _call(
            f"label node {name}",
            self._core.patch_node,
            name,
            {"metadata": metadata},
            _content_type=MERGE_PATCH,
        )

    def patch_capacity(self, name: str, operations: list[dict[str, Any]]) -> None:
        """`operations`: JSON-patch (RFC 6902) operations on /status/capacity."""
        _call(
            f"patch node {name} status",
            self._core.patch_node_status,
            name,
            operations,
            _content_type=JSON_PATCH,
        )
