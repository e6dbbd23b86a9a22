"""A Kubernetes API for tests: kmock's in-memory emulator served over HTTP on 127.0.0.1 from a
background event loop, so the code under test uses the real official client (and kopf its own
aiohttp client) over a real socket.

kmock is "a database over HTTP": no scheduler, no kubelet, no label selectors, no quantity
checks. Two test-side stand-ins fill the gaps we rely on, each small enough to read:
`FakeScheduler.step()` binds pending pods when the node's allocatable extended resources hold
them (else marks them `PodScheduled=False/Unschedulable`, as kube-scheduler does; pods with
scheduling gates are left alone, as it leaves them), and
`FakeKubelet` copies capacity to allocatable and can "restart", zeroing extended resources.
"""

from __future__ import annotations

import asyncio
import copy
import threading
import time
import uuid
from collections.abc import Callable, Mapping
from typing import Any, TypeVar

import kmock
from kubernetes import client

from cohabit.kube import crd
from cohabit.kube.cluster import api_client
from cohabit.kube.fleetview import pod_requests

T = TypeVar("T")
VERBS = {"get", "list", "watch", "create", "update", "patch", "delete"}
RESOURCES: Mapping[str, dict[str, Any]] = {
    "v1/namespaces": {"kind": "Namespace", "namespaced": False},
    "v1/nodes": {"kind": "Node", "namespaced": False, "subresources": {"status"}},
    "v1/pods": {"kind": "Pod", "namespaced": True, "subresources": {"status"}},
    "v1/services": {"kind": "Service", "namespaced": True},
    "v1/events": {"kind": "Event", "namespaced": True},
    "apiextensions.k8s.io/v1/customresourcedefinitions": {
        "kind": "CustomResourceDefinition",
        "namespaced": False,
    },
    f"{crd.GROUP}/{crd.VERSION}/{crd.PLURAL}": {
        "kind": crd.KIND,
        "namespaced": True,
        "singular": crd.SINGULAR,
        "subresources": {"status"},
    },
}
NODES = ("v1", "nodes")
PODS = ("v1", "pods")
MODEL_DEPLOYMENTS = (crd.GROUP, crd.VERSION, crd.PLURAL)
WAIT_S = 15.0


class _Emulator(kmock.KubernetesEmulator):
    """kmock's emulator plus what an API server stamps on every created object: a uid (kopf
    tells objects apart by it), a resourceVersion (kmock never changes it, so kopf's
    optimistic-lock patches pass) and generation 1."""

    async def _handle(self, request: Any) -> Any:
        if request.action == kmock.action.CREATE and isinstance(request.data, dict):
            meta = request.data.setdefault("metadata", {})
            meta.setdefault("uid", str(uuid.uuid4()))
            meta.setdefault("resourceVersion", "1")
            meta.setdefault("generation", 1)
        return await super()._handle(request)


