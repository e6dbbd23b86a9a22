"""ModelDeployments placed through the operator and the real kube-scheduler, against the same
pods given to the scheduler alone.

A real control plane (`scripts/cluster.sh`: etcd, kube-apiserver, kube-controller-manager,
kube-scheduler, kwok playing the kubelets) with N nodes of 8 × H100 80GB, labelled and
budgeted (`cohabit.dev/vram-gb-gpu-<i>`) as our node agent does. The chart is installed
with `helm install`; its operator runs here as a process, as the chart's ServiceAccount.

1. Baseline: the engine pods the operator builds for the deployments (its own code, planned
   in apply order against the empty nodes, without its one-start-per-device gate), created
   straight away by the same appliers; the kube-scheduler alone binds them.
2. Operator: the ModelDeployments applied by the same appliers; the operator plans each,
   creates its pod, the scheduler binds it.
For each: deployments (pods) per second from the first apply to the last pod Running, and
per deployment the time from its apply to its pod bound and Running (and, for the operator,
to the status DEPLOYED). Then every GPU's budget is filled by another tenant's pods and one
more ModelDeployment is applied: the time until its status says NoFit (and one that could
never fit). Checks: every pod ended Running, no GPU budget over-committed, the operator
deleted no pod (it deletes one the scheduler refuses), the refused deployments got no pod.

Run: .venv/bin/python benchmarks/kube_scale.py                       (200 nodes, 1,000)
     .venv/bin/python benchmarks/kube_scale.py --nodes 20 --deployments 100
     .venv/bin/python benchmarks/kube_scale.py --kubeconfig K --cluster-bin B  (a cluster
     already up; it must have no other ModelDeployments nor a cohabit release)
Prints a table, then one JSON line.
"""

from __future__ import annotations

import argparse
import copy
import json
import os
import random
import sys
import tempfile
import threading
import time
import uuid
from collections.abc import Callable, Iterator, Mapping
from concurrent.futures import ThreadPoolExecutor
from contextlib import contextmanager
from dataclasses import dataclass, field
from datetime import UTC, datetime
from pathlib import Path
from typing import Any

import psutil
from kubernetes import client

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))  # the tests' cluster harness

from tests.cluster.harness import (
    Cluster,
    HostProcess,
    apply,
    apply_crd,
    install,
    kwok_node,
    local_cluster,
    model_deployment,
    run_operator,
)

from cohabit.hardware import labels as node_labels
from cohabit.hardware.model import Gpu, Node, Topology, Vendor
from cohabit.kube import controller, crd
from cohabit.units import MIB

GPUS_PER_NODE = 8
H100_MIB = 81_559  # NVML's total for an H100 80GB HBM3: a 79 GiB budget per GPU
RELEASE_NAMESPACE = "cohabit"
BASELINE_NAMESPACE = "bench-baseline"
OPERATOR_NAMESPACE = "bench-operator"
TENANT_NAMESPACE = "bench-tenant"
GROUP = "bench"
APPLIERS = 8  # concurrent API clients creating objects, in both runs
WAIT_S = 900.0
# The mix: per-GPU budgets of 4-38 GiB, most models on one GPU, some tensor-parallel.
TENSOR_PARALLEL = [(1, 80), (2, 12), (4, 6), (8, 2)]
# The scheduler's client limits for this cluster (its defaults are 50 queries a second,
# bursts of 100: they would cap the baseline, not the scheduler's work).
SCHEDULER_QPS, SCHEDULER_BURST = "5000", "10000"


# --- the cluster ------------------------------------------------------------------------


@contextmanager
def cluster_for(args: argparse.Namespace) -> Iterator[Cluster]:
    if args.kubeconfig:
        yield Cluster(kubeconfig=Path(args.kubeconfig), bin_dir=Path(args.cluster_bin))
        return
    os.environ["COHABIT_CLUSTER_SCHEDULER_QPS"] = SCHEDULER_QPS
    os.environ["COHABIT_CLUSTER_SCHEDULER_BURST"] = SCHEDULER_BURST
    with (
        tempfile.TemporaryDirectory(prefix="cohabit-kube-scale-") as state,
        local_cluster(Path(state)) as cluster,
    ):
        yield cluster


def h100_node(name: str) -> dict[str, Any]:
    """A kwok node as our agent leaves an 8 × H100 box: its labels, GPU identities and one
    budget per GPU, on a host with the CPUs and memory of one (224 threads, 2 TiB)."""
    hardware = Node(
        name=name,
        gpus=tuple(
            Gpu(
                index=i,
                vendor=Vendor.NVIDIA,
                product="NVIDIA H100 80GB HBM3",
                memory_bytes=H100_MIB * MIB,
                accel_version="12.4",
                uuid=f"GPU-{uuid.uuid5(uuid.NAMESPACE_DNS, f'{name}.{i}')}",
            )
            for i in range(GPUS_PER_NODE)
        ),
    )
    budgets = node_labels.allocatable_for_node(hardware)
    body = kwok_node(
        name,
        labels=node_labels.labels_for_node(hardware),
        capacity={"cpu": "224", "memory": "2Ti", "pods": "250", **budgets},
        group=GROUP,
    )
    body["metadata"]["annotations"].update(node_labels.annotations_for_node(hardware))
    return body


def make_nodes(core: client.CoreV1Api, count: int) -> list[str]:
    names = [f"h100-{i:03d}" for i in range(count)]
    with ThreadPoolExecutor(APPLIERS) as pool:
        list(pool.map(lambda n: core.create_node(h100_node(n)), names))
    wait(lambda: all(_schedulable(n) for n in _list(core.list_node)), "every node Ready")
    return names


def _schedulable(node: Mapping[str, Any]) -> bool:
    conditions = (node.get("status") or {}).get("conditions") or []
    ready = any(c.get("type") == "Ready" and c.get("status") == "True" for c in conditions)
    taints = (node.get("spec") or {}).get("taints") or []
    return ready and not any(t.get("key") == "node.kubernetes.io/not-ready" for t in taints)


def _list(function: Callable[..., Any], *args: Any) -> list[dict[str, Any]]:
    found = json.loads(function(*args, _preload_content=False).data)
    return list(found.get("items") or [])


def wait(check: Callable[[], Any], what: str, timeout_s: float = WAIT_S) -> Any:
    """Poll until `check` is truthy (conditions only, never a fixed time)."""
    deadline = time.monotonic() + timeout_s
    while not (found := check()):
        if time.monotonic() > deadline:
            raise SystemExit(f"timed out after {timeout_s:.0f} s waiting for {what}")
        time.sleep(0.2)
    return found


def namespace(core: client.CoreV1Api, name: str) -> None:
    core.create_namespace({"metadata": {"name": name}})
    wait(
        lambda: any(
            sa["metadata"]["name"] == "default"
            for sa in _list(core.list_namespaced_service_account, name)
        ),
        f"namespace {name}'s ServiceAccount",
    )


# --- what happens, as watches report it -------------------------------------------------


@dataclass
class Seen:
    """When the watch first reported each object in a state, by name (monotonic seconds)."""

    bound: dict[str, float] = field(default_factory=dict)
    running: dict[str, float] = field(default_factory=dict)
    deleted: dict[str, float] = field(default_factory=dict)
    pending_reason: dict[str, str] = field(default_factory=dict)
    phase: dict[str, tuple[float, dict[str, Any]]] = field(default_factory=dict)
    changed: threading.Condition = field(default_factory=threading.Condition)


class Watcher:
    """Watches one kind in one namespace on a thread and records into `seen`."""

    def __init__(
        self,
        name: str,
        lister: Callable[[], tuple[list[dict[str, Any]], str]],
        watcher: Callable[[str], WatchStream],
        record: Callable[[str, dict[str, Any], float], None],
    ) -> None:
        self._lister, self._watcher, self._record = lister, watcher, record
        self._stream: WatchStream | None = None
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._run, name=name, daemon=True)
        self._listed = threading.Event()

    def __enter__(self) -> Watcher:
        self._thread.start()
        if not self._listed.wait(60):
            raise SystemExit("a watch did not start")
        return self

    def __exit__(self, *_: object) -> None:
        self._stop.set()
        if self._stream is not None:
            self._stream.close()
        self._thread.join(10)

    def _run(self) -> None:
        items, version = self._lister()
        for item in items:
            self._record("ADDED", item, time.monotonic())
        self._listed.set()
        while not self._stop.is_set():
            try:
                self._stream = self._watcher(version)
                for event in self._stream:
                    obj = event.get("object") or {}
                    version = str((obj.get("metadata") or {}).get("resourceVersion") or version)
                    if event.get("type") == "ERROR":
                        raise SystemExit(f"the benchmark's watch failed: {obj}")
                    if event.get("type") != "BOOKMARK":
                        self._record(str(event.get("type")), obj, time.monotonic())
            except Exception:
                if self._stop.is_set():
                    return
                raise