class Emulator:
    """kmock on a background loop. Every read or write of its objects from the test thread
    goes through `call()`, on the loop, so nothing races the server."""

    def __init__(self) -> None:
        self._loop = asyncio.new_event_loop()
        self._thread = threading.Thread(target=self._loop.run_forever, daemon=True)
        self._stack: list[Any] = []
        self.handler: kmock.KubernetesEmulator | None = None
        self.url = ""

    def __enter__(self) -> Emulator:
        self._thread.start()
        self.url = self._run(self._start())
        return self

    def __exit__(self, *exc: object) -> None:
        self._run(self._stop())
        self._loop.call_soon_threadsafe(self._loop.stop)
        self._thread.join(timeout=10)
        self._loop.close()

    async def _start(self) -> str:
        handler = _Emulator()
        for key, info in RESOURCES.items():
            handler.resources[key] = {"verbs": VERBS, **info}
        await handler.__aenter__()
        server = kmock.Server(handler)
        await server.__aenter__()
        self._stack = [server, handler]
        self.handler = handler
        return str(server.url).rstrip("/")

    async def _stop(self) -> None:
        for entered in self._stack:
            await entered.__aexit__(None, None, None)

    def _run(self, coroutine: Any) -> Any:
        return asyncio.run_coroutine_threadsafe(coroutine, self._loop).result(timeout=WAIT_S)

    def call(self, function: Callable[[], T]) -> T:
        async def on_loop() -> T:
            return function()

        result: T = self._run(on_loop())
        return result

    # --- the state, as plain dicts -------------------------------------------------------

    def api(self) -> client.ApiClient:
        return api_client(host=self.url)

    def objects(self, group_version_plural: tuple[str, ...]) -> list[dict[str, Any]]:
        """Live objects of one resource (copies)."""
        wanted = "/".join(group_version_plural)

        def read() -> list[dict[str, Any]]:
            assert self.handler is not None
            found = []
            for (resource, _namespace, _name), obj in self.handler.objects.items():
                if _resource_key(resource) == wanted and not obj.deleted:
                    found.append(copy.deepcopy(dict(obj.raw)))
            return found

        return self.call(read)

    def get(self, group_version_plural: tuple[str, ...], name: str) -> dict[str, Any] | None:
        found = [o for o in self.objects(group_version_plural) if o["metadata"]["name"] == name]
        return found[0] if found else None

    def put(self, group_version_plural: tuple[str, ...], body: Mapping[str, Any]) -> None:
        """Store an object as if created through the API (no request recorded)."""

        def store() -> None:
            assert self.handler is not None
            meta = body["metadata"]
            key = (_resource(group_version_plural), meta.get("namespace"), meta["name"])
            stored = copy.deepcopy(dict(body))
            stored["metadata"].setdefault("uid", str(uuid.uuid4()))
            self.handler.objects[key] = stored

        self.call(store)

    def patch(
        self, group_version_plural: tuple[str, ...], name: str, patch: Mapping[str, Any]
    ) -> None:
        """Merge-patch an object over HTTP, as a kubelet or scheduler would, so watchers see
        the change (kmock streams events only for requests it serves)."""
        found = self.get(group_version_plural, name)
        assert found is not None, f"no {name} to patch"
        namespace = found["metadata"].get("namespace")
        group, version, plural = (
            group_version_plural if len(group_version_plural) == 3 else ("", *group_version_plural)
        )
        root = f"/apis/{group}/{version}" if group else f"/api/{version}"
        scope = f"/namespaces/{namespace}" if namespace else ""

        async def send() -> None:
            assert self.handler is not None
            async with self.handler.patch(
                f"{root}{scope}/{plural}/{name}",
                json=dict(patch),
                headers={"Content-Type": "application/merge-patch+json"},
            ) as response:
                response.raise_for_status()

        self._run(send())

    def requests(self) -> list[tuple[str, str]]:
        """(method, path) of every request the API server received, in order."""

        def read() -> list[tuple[str, str]]:
            assert self.handler is not None
            return [(str(r.method.value).upper(), r.url.path) for r in list(self.handler)]

        return self.call(read)


def _resource(group_version_plural: tuple[str, ...]) -> kmock.resource:
    return kmock.resource("/".join(group_version_plural))


def _resource_key(resource: Any) -> str:
    parts = [resource.group, resource.version, resource.plural]
    return "/".join(part for part in parts if part)


def wait_for(check: Callable[[], T | None], *, timeout_s: float = WAIT_S, what: str) -> T:
    """Poll `check` until it returns something truthy; fail naming `what` otherwise."""
    deadline = time.monotonic() + timeout_s
    while True:
        value = check()
        if value:
            return value
        if time.monotonic() > deadline:
            raise AssertionError(f"timed out after {timeout_s:.0f} s waiting for {what}")
        time.sleep(0.05)