class WatchStream:
    """One watch response: its events (dicts with `type` and `object`) as they arrive;
    `close()` from another thread ends the iteration."""

    def __init__(self, response: Any) -> None:
        self._response = response

    def __iter__(self) -> Iterator[dict[str, Any]]:
        try:
            for line in self._response:  # urllib3 yields the body line by line
                if line.strip():
                    yield json.loads(line)
        finally:
            self._response.release_conn()

    def close(self) -> None:
        self._response.shutdown()


def listed(function: Callable[..., Any], *args: Any) -> tuple[list[dict[str, Any]], str]:
    """A list call's items and the resourceVersion a watch continues from."""
    found = json.loads(function(*args, _preload_content=False).data)
    return list(found.get("items") or []), str(found["metadata"]["resourceVersion"])


def watching(function: Callable[..., Any], *args: Any, version: str) -> WatchStream:
    """The same list call as a watch from `version`, bookmarks included."""
    return WatchStream(
        function(
            *args,
            watch=True,
            resource_version=version,
            allow_watch_bookmarks=True,
            timeout_seconds=300,
            _preload_content=False,
        )
    )


def pod_watcher(api: client.ApiClient, ns: str, seen: Seen) -> Watcher:
    core = client.CoreV1Api(api)

    def record(kind: str, pod: dict[str, Any], at: float) -> None:
        name = pod["metadata"]["name"]
        with seen.changed:
            if kind == "DELETED":
                seen.deleted.setdefault(name, at)
            else:
                if (pod.get("spec") or {}).get("nodeName"):
                    seen.bound.setdefault(name, at)
                if (pod.get("status") or {}).get("phase") == "Running":
                    seen.running.setdefault(name, at)
            seen.changed.notify_all()

    return Watcher(
        f"pods-{ns}",
        lambda: listed(core.list_namespaced_pod, ns),
        lambda version: watching(core.list_namespaced_pod, ns, version=version),
        record,
    )


def md_watcher(api: client.ApiClient, ns: str, seen: Seen) -> Watcher:
    custom = client.CustomObjectsApi(api)
    where = (crd.GROUP, crd.VERSION, ns, crd.PLURAL)

    def record(kind: str, md: dict[str, Any], at: float) -> None:
        status = md.get("status") or {}
        if kind != "DELETED" and status.get("phase") in ("DEPLOYED", "FAILED", "ERROR"):
            with seen.changed:
                seen.phase.setdefault(md["metadata"]["name"], (at, status))
                seen.changed.notify_all()

    return Watcher(
        f"mds-{ns}",
        lambda: listed(custom.list_namespaced_custom_object, *where),
        lambda version: watching(custom.list_namespaced_custom_object, *where, version=version),
        record,
    )


def until(seen: Seen, check: Callable[[], bool], what: str, timeout_s: float = WAIT_S) -> None:
    """Wait on the watches' notifications until `check` holds."""
    deadline = time.monotonic() + timeout_s
    with seen.changed:
        while not check():
            left = deadline - time.monotonic()
            if left <= 0:
                raise SystemExit(f"timed out after {timeout_s:.0f} s waiting for {what}")
            seen.changed.wait(min(left, 1.0))


# --- the workload -----------------------------------------------------------------------


def _said(status: Mapping[str, Any]) -> str:
    """A status's phase and last error, for a check's message."""
    return f"{status.get('phase')} {status.get('lastErrorCode')}: {status.get('lastErrorMessage')}"


def workload(count: int, ns: str, seed: int) -> list[dict[str, Any]]:
    rng = random.Random(seed)
    shapes, weights = zip(*TENSOR_PARALLEL, strict=True)
    docs = []
    for i in range(count):
        spec: dict[str, Any] = {
            "model": "Qwen/Qwen3-8B",
            "engine": "vllm",
            "vram": f"{rng.randint(4, 38)}GiB",
        }
        tp = rng.choices(shapes, weights)[0]
        if tp > 1:
            spec["tensorParallelSize"] = tp
        docs.append(model_deployment(f"m-{i:04d}", ns, **spec))
    return docs


class PlanningPort:
    """The operator's own decisions for the baseline, made here: the real nodes, the pods
    created so far kept in memory, the API calls of a reconcile answered locally."""

    def __init__(self, nodes: list[dict[str, Any]], settings: controller.OperatorSettings):
        self.nodes = nodes
        self.settings = settings
        self.pods: dict[tuple[str, str], dict[str, Any]] = {}

    def list_nodes(self, *, listed_since: float | None = None) -> list[dict[str, Any]]:
        return self.nodes

    def list_pods(
        self,
        namespace: str | None,
        *,
        seen: str | None = None,
        listed_since: float | None = None,
    ) -> list[dict[str, Any]]:
        return list(self.pods.values())

    def get_pod(
        self, namespace: str, name: str, *, seen: str | None = None
    ) -> dict[str, Any] | None:
        return self.pods.get((namespace, name))

    def create(self, body: Mapping[str, Any]) -> None:
        pod = copy.deepcopy(dict(body))
        # Ready at once: the baseline starts every pod together, so none waits for another.
        pod["status"] = {
            "phase": "Running",
            "conditions": [{"type": "Ready", "status": "True"}],
        }
        self.pods[(pod["metadata"]["namespace"], pod["metadata"]["name"])] = pod

    def apply(self, body: Mapping[str, Any]) -> None: ...

    def assume(self, pod: dict[str, Any]) -> None: ...  # created here at once: listed then

    def forget(self, pod: dict[str, Any]) -> None: ...

    def delete_pod(self, namespace: str, name: str) -> None: ...

    def delete_service(self, namespace: str, name: str) -> None: ...

    def open_gate(self, namespace: str, name: str) -> None: ...

    def patch_status(self, namespace: str, name: str, status: Mapping[str, Any]) -> None: ...

    def get_model_deployment(self, namespace: str, name: str) -> dict[str, Any] | None:
        return None

    def list_model_deployments(self, namespace: str | None) -> list[dict[str, Any]]:
        return []


def baseline_pods(
    docs: list[dict[str, Any]], nodes: list[dict[str, Any]], ns: str
) -> list[dict[str, Any]]:
    """The pods the operator creates for `docs`, decided by its own code in apply order,
    moved to `ns`; each pod body exactly as the operator sends it (no owner: there is no
    ModelDeployment behind it)."""
    settings = controller.OperatorSettings(topology=Topology.STANDALONE_CLUSTER)
    port = PlanningPort(nodes, settings)
    now = datetime.now(UTC)
    for doc in docs:
        body = {**doc, "metadata": {**doc["metadata"], "namespace": ns, "generation": 1}}
        outcome = controller.reconcile(
            port, settings, controller.model_deployment_ref(body), now=now
        )
        if outcome.status.phase is not crd.Phase.DEPLOYING:
            raise SystemExit(f"the baseline's plan did not place {doc['metadata']['name']}")
    return [{k: v for k, v in pod.items() if k != "status"} for _, pod in sorted(port.pods.items())]


# --- one run ----------------------------------------------------------------------------