class FakeKubelet:
    """The kubelet's part we need: allocatable follows capacity; a restart zeroes extended
    resources (kubernetes PR #64784), which whoever advertised them must re-publish."""

    def __init__(self, emulator: Emulator, node: str) -> None:
        self.emulator, self.node = emulator, node

    def sync(self) -> None:
        body = self.emulator.get(NODES, self.node) or {}
        capacity = (body.get("status") or {}).get("capacity") or {}
        self.emulator.patch(NODES, self.node, {"status": {"allocatable": dict(capacity)}})

    def restart(self) -> None:
        body = self.emulator.get(NODES, self.node) or {}
        status = body.get("status") or {}
        zeroed = {
            field: {name: "0" for name in (status.get(field) or {}) if "/" in name}
            for field in ("capacity", "allocatable")
        }
        self.emulator.patch(NODES, self.node, {"status": zeroed})


class FakeScheduler:
    """kube-scheduler's fit check for what our pods ask: a pending pod whose required node
    affinity names node X is bound to X when the extended resources requested by every
    non-terminal pod on X, plus its own, fit X's allocatable; otherwise it is marked
    `PodScheduled=False, reason=Unschedulable` with the scheduler's wording."""

    def __init__(self, emulator: Emulator) -> None:
        self.emulator = emulator

    def step(self) -> None:
        nodes = {_hostname(n): n for n in self.emulator.objects(NODES)}
        pods = self.emulator.objects(PODS)
        for pod in pods:
            if pod.get("spec", {}).get("nodeName") or _unschedulable(pod):
                continue
            if pod.get("spec", {}).get("schedulingGates"):
                continue  # kube-scheduler leaves a gated pod alone until its gates are gone
            target = _affinity_node(pod)
            node = nodes.get(target or "")
            if node is None:
                short = ["node(s) didn't match Pod's node affinity/selector"]
            else:
                short = _shortfall(pod, node, pods)
            if short:
                message = f"0/{len(nodes)} nodes are available: " + ", ".join(short) + "."
                condition = {
                    "type": "PodScheduled",
                    "status": "False",
                    "reason": "Unschedulable",
                    "message": message,
                }
                patch: dict[str, Any] = {"status": {"phase": "Pending", "conditions": [condition]}}
            elif node is not None:
                condition = {"type": "PodScheduled", "status": "True"}
                patch = {
                    "spec": {"nodeName": node["metadata"]["name"]},
                    "status": {"phase": "Pending", "conditions": [condition]},
                }
            self.emulator.patch(PODS, pod["metadata"]["name"], patch)


def _hostname(node: Mapping[str, Any]) -> str:
    """What node affinity on kubernetes.io/hostname matches (not always the node's name)."""
    meta = node["metadata"]
    return str((meta.get("labels") or {}).get("kubernetes.io/hostname", meta["name"]))


def _unschedulable(pod: Mapping[str, Any]) -> bool:
    return any(
        c.get("reason") == "Unschedulable" for c in (pod.get("status") or {}).get("conditions", [])
    )


def _affinity_node(pod: Mapping[str, Any]) -> str | None:
    terms = (
        pod.get("spec", {})
        .get("affinity", {})
        .get("nodeAffinity", {})
        .get("requiredDuringSchedulingIgnoredDuringExecution", {})
        .get("nodeSelectorTerms", [])
    )
    for term in terms:
        for expression in term.get("matchExpressions", []):
            if expression.get("key") == "kubernetes.io/hostname":
                return str(expression["values"][0])
    return None


def _shortfall(
    pod: Mapping[str, Any], node: Mapping[str, Any], pods: list[dict[str, Any]]
) -> list[str]:
    allocatable = (node.get("status") or {}).get("allocatable") or {}
    used: dict[str, int] = {}
    for other in pods:
        if other.get("spec", {}).get("nodeName") == node["metadata"]["name"]:
            for name, value in pod_requests(other).items():
                if value.isdigit():
                    used[name] = used.get(name, 0) + int(value)
    short = []
    for name, value in pod_requests(pod).items():
        if "/" not in name or not value.isdigit():
            continue
        have = int(str(allocatable.get(name, "0")) or 0)
        if used.get(name, 0) + int(value) > have:
            short.append(f"1 Insufficient {name}")
    return short