@dataclass
class Run:
    applied: dict[str, float]
    seen: Seen
    names: list[str]  # the pod of each, by the applied object's name

    def figures(self) -> dict[str, Any]:
        pods = list(self.names)
        first = min(self.applied.values())
        last = max(self.seen.running[p] for p in pods)
        to_running = [self.seen.running[p] - self.applied[n] for n, p in self.pairs()]
        to_bound = [self.seen.bound[p] - self.applied[n] for n, p in self.pairs()]
        result = {
            "count": len(pods),
            "seconds": round(last - first, 2),
            "per_s": round(len(pods) / (last - first), 1),
            "apply_s": round(max(self.applied.values()) - first, 2),
            "running_p50_s": _percentile(to_running, 0.5),
            "running_p99_s": _percentile(to_running, 0.99),
            "bound_p50_s": _percentile(to_bound, 0.5),
            "bound_p99_s": _percentile(to_bound, 0.99),
        }
        deployed = [
            self.seen.phase[n][0] - self.applied[n] for n, _ in self.pairs() if n in self.seen.phase
        ]
        if deployed:
            result["deployed_p50_s"] = _percentile(deployed, 0.5)
            result["deployed_p99_s"] = _percentile(deployed, 0.99)
        return result

    def pairs(self) -> list[tuple[str, str]]:
        return [(name, pod) for name, pod in zip(self.applied, self.names, strict=True)]


def _percentile(values: list[float], fraction: float) -> float:
    ordered = sorted(values)
    return round(ordered[min(len(ordered) - 1, int(len(ordered) * fraction))], 3)


def create_all(
    objects: list[dict[str, Any]], create: Callable[[dict[str, Any]], None]
) -> dict[str, float]:
    """Create every object with APPLIERS concurrent clients, in order; when each was sent."""
    applied: dict[str, float] = {}
    lock = threading.Lock()

    def one(obj: dict[str, Any]) -> None:
        at = time.monotonic()
        create(obj)
        with lock:
            applied[obj["metadata"]["name"]] = at

    with ThreadPoolExecutor(APPLIERS) as pool:
        list(pool.map(one, objects))
    return {obj["metadata"]["name"]: applied[obj["metadata"]["name"]] for obj in objects}


def run_baseline(api: client.ApiClient, pods: list[dict[str, Any]]) -> Run:
    core = client.CoreV1Api(api)
    seen = Seen()
    names = [p["metadata"]["name"] for p in pods]
    with pod_watcher(api, BASELINE_NAMESPACE, seen):
        applied = create_all(
            pods,
            lambda pod: core.create_namespaced_pod(BASELINE_NAMESPACE, pod, _preload_content=False),
        )
        until(seen, lambda: all(n in seen.running for n in names), "every baseline pod Running")
    return Run(applied=applied, seen=seen, names=names)


def run_operator_deployments(api: client.ApiClient, docs: list[dict[str, Any]]) -> Run:
    seen = Seen()
    names = [f"{d['metadata']['name']}-engine" for d in docs]
    with pod_watcher(api, OPERATOR_NAMESPACE, seen), md_watcher(api, OPERATOR_NAMESPACE, seen):
        applied = create_all(docs, lambda doc: apply(api, doc))
        until(
            seen,
            lambda: (
                all(n in seen.running for n in names)
                and all(d["metadata"]["name"] in seen.phase for d in docs)
            ),
            "every pod Running and every ModelDeployment DEPLOYED",
        )
    return Run(applied=applied, seen=seen, names=names)


def api_requests(cluster: Cluster) -> dict[str, float]:
    """The API server's requests served so far (`apiserver_request_total`) by verb and
    resource, watches left out."""
    text = cluster.run("kubectl", "get", "--raw", "/metrics").stdout
    counts: dict[str, float] = {}
    for line in text.splitlines():
        if not line.startswith("apiserver_request_total{"):
            continue
        labels = dict(
            part.split("=", 1) for part in line[line.index("{") + 1 : line.index("}")].split(",")
        )
        verb = labels.get("verb", "").strip('"')
        resource = labels.get("resource", "").strip('"')
        sub = labels.get("subresource", "").strip('"')
        if verb != "WATCH":
            key = f"{verb} {resource}{'/' + sub if sub else ''}"
            counts[key] = counts.get(key, 0) + float(line.rsplit(" ", 1)[1])
    return counts


COMPONENTS = ("etcd", "kube-apiserver", "kube-controller-manager", "kube-scheduler", "kwok")


def processes(cluster: Cluster, operator: HostProcess | None = None) -> dict[str, int]:
    """The control plane's processes (from the pids `scripts/cluster.sh` keeps beside the
    kubeconfig), the operator's and this one's."""
    found = {"benchmark": os.getpid()}
    folder = cluster.kubeconfig.parent / "pids"
    for name in COMPONENTS:
        if (folder / name).exists():
            found[name] = int((folder / name).read_text())
    if operator is not None:
        found["operator"] = operator.process.pid
    return found


def cpu_seconds(pids: Mapping[str, int]) -> dict[str, float]:
    times = {}
    for name, pid in pids.items():
        used = psutil.Process(pid).cpu_times()
        times[name] = used.user + used.system
    return times


def cpu_between(before: Mapping[str, float], after: Mapping[str, float]) -> dict[str, float]:
    return {name: round(after[name] - before.get(name, 0.0), 1) for name in after}


def requests_between(
    before: dict[str, float], after: dict[str, float], per: int
) -> dict[str, float]:
    return {
        key: round((after.get(key, 0) - before.get(key, 0)) / per, 2)
        for key in sorted(after)
        if after.get(key, 0) - before.get(key, 0) >= per / 10
    }


# --- checks -----------------------------------------------------------------------------


def budgets_held(api: client.ApiClient) -> dict[tuple[str, str], tuple[int, int]]:
    """Per (node, budget resource): what the bound, unfinished pods request, and what the
    node allocates."""
    core = client.CoreV1Api(api)
    allocatable = {
        (n["metadata"]["name"], key): int(value)
        for n in _list(core.list_node)
        for key, value in (n["status"].get("allocatable") or {}).items()
        if key.startswith("cohabit.dev/vram-gb-gpu-")
    }
    held = dict.fromkeys(allocatable, 0)
    for pod in _list(core.list_pod_for_all_namespaces):
        node = (pod.get("spec") or {}).get("nodeName")
        if not node or (pod.get("status") or {}).get("phase") in ("Succeeded", "Failed"):
            continue
        for container in pod["spec"]["containers"]:
            for key, value in ((container.get("resources") or {}).get("requests") or {}).items():
                if (node, key) in held:
                    held[(node, key)] += int(value)
    return {key: (held[key], allocatable[key]) for key in allocatable}


def check_run(api: client.ApiClient, ns: str, run: Run, label: str) -> list[str]:
    problems = []
    core = client.CoreV1Api(api)
    phases = {
        p["metadata"]["name"]: p["status"].get("phase") for p in _list(core.list_namespaced_pod, ns)
    }
    not_running = [n for n in run.names if phases.get(n) != "Running"]
    if not_running:
        problems.append(
            f"{label}: {len(not_running)} pods not Running at the end: {not_running[:5]}"
        )
    deleted = [n for n in run.names if n in run.seen.deleted]
    if deleted:
        problems.append(f"{label}: {len(deleted)} pods were deleted on the way: {deleted[:5]}")
    over = [(key, used) for key, used in budgets_held(api).items() if used[0] > used[1]]
    if over:
        problems.append(f"{label}: budgets over-committed: {over[:5]}")
    failed = [n for n, (_, s) in run.seen.phase.items() if s.get("phase") != "DEPLOYED"]
    if failed:
        said = [(n, _said(run.seen.phase[n][1])) for n in failed[:5]]
        problems.append(f"{label}: {len(failed)} deployments did not reach DEPLOYED: {said}")
    return problems


# --- NoFit --------------------------------------------------------------------------------


def fill_every_budget(api: client.ApiClient) -> int:
    """Another tenant's pods, one per node, requesting whatever budget each GPU has left;
    returns how many, once every one is Running."""
    core = client.CoreV1Api(api)
    left: dict[str, dict[str, int]] = {}
    for (node, key), (used, total) in budgets_held(api).items():
        if total > used:
            left.setdefault(node, {})[key] = total - used
    pods = [
        {
            "apiVersion": "v1",
            "kind": "Pod",
            "metadata": {"name": f"tenant-{node}", "namespace": TENANT_NAMESPACE},
            "spec": {
                "affinity": {
                    "nodeAffinity": {
                        "requiredDuringSchedulingIgnoredDuringExecution": {
                            "nodeSelectorTerms": [
                                {
                                    "matchExpressions": [
                                        {
                                            "key": "kubernetes.io/hostname",
                                            "operator": "In",
                                            "values": [node],
                                        }
                                    ]
                                }
                            ]
                        }
                    }
                },
                "containers": [
                    {
                        "name": "work",
                        "image": "registry.k8s.io/pause:3.10",
                        "resources": {
                            "requests": {k: str(v) for k, v in budgets.items()},
                            "limits": {k: str(v) for k, v in budgets.items()},
                        },
                    }
                ],
            },
        }
        for node, budgets in sorted(left.items())
    ]
    seen = Seen()
    names = [p["metadata"]["name"] for p in pods]
    with pod_watcher(api, TENANT_NAMESPACE, seen):
        create_all(
            pods,
            lambda pod: core.create_namespaced_pod(TENANT_NAMESPACE, pod, _preload_content=False),
        )
        until(seen, lambda: all(n in seen.running for n in names), "every tenant pod Running")
    return len(pods)


def time_to_no_fit(api: client.ApiClient, doc: dict[str, Any]) -> dict[str, Any]:
    """Apply one ModelDeployment; the time until its status says NoFit, and what it says."""
    seen = Seen()
    name = doc["metadata"]["name"]
    with pod_watcher(api, OPERATOR_NAMESPACE, seen), md_watcher(api, OPERATOR_NAMESPACE, seen):
        start = time.monotonic()
        apply(api, doc)
        until(seen, lambda: name in seen.phase, f"{name}'s status", timeout_s=120)
    at, status = seen.phase[name]
    no_fit = status.get("noFit") or {}
    return {
        "seconds": round(at - start, 3),
        "phase": status.get("phase"),
        "code": status.get("lastErrorCode"),
        "reason": no_fit.get("reason"),
        "permanent": no_fit.get("permanent"),
        "message": status.get("lastErrorMessage"),
        "pod_created": f"{name}-engine" in seen.bound
        or f"{name}-engine" in seen.running
        or any(p.startswith(name) for p in seen.deleted),
    }


# --- main ---------------------------------------------------------------------------------


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--nodes", type=int, default=200)
    parser.add_argument("--deployments", type=int, default=1000)
    parser.add_argument("--seed", type=int, default=7)
    parser.add_argument("--kubeconfig", help="a cluster already up (else one of its own)")
    parser.add_argument("--cluster-bin", help="with --kubeconfig: the folder of its binaries")
    parser.add_argument("--keep", help="a folder to keep the operator's log and values in")
    args = parser.parse_args()
    if args.kubeconfig and not args.cluster_bin:
        parser.error("--kubeconfig needs --cluster-bin (scripts/cluster.sh bin)")
    problems: list[str] = []
    with cluster_for(args) as cluster, tempfile.TemporaryDirectory() as scratch:
        folder = Path(args.keep or scratch)
        folder.mkdir(parents=True, exist_ok=True)
        api = cluster.api()
        core = client.CoreV1Api(api)
        started = time.monotonic()
        apply_crd(cluster)
        for ns in (RELEASE_NAMESPACE, BASELINE_NAMESPACE, OPERATOR_NAMESPACE, TENANT_NAMESPACE):
            namespace(core, ns)
        release = install(cluster, RELEASE_NAMESPACE, {}, folder)
        make_nodes(core, args.nodes)
        wait(
            lambda: (
                all(
                    p["status"].get("phase") == "Running"
                    for p in _list(core.list_namespaced_pod, RELEASE_NAMESPACE)
                )
                and len(_list(core.list_namespaced_pod, RELEASE_NAMESPACE)) >= args.nodes
            ),
            "the chart's pods (an agent per node) Running",
        )
        setup_s = time.monotonic() - started
        docs = workload(args.deployments, OPERATOR_NAMESPACE, args.seed)
        nodes = _list(core.list_node)
        nodes.sort(key=lambda n: n["metadata"]["name"])
        pods = baseline_pods(docs, nodes, BASELINE_NAMESPACE)

        print(f"cluster: {args.nodes} nodes x {GPUS_PER_NODE} H100, set up in {setup_s:.0f} s")
        before, cpu = api_requests(cluster), cpu_seconds(processes(cluster))
        baseline = run_baseline(api, pods)
        baseline_requests = requests_between(before, api_requests(cluster), len(pods))
        baseline_cpu = cpu_between(cpu, cpu_seconds(processes(cluster)))
        problems += check_run(api, BASELINE_NAMESPACE, baseline, "baseline")
        core.delete_collection_namespaced_pod(BASELINE_NAMESPACE, grace_period_seconds=0)
        wait(
            lambda: not _list(core.list_namespaced_pod, BASELINE_NAMESPACE),
            "the baseline's pods gone",
        )

        operator: HostProcess = run_operator(release, folder)
        try:
            before, cpu = api_requests(cluster), cpu_seconds(processes(cluster, operator))
            ours = run_operator_deployments(api, docs)
            our_requests = requests_between(before, api_requests(cluster), len(docs))
            our_cpu = cpu_between(cpu, cpu_seconds(processes(cluster, operator)))
            problems += check_run(api, OPERATOR_NAMESPACE, ours, "operator")
            tenants = fill_every_budget(api)
            no_fit = time_to_no_fit(
                api,
                model_deployment(
                    "one-more",
                    OPERATOR_NAMESPACE,
                    model="Qwen/Qwen3-8B",
                    engine="vllm",
                    vram="4GiB",
                ),
            )
            never = time_to_no_fit(
                api,
                model_deployment(
                    "too-big",
                    OPERATOR_NAMESPACE,
                    model="Qwen/Qwen3-8B",
                    engine="vllm",
                    vram="100GiB",
                ),
            )
        finally:
            operator.stop()
        for label, result, permanent in (("NoFit", no_fit, False), ("never fits", never, True)):
            if result["code"] != crd.NO_FIT_ERROR or bool(result["permanent"]) is not permanent:
                problems.append(f"{label}: status {result}")
            if result["pod_created"]:
                problems.append(f"{label}: a pod was created for it")

    b, o = baseline.figures(), ours.figures()
    ratio = round(o["per_s"] / b["per_s"], 2)
    print(f"{args.deployments} deployments on {args.nodes} nodes x {GPUS_PER_NODE} GPUs")
    print(
        "  run               per s  total s | apply->bound p50 / p99 s"
        " | apply->Running p50 / p99 s | apply->DEPLOYED p50 / p99 s"
    )
    for label, f in (("scheduler alone", b), ("operator", o)):
        deployed = f"{f.get('deployed_p50_s', '-')} / {f.get('deployed_p99_s', '-')}"
        print(
            f"  {label:<16} {f['per_s']:>6} {f['seconds']:>8} | "
            f"{f['bound_p50_s']:>8} / {f['bound_p99_s']:<13} | "
            f"{f['running_p50_s']:>8} / {f['running_p99_s']:<15} | {deployed}"
        )
    print(f"  operator / scheduler alone: {ratio} (target >= 0.5)")
    print(
        f"  apply to NoFit, every GPU budget taken ({tenants} tenant pods): "
        f"{no_fit['seconds']} s (target < 1 s): {no_fit['message']}"
    )
    print(f"  apply to NoFit, larger than any GPU: {never['seconds']} s: {never['message']}")
    print(f"  API requests per pod, scheduler alone: {baseline_requests}")
    print(f"  API requests per deployment, operator: {our_requests}")
    print(f"  CPU seconds, scheduler alone: {baseline_cpu}")
    print(f"  CPU seconds, operator: {our_cpu}")
    print("  checks: " + ("all passed" if not problems else "; ".join(problems)))
    figures = {
        "nodes": args.nodes,
        "gpus_per_node": GPUS_PER_NODE,
        "deployments": args.deployments,
        "baseline": {**b, "api_requests": baseline_requests, "cpu_s": baseline_cpu},
        "operator": {**o, "api_requests": our_requests, "cpu_s": our_cpu},
        "ratio": ratio,
        "no_fit": no_fit,
        "never_fits": never,
        "problems": problems,
    }
    print(json.dumps(figures))
    if problems:
        raise SystemExit(1)


if __name__ == "__main__":
    main()
