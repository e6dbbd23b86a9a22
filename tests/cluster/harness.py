"""The real control plane the cluster tests run against, and what they do to it.

`scripts/cluster.sh` builds and starts etcd, kube-apiserver, kube-controller-manager,
kube-scheduler and kwok on loopback; `scripts/test.sh` starts one for the whole run and
exports its kubeconfig as COHABIT_TEST_KUBECONFIG (with the binaries' folder as
COHABIT_TEST_CLUSTER_BIN). Without them the session starts its own (`local_cluster`).

Nothing here stands in for Kubernetes: nodes are real Node objects that kwok keeps Ready in
place of a kubelet (the one boundary: no container runs), pods are bound by the real
scheduler, owner references are collected by the real garbage collector, and the chart's
processes run on this machine authenticated as the chart's own ServiceAccounts, so a missing
permission is a real 403.
"""

from __future__ import annotations

import base64
import json
import os
import random
import socket
import subprocess
import sys
import time
import uuid
from collections.abc import Callable, Iterator, Mapping, Sequence
from contextlib import contextmanager
from dataclasses import dataclass
from pathlib import Path
from typing import Any, TypeVar

import yaml
from kubernetes import client, config
from kubernetes.client.exceptions import ApiException

from cohabit.kube import crd
from cohabit.kube.cluster import NodePort
from cohabit.kube.resources import DEFAULT_ENGINE_RESOURCES

ROOT = Path(__file__).resolve().parents[2]
CLUSTER_SCRIPT = ROOT / "scripts" / "cluster.sh"
PORT_TAKEN = 75  # `cluster.sh up`: one of its ports is taken (EX_TEMPFAIL)
CHART = ROOT / "deploy" / "helm" / "cohabit"
KUBECONFIG_ENV = "COHABIT_TEST_KUBECONFIG"
BIN_ENV = "COHABIT_TEST_CLUSTER_BIN"
KWOK_ANNOTATION = "kwok.x-k8s.io/node"
# Each test's nodes carry this label with the test's namespace as value; the chart's
# placement.nodeSelector then keeps that test's operator and API on them.
GROUP_LABEL = "cohabit-test/group"
WAIT_S = 60.0

T = TypeVar("T")


@dataclass(frozen=True, slots=True)
class Cluster:
    """A running control plane: the admin's kubeconfig and the folder of its binaries."""

    kubeconfig: Path
    bin_dir: Path

    def api(self) -> client.ApiClient:
        return config.new_client_from_config(str(self.kubeconfig))

    def run(self, tool: str, *args: str, check: bool = True) -> subprocess.CompletedProcess[str]:
        """`kubectl` or `helm` as the admin; output captured."""
        result = subprocess.run(
            [str(self.bin_dir / tool), "--kubeconfig", str(self.kubeconfig), *args],
            capture_output=True,
            text=True,
            timeout=180,
            check=False,
        )
        if check and result.returncode != 0:
            raise AssertionError(f"{tool} {' '.join(args)} failed:\n{result.stderr}")
        return result

    def server(self) -> tuple[str, str]:
        """The API server's URL and its CA certificate (PEM), from the admin kubeconfig."""
        document = yaml.safe_load(self.kubeconfig.read_text())
        entry = document["clusters"][0]["cluster"]
        return entry["server"], Path(entry["certificate-authority"]).read_text()


def unavailable(why: str) -> None:
    """Skip with one line saying why, or fail under CI=true, where the cluster tests must
    run (as the PostgreSQL and browser tests must)."""
    import pytest

    if os.environ.get("CI", "").lower() == "true":
        pytest.fail(f"the cluster tests cannot run: {why}", pytrace=False)
    pytest.skip(f"cluster tests: {why}")


def given_cluster() -> Cluster | None:
    kubeconfig, bin_dir = os.environ.get(KUBECONFIG_ENV), os.environ.get(BIN_ENV)
    if kubeconfig and bin_dir:
        return Cluster(kubeconfig=Path(kubeconfig), bin_dir=Path(bin_dir))
    return None


@contextmanager
def local_cluster(state_dir: Path) -> Iterator[Cluster]:
    """A cluster of this session's own (when no run started one), on free ports. Go builds
    it the first time; without Go (and nothing built yet) the tests say so in one line."""
    for _ in range(10):
        env = {
            **os.environ,
            "COHABIT_CLUSTER_DIR": str(state_dir),
            "COHABIT_CLUSTER_PORT": str(free_ports(6)),
        }
        up = subprocess.run(
            ["bash", str(CLUSTER_SCRIPT), "up"],
            env=env,
            capture_output=True,
            text=True,
            check=False,
        )
        if up.returncode != PORT_TAKEN:  # else someone took one of them: other ports
            break
    if up.returncode != 0:
        errors = [line for line in up.stderr.splitlines() if "error:" in line]
        unavailable(errors[-1].split("error: ", 1)[1] if errors else up.stderr[-3000:])
    try:
        kubeconfig = up.stdout.strip().splitlines()[-1].removeprefix("KUBECONFIG=")
        bin_dir = subprocess.run(
            ["bash", str(CLUSTER_SCRIPT), "bin"],
            env=env,
            capture_output=True,
            text=True,
            check=True,
        ).stdout.strip()
        yield Cluster(kubeconfig=Path(kubeconfig), bin_dir=Path(bin_dir))
    finally:
        subprocess.run(
            ["bash", str(CLUSTER_SCRIPT), "down"], env=env, capture_output=True, check=False
        )


def free_ports(count: int) -> int:
    """The first of `count` consecutive loopback ports nobody listens on, below the range
    the kernel hands out for outgoing connections (one of those could take a port between
    this check and the server's bind)."""
    low = _ephemeral_low()
    for _ in range(200):
        base = random.randrange(10000, low - count)
        if all(_free(base + i) for i in range(count)):
            return base
    raise RuntimeError(f"no {count} consecutive free ports below {low}")


def _ephemeral_low() -> int:
    """The first port of the kernel's ephemeral range (net.ipv4.ip_local_port_range)."""
    try:
        return int(Path("/proc/sys/net/ipv4/ip_local_port_range").read_text().split()[0])
    except (OSError, ValueError, IndexError):
        return 32768  # Linux's default


def _free(port: int) -> bool:
    with socket.socket() as probe:
        try:
            probe.bind(("127.0.0.1", port))
        except OSError:
            return False
    return True


def free_port() -> int:
    return free_ports(1)


def wait_for(check: Callable[[], T], *, what: str, timeout_s: float = WAIT_S) -> T:
    """Poll `check` until it returns something truthy; fail naming `what` after the timeout.
    Only conditions are waited for, never a fixed time."""
    deadline = time.monotonic() + timeout_s
    last: Any = None
    while True:
        try:
            last = check()
        except ApiException as error:  # e.g. a 404 before the object exists
            last = f"{error.status} {error.reason}"
            if error.status >= 500:
                raise
        else:
            if last:
                return last
        if time.monotonic() > deadline:
            raise AssertionError(
                f"timed out after {timeout_s:.0f} s waiting for {what} (last: {last!r})"
            )
        time.sleep(0.1)


def body(response: Any) -> Any:
    """A raw (`_preload_content=False`) response as JSON."""
    return json.loads(response.data or b"null")


def unique(prefix: str) -> str:
    return f"{prefix}-{uuid.uuid4().hex[:8]}"


# --- nodes -------------------------------------------------------------------------------


def kwok_node(
    name: str,
    *,
    labels: Mapping[str, str],
    capacity: Mapping[str, str],
    allocatable: Mapping[str, str] | None = None,
    group: str,
    managed_by_kwok: bool = True,
) -> dict[str, Any]:
    """A Node as a kubelet would register it (its status set on create, which the API
    server keeps), played by kwok when `managed_by_kwok`; otherwise nobody reports it
    Ready, as a node whose kubelet is down."""
    annotations = {KWOK_ANNOTATION: "fake"} if managed_by_kwok else {}
    return {
        "apiVersion": "v1",
        "kind": "Node",
        "metadata": {
            "name": name,
            "labels": {
                "kubernetes.io/hostname": name,
                "kubernetes.io/os": "linux",
                "kubernetes.io/arch": "amd64",
                "type": "kwok",
                GROUP_LABEL: group,
                **labels,
            },
            "annotations": annotations,
        },
        "status": {
            "capacity": {"cpu": "32", "memory": "256Gi", "pods": "110", **capacity},
            "allocatable": {
                "cpu": "32",
                "memory": "256Gi",
                "pods": "110",
                **(capacity if allocatable is None else allocatable),
            },
        },
    }


def node_ready(core: client.CoreV1Api, name: str) -> bool:
    """Ready, and the node lifecycle controller has lifted its not-ready taint."""
    node = core.read_node(name)
    ready = any(c.type == "Ready" and c.status == "True" for c in node.status.conditions or [])
    tainted = any(t.key == "node.kubernetes.io/not-ready" for t in node.spec.taints or [])
    return ready and not tainted


def _pointer(*parts: str) -> str:
    """A JSON pointer (RFC 6901): `~` and `/` inside a part escaped."""
    return "".join("/" + part.replace("~", "~0").replace("/", "~1") for part in parts)


def copy_capacity_to_allocatable(core: client.CoreV1Api, name: str, prefix: str) -> dict[str, str]:
    """What a kubelet does with extended resources a node status patch put in capacity
    (pkg/kubelet/nodestatus/setters.go `MachineInfo`: extended resources no longer in
    capacity leave allocatable, and allocatable follows capacity); kwok does not emulate
    this. Only resources named with `prefix` are touched. Returns what allocatable now has
    of them."""
    status = core.read_node_status(name).status
    capacity, allocatable = status.capacity or {}, status.allocatable or {}
    ours = {key: value for key, value in capacity.items() if key.startswith(prefix)}
    operations: list[dict[str, Any]] = [
        {"op": "add", "path": _pointer("status", "allocatable", key), "value": value}
        for key, value in ours.items()
        if allocatable.get(key) != value
    ]
    operations += [
        {"op": "remove", "path": _pointer("status", "allocatable", key)}
        for key in allocatable
        if key.startswith(prefix) and key not in capacity
    ]
    if operations:
        core.patch_node_status(name, operations)
    return ours


def extended(resource: str) -> bool:
    """An extended resource: a qualified name outside the kubernetes.io domain
    (pkg/apis/core/v1/helper/helpers.go `IsExtendedResourceName`)."""
    return (
        "/" in resource
        and "kubernetes.io/" not in resource
        and not resource.startswith("requests.")
    )


def restart_kubelet(core: client.CoreV1Api, name: str) -> None:
    """What a kubelet restart that finds its node recreated does to extended resources: every
    one zeroed in capacity and allocatable (pkg/kubelet/kubelet_node_status.go
    `reconcileExtendedResource`), sent as the real node status patch it is."""
    status = core.read_node_status(name).status
    operations = [
        {"op": "replace", "path": _pointer("status", field, key), "value": "0"}
        for field, values in (
            ("capacity", status.capacity or {}),
            ("allocatable", status.allocatable or {}),
        )
        for key in values
        if extended(key)
    ]
    if operations:
        core.patch_node_status(name, operations)


def ours(found: Mapping[str, str] | None) -> dict[str, str]:
    """The `cohabit.dev/` entries of a node's labels, annotations, capacity or allocatable."""
    return {k: v for k, v in (found or {}).items() if k.startswith("cohabit.dev/")}


# --- identities --------------------------------------------------------------------------


def token_kubeconfig(cluster: Cluster, namespace: str, service_account: str, path: Path) -> Path:
    """A kubeconfig holding a token for `service_account` from the TokenRequest API, as
    the kubelet projects one into the chart's pods."""
    core = client.CoreV1Api(cluster.api())
    request = client.AuthenticationV1TokenRequest(
        spec=client.V1TokenRequestSpec(audiences=[], expiration_seconds=3600)
    )
    token = core.create_namespaced_service_account_token(
        service_account, namespace, request
    ).status.token
    server, ca = cluster.server()
    document = {
        "apiVersion": "v1",
        "kind": "Config",
        "clusters": [
            {
                "name": "cohabit-test",
                "cluster": {
                    "server": server,
                    "certificate-authority-data": base64.b64encode(ca.encode()).decode(),
                },
            }
        ],
        "users": [{"name": service_account, "user": {"token": token}}],
        "contexts": [
            {
                "name": service_account,
                "context": {"cluster": "cohabit-test", "user": service_account},
            }
        ],
        "current-context": service_account,
    }
    path.write_text(yaml.safe_dump(document))
    return path


def allowed(
    cluster: Cluster,
    kubeconfig: Path,
    verb: str,
    resource: str,
    namespace: str = "",
    *,
    subresource: str = "",
) -> bool:
    """`kubectl auth can-i` for the identity in `kubeconfig` (a SelfSubjectAccessReview).
    `resource` may name one object (`nodes/edge-1`); a subresource is given apart."""
    args = ["auth", "can-i", verb, resource]
    if namespace:
        args += ["-n", namespace]
    if subresource:
        args += ["--subresource", subresource]
    result = subprocess.run(
        [str(cluster.bin_dir / "kubectl"), "--kubeconfig", str(kubeconfig), *args],
        capture_output=True,
        text=True,
        timeout=60,
        check=False,
    )
    return result.stdout.strip() == "yes"


# --- the chart's processes, on this machine ------------------------------------------------


def container_env(
    container: Mapping[str, Any],
    *,
    namespace: str,
    node_name: str | None = None,
    secrets: Mapping[str, Mapping[str, str]] | None = None,
) -> dict[str, str]:
    """A container's environment as the kubelet resolves it: literal values, the field
    references the chart uses (the pod's namespace, its node's name), and `secretKeyRef`s
    from `secrets` (name -> decoded data, see `secret_data`); a missing Secret or key fails
    as the kubelet refuses to start such a container (CreateContainerConfigError), unless
    the reference is optional."""
    env: dict[str, str] = {}
    for entry in container.get("env") or []:
        if "valueFrom" not in entry:  # `value: ""` is stored without its value, as unset
            env[entry["name"]] = str(entry.get("value", ""))
            continue
        source = entry.get("valueFrom") or {}
        field = (source.get("fieldRef") or {}).get("fieldPath")
        if field == "metadata.namespace":
            env[entry["name"]] = namespace
        elif field == "spec.nodeName" and node_name is not None:
            env[entry["name"]] = node_name
        elif (ref := source.get("secretKeyRef")) is not None:
            value = (secrets or {}).get(ref["name"], {}).get(ref["key"])
            if value is not None:
                env[entry["name"]] = value
            elif not ref.get("optional"):
                raise AssertionError(f"secret {ref['name']!r} has no key {ref['key']!r}")
    return env


def secret_data(
    cluster: Cluster, namespace: str, names: Sequence[str]
) -> dict[str, dict[str, str]]:
    """The Secrets `names` of `namespace`, decoded, read as the kubelet reads them for the
    pods it starts (those that do not exist are left out)."""
    core = client.CoreV1Api(cluster.api())
    found: dict[str, dict[str, str]] = {}
    for name in names:
        try:
            secret = core.read_namespaced_secret(name, namespace)
        except ApiException as error:
            if error.status != 404:
                raise
            continue
        found[name] = {k: base64.b64decode(v).decode() for k, v in (secret.data or {}).items()}
    return found


def create_secret(cluster: Cluster, namespace: str, name: str, data: Mapping[str, str]) -> None:
    client.CoreV1Api(cluster.api()).create_namespaced_secret(
        namespace, {"metadata": {"name": name}, "stringData": dict(data)}
    )


def empty_dirs(
    workload: Mapping[str, Any], container: Mapping[str, Any], folder: Path
) -> dict[str, Path]:
    """mountPath -> a folder here, for each emptyDir the container mounts: what the kubelet
    gives a pod as a fresh directory (the chart's API keeps scratch files there)."""
    volumes = {v["name"]: v for v in workload["spec"]["template"]["spec"].get("volumes") or []}
    mounts: dict[str, Path] = {}
    for mount in container.get("volumeMounts") or []:
        if "emptyDir" in volumes.get(mount["name"], {}):
            local = folder / f"emptydir-{mount['name']}"
            local.mkdir(parents=True, exist_ok=True)
            mounts[mount["mountPath"]] = local
    return mounts


@dataclass
class HostProcess:
    """One of the chart's programs run here as a process; its output in `log`."""

    name: str
    process: subprocess.Popen[bytes]
    log: Path

    def output(self) -> str:
        return self.log.read_text(errors="replace") if self.log.exists() else ""

    def alive(self) -> bool:
        return self.process.poll() is None

    def wait_for(self, check: Callable[[], T], *, what: str, timeout_s: float = WAIT_S) -> T:
        """`wait_for`, failing at once with the process's output should it exit first."""
        found = wait_for(
            lambda: check() or (not self.alive() and "exited"), what=what, timeout_s=timeout_s
        )
        if found == "exited" and not self.alive():
            raise AssertionError(
                f"{self.name} exited ({self.process.returncode}) before {what}:\n"
                f"{self.output()[-3000:]}"
            )
        return found

    def exited(self, *, timeout_s: float = WAIT_S) -> int:
        """Wait for the process to end by itself; its exit status."""
        return self.process.wait(timeout_s)

    def stop(self) -> None:
        if self.process.poll() is None:
            self.process.terminate()
            try:
                self.process.wait(20)
            except subprocess.TimeoutExpired:
                self.process.kill()
                self.process.wait(10)


def start_process(
    name: str, argv: Sequence[str], *, env: Mapping[str, str], kubeconfig: Path, log_dir: Path
) -> HostProcess:
    """Start `python ARGV` with only the environment given, the kubeconfig and what Python
    needs; the chart's pod would see the same variables. Its temporary files go under
    `log_dir`: the Kubernetes client writes the kubeconfig's CA to one and removes it only
    at a clean exit."""
    log = log_dir / f"{name}.log"
    environment = {
        "PATH": os.environ.get("PATH", "/usr/bin:/bin"),
        "HOME": os.environ.get("HOME", "/tmp"),
        "TMPDIR": str(log_dir),
        "KUBECONFIG": str(kubeconfig),
        "PYTHONUNBUFFERED": "1",
        **({"PYTHONPATH": os.environ["PYTHONPATH"]} if os.environ.get("PYTHONPATH") else {}),
        **env,
    }
    handle = log.open("wb")
    process = subprocess.Popen(
        [sys.executable, *argv], env=environment, stdout=handle, stderr=subprocess.STDOUT
    )
    handle.close()
    return HostProcess(name=name, process=process, log=log)


# --- ModelDeployments ---------------------------------------------------------------------


def model_deployment(name: str, namespace: str, **spec: Any) -> dict[str, Any]:
    """A ModelDeployment as a user writes one (llama.cpp unless `engine` says otherwise)."""
    return {
        "apiVersion": "cohabit.dev/v1alpha1",
        "kind": "ModelDeployment",
        "metadata": {"name": name, "namespace": namespace},
        "spec": {"engine": "llamacpp", **spec},
    }


def apply(api: client.ApiClient, doc: dict[str, Any]) -> None:
    """Create it as `kubectl apply` does: unknown fields refused."""
    client.CustomObjectsApi(api).create_namespaced_custom_object(
        "cohabit.dev",
        "v1alpha1",
        doc["metadata"]["namespace"],
        "modeldeployments",
        doc,
        field_validation="Strict",
    )


def status_of(api: client.ApiClient, namespace: str, name: str) -> dict[str, Any]:
    found = client.CustomObjectsApi(api).get_namespaced_custom_object(
        "cohabit.dev", "v1alpha1", namespace, "modeldeployments", name
    )
    return dict(found.get("status") or {})


def phase(
    api: client.ApiClient, namespace: str, name: str, *wanted: str, timeout_s: float = WAIT_S
) -> dict[str, Any]:
    """Wait until the ModelDeployment's phase is one of `wanted`; its status."""
    return wait_for(
        lambda: (s := status_of(api, namespace, name)).get("phase") in wanted and s,
        what=f"{name} to reach {' or '.join(wanted)}",
        timeout_s=timeout_s,
    )


def pod_json(api: client.ApiClient, namespace: str, name: str) -> dict[str, Any]:
    """A pod as `kubectl get pod -o json` shows it (wire JSON, camelCase)."""
    found: dict[str, Any] = body(
        client.CoreV1Api(api).read_namespaced_pod(name, namespace, _preload_content=False)
    )
    return found


def plain_pod(
    name: str, namespace: str, *, hostname: str, resources: Mapping[str, str]
) -> dict[str, Any]:
    """A pod that is not cohabit's (no annotation or label of ours) kept to one node by a
    nodeSelector, asking for `resources` with requests == limits, as the API server requires
    of extended resources (pkg/apis/core/validation: they cannot be overcommitted)."""
    return {
        "apiVersion": "v1",
        "kind": "Pod",
        "metadata": {"name": name, "namespace": namespace},
        "spec": {
            "nodeSelector": {"kubernetes.io/hostname": hostname},
            "containers": [
                {
                    "name": "main",
                    "image": "registry.k8s.io/pause:3.10",
                    "resources": {"requests": dict(resources), "limits": dict(resources)},
                }
            ],
        },
    }


def unschedulable_message(api: client.ApiClient, namespace: str, name: str) -> str:
    """Wait until the scheduler has refused the pod (PodScheduled=False, reason
    Unschedulable: pkg/scheduler/schedule_one.go); the condition's message, the scheduler's
    FitError ("0/N nodes are available: ...", pkg/scheduler/framework/types.go)."""

    def refusal() -> str:
        conditions = (pod_json(api, namespace, name).get("status") or {}).get("conditions")
        for condition in conditions or []:
            if (condition.get("type"), condition.get("reason")) == (
                "PodScheduled",
                "Unschedulable",
            ):
                return str(condition.get("message") or "")
        return ""

    return wait_for(refusal, what=f"the scheduler to refuse pod {name}")


def bound_node(api: client.ApiClient, namespace: str, name: str) -> str:
    """Wait until the scheduler has bound the pod and kwok reports it Running; its node."""

    def bound() -> str:
        pod = pod_json(api, namespace, name)
        running = (pod.get("status") or {}).get("phase") == "Running"
        return str(pod["spec"].get("nodeName") or "") if running else ""

    return wait_for(bound, what=f"pod {name} to be bound and running")


# Phases a ModelDeployment rests in once the operator has decided (placed and serving, or
# refused); the model file every test deployment names (no container runs to read it).
SETTLED = ("DEPLOYED", "FAILED", "ERROR")
MODEL = "/models/m.gguf"


def deploy(api: client.ApiClient, namespace: str, name: str, **spec: Any) -> dict[str, Any]:
    """Create a ModelDeployment and wait until it is placed and serving, or refused."""
    apply(api, model_deployment(name, namespace, model=MODEL, **spec))
    return phase(api, namespace, name, *SETTLED)


def engine_requests(api: client.ApiClient, namespace: str, name: str) -> dict[str, str]:
    """What the engine pod asks the scheduler for, host cpu/memory included."""
    pod = pod_json(api, namespace, f"{name}-engine")
    (container,) = pod["spec"]["containers"]
    resources = container["resources"]
    # Extended resources are not overcommitable: the API server refuses requests != limits.
    devices = {k: v for k, v in resources["requests"].items() if k not in ("cpu", "memory")}
    assert devices == {k: v for k, v in resources["limits"].items() if k in devices}
    return dict(resources["requests"])


def host_and(devices: dict[str, str]) -> dict[str, str]:
    """The engine pod's requests: the chart's host cpu/memory beside its devices."""
    return {**DEFAULT_ENGINE_RESOURCES["requests"], **devices}


def served_on(api: client.ApiClient, namespace: str, name: str) -> str:
    """The node the real scheduler bound the engine pod to (kwok then runs it)."""
    pod = pod_json(api, namespace, f"{name}-engine")
    assert pod["status"]["phase"] == "Running", pod["status"]
    return str(pod["spec"]["nodeName"])


def no_engine_pod(api: client.ApiClient, namespace: str, name: str) -> bool:
    pods = client.CoreV1Api(api).list_namespaced_pod(
        namespace, label_selector=f"cohabit.dev/model-deployment={name}"
    )
    return not pods.items


def refused(status: dict[str, Any], reason: str, *, permanent: bool) -> str:
    """Check a refusal cohabit made itself ("0/N nodes fit", the planner's sentence; the
    scheduler says "nodes are available"); its one-line message after the reason."""
    assert status["phase"] == "FAILED", status
    assert status["lastErrorCode"] == "NoFitError", status
    assert status["noFit"]["reason"] == reason, status
    assert status["noFit"]["permanent"] is permanent, status
    message = str(status["lastErrorMessage"])
    assert message.startswith(f"{reason}: 0/"), message
    assert " nodes fit: " in message, message
    return message.removeprefix(f"{reason}: ")


# kopf's record of the last body its handlers finished with (AnnotationsDiffBaseStorage under
# the operator's prefix, kopf/_cogs/configs/diffbase.py): it holds the object's annotations,
# so a test annotation found there proves the operator has handled that change.
LAST_HANDLED = "kopf.cohabit.dev/last-handled-configuration"
POKE = "cohabit-test/poke"
# What a test puts on a pod to hold it in Terminating: kwok, like a kubelet, removes a pod
# being deleted only once it has no finalizers left (scripts/kwok-stages.yaml, pod-gone).
HOLD = "cohabit-test/hold"


def get_model_deployment(api: client.ApiClient, namespace: str, name: str) -> dict[str, Any] | None:
    try:
        found: dict[str, Any] = client.CustomObjectsApi(api).get_namespaced_custom_object(
            crd.GROUP, crd.VERSION, namespace, crd.PLURAL, name
        )
    except ApiException as error:
        if error.status == 404:
            return None
        raise
    return found


def patch_model_deployment(
    api: client.ApiClient, namespace: str, name: str, patch: dict[str, Any]
) -> None:
    """A merge patch of the object (a spec change bumps its generation)."""
    client.CustomObjectsApi(api).patch_namespaced_custom_object(
        crd.GROUP, crd.VERSION, namespace, crd.PLURAL, name, patch
    )


def delete_model_deployment(api: client.ApiClient, namespace: str, name: str) -> None:
    client.CustomObjectsApi(api).delete_namespaced_custom_object(
        crd.GROUP, crd.VERSION, namespace, crd.PLURAL, name
    )


def ready_reason(status: Mapping[str, Any]) -> str | None:
    """The reason of the status's Ready condition."""
    for found in status.get("conditions") or []:
        if found.get("type") == crd.READY:
            return str(found.get("reason"))
    return None


def poke(api: client.ApiClient, namespace: str, name: str) -> None:
    """Change the ModelDeployment's annotations (kopf runs its update handler) and wait until
    the operator has handled that change: a way to know a reconcile ran, without sleeping."""
    token = uuid.uuid4().hex
    patch_model_deployment(api, namespace, name, {"metadata": {"annotations": {POKE: token}}})

    def handled() -> bool:
        meta = (get_model_deployment(api, namespace, name) or {}).get("metadata") or {}
        return token in (meta.get("annotations") or {}).get(LAST_HANDLED, "")

    wait_for(handled, what=f"the operator to handle a change of {name}")


def pods(api: client.ApiClient, namespace: str) -> dict[str, dict[str, Any]]:
    """The namespace's pods by name, as wire JSON."""
    found = body(client.CoreV1Api(api).list_namespaced_pod(namespace, _preload_content=False))
    return {pod["metadata"]["name"]: pod for pod in found.get("items") or []}


def engine_pod(api: client.ApiClient, namespace: str, name: str) -> dict[str, Any] | None:
    """The engine pod of ModelDeployment `name` (None: there is none)."""
    return pods(api, namespace).get(f"{name}-engine")


@contextmanager
def held(api: client.ApiClient, namespace: str, pod: str) -> Iterator[None]:
    """Hold `pod` in Terminating once it is deleted (a finalizer of the test's), released
    on exit if the test did not release it itself."""
    core = client.CoreV1Api(api)
    core.patch_namespaced_pod(pod, namespace, {"metadata": {"finalizers": [HOLD]}})
    try:
        yield
    finally:
        unhold(api, namespace, pod)


def unhold(api: client.ApiClient, namespace: str, pod: str) -> None:
    """Remove the test's finalizer from `pod` (a JSON patch of the whole list, so another
    finalizer is kept), if the pod is still there."""
    core = client.CoreV1Api(api)
    try:
        found = core.read_namespaced_pod(pod, namespace)
    except ApiException as error:
        if error.status == 404:
            return
        raise
    remaining = [f for f in found.metadata.finalizers or [] if f != HOLD]
    core.patch_namespaced_pod(
        pod, namespace, [{"op": "replace", "path": "/metadata/finalizers", "value": remaining}]
    )


def set_quota(api: client.ApiClient, namespace: str, hard: dict[str, str]) -> None:
    """Create or replace the namespace's compute quota, and wait until the quota controller
    has counted its use: until then the ResourceQuota admission plugin refuses every pod
    ("status unknown for quota", k8s.io/apiserver pkg/admission/plugin/resourcequota/
    controller.go)."""
    core = client.CoreV1Api(api)
    body = {"metadata": {"name": "compute"}, "spec": {"hard": hard}}
    try:
        core.replace_namespaced_resource_quota("compute", namespace, body)
    except client.exceptions.ApiException as error:
        if error.status != 404:
            raise
        core.create_namespaced_resource_quota(namespace, body)

    def counted() -> bool:
        status = core.read_namespaced_resource_quota("compute", namespace).status
        return status.hard == hard and set(status.used or {}) == set(hard)

    wait_for(counted, what="the quota controller to count the namespace's use")


def enforce_pod_security(api: client.ApiClient, namespace: str, profile: str) -> None:
    """Have the PodSecurity admission plugin enforce `profile` in the namespace (its label,
    k8s.io/pod-security-admission api/constants.go)."""
    labels = {"pod-security.kubernetes.io/enforce": profile}
    client.CoreV1Api(api).patch_namespace(namespace, {"metadata": {"labels": labels}})


# --- the chart -----------------------------------------------------------------------------


@dataclass(frozen=True, slots=True)
class Release:
    """One `helm install` of the chart. Its full name is the release name (it contains the
    chart's), so its objects are `<name>-operator`, `<name>-agent`, ..."""

    cluster: Cluster
    name: str
    namespace: str

    def workload(self, kind: str, component: str) -> dict[str, Any]:
        """The installed Deployment or DaemonSet of a component, as the API server has it."""
        apps = client.AppsV1Api(self.cluster.api())
        name = f"{self.name}-{component}"
        if kind == "DaemonSet":
            found = apps.read_namespaced_daemon_set(name, self.namespace, _preload_content=False)
        else:
            found = apps.read_namespaced_deployment(name, self.namespace, _preload_content=False)
        document: dict[str, Any] = body(found)
        return document

    def container(self, kind: str, component: str) -> dict[str, Any]:
        (container,) = self.workload(kind, component)["spec"]["template"]["spec"]["containers"]
        return dict(container)

    def kubeconfig(self, kind: str, component: str, folder: Path) -> Path:
        """A kubeconfig for the ServiceAccount the component's pods run as."""
        account = self.workload(kind, component)["spec"]["template"]["spec"]["serviceAccountName"]
        return token_kubeconfig(
            self.cluster, self.namespace, account, folder / f"{component}.kubeconfig"
        )

    def upgrade(self, values: Mapping[str, Any], folder: Path) -> None:
        """`helm upgrade` to these values (the whole set, as a new values file)."""
        values_file = folder / f"{self.name}-values-upgrade.yaml"
        values_file.write_text(yaml.safe_dump(dict(values)))
        self.cluster.run(
            "helm", "upgrade", self.name, str(CHART), "-n", self.namespace, "-f", str(values_file)
        )

    def uninstall(self, *, wait: bool = True) -> None:
        args = ["uninstall", self.name, "-n", self.namespace, "--ignore-not-found"]
        if wait:
            args += ["--wait", "--timeout", "2m"]
        self.cluster.run("helm", *args)


def install(
    cluster: Cluster,
    namespace: str,
    values: Mapping[str, Any],
    folder: Path,
    *,
    name: str | None = None,
    crds: bool = False,
) -> Release:
    """`helm install` of the chart into `namespace` with these values (a values file, as a
    user writes one). The release is named after the namespace unless `name` is given:
    its ClusterRoles are cluster-wide, named after the release. The CRD is cluster-wide and
    shared by every test, applied once per run (`apply_crd`), so installs skip it unless
    `crds`: Helm 4 server-side-applies a chart's CRD and fails on a conflict with the
    field manager that applied another version of it."""
    name = name or f"cohabit-{namespace.removeprefix('t-')}"
    values_file = folder / f"{name}-values.yaml"
    values_file.write_text(yaml.safe_dump(dict(values)))
    args = ["install", name, str(CHART), "-n", namespace, "-f", str(values_file)]
    if not crds:
        args.append("--skip-crds")
    cluster.run("helm", *args)
    return Release(cluster=cluster, name=name, namespace=namespace)


def apply_crd(cluster: Cluster) -> None:
    """The chart's CRD as an administrator applies it (`docs/kubernetes.md`), taking over
    fields another version of it set, and waited for until the API server serves it."""
    path = CHART / "crds" / "modeldeployments.cohabit.dev.yaml"
    cluster.run("kubectl", "apply", "--server-side", "--force-conflicts", "-f", str(path))
    cluster.run(
        "kubectl",
        "wait",
        "--for=condition=Established",
        "--timeout=60s",
        "crd/modeldeployments.cohabit.dev",
    )


# The values that make an install managed (a cluster someone else runs, the GPU Operator's).
MANAGED = {"mode": "managed"}


def values_for(namespace: str, **more: Any) -> dict[str, Any]:
    """Values every test install gets: placement and the agent kept on the test's own nodes,
    and the operator serving the test's namespace alone (cluster-wide it would serve every
    test's ModelDeployments). A mapping in `more` is merged into the one given here."""
    values: dict[str, Any] = {
        "placement": {"nodeSelector": {GROUP_LABEL: namespace}},
        "operator": {"watchNamespace": namespace},
        # The agent's DaemonSet on the test's nodes alone, not one pod on every test's.
        "agent": {"nodeSelector": {GROUP_LABEL: namespace}},
    }
    for key, value in more.items():
        if isinstance(value, dict) and isinstance(values.get(key), dict):
            values[key] = {**values[key], **value}
        else:
            values[key] = value
    return values


def run_operator(
    release: Release, folder: Path, *, kubeconfig: Path | None = None, **env: str
) -> HostProcess:
    """The chart's operator as a process here: the installed Deployment's command and
    environment, its ServiceAccount's token (`kubeconfig`: another identity's), and a
    loopback port for kopf's liveness endpoint (ready once the operator has started)."""
    container = release.container("Deployment", "operator")
    command = list(container["command"])
    assert command[:2] == ["python", "-m"], command
    health = free_port()
    environment = {
        **container_env(container, namespace=release.namespace),
        "COHABIT_LIVENESS_ENDPOINT": f"http://127.0.0.1:{health}/healthz",
        **env,
    }
    process = start_process(
        f"{release.name}-operator",
        command[1:],
        env=environment,
        kubeconfig=kubeconfig or release.kubeconfig("Deployment", "operator", folder),
        log_dir=folder,
    )
    wait_for(
        lambda: _answers(f"http://127.0.0.1:{health}/healthz") or not process.alive(),
        what="the operator's liveness endpoint",
    )
    if not process.alive():
        raise AssertionError(f"the operator exited:\n{process.output()[-3000:]}")
    return process


def run_agent(release: Release, folder: Path, node: str, *args: str) -> HostProcess:
    """The chart's node agent as a process here, as its DaemonSet's pod on `node` runs it:
    the installed DaemonSet's command, arguments and environment (NODE_NAME from
    spec.nodeName), its ServiceAccount's token. `args` follow the chart's: `--fleet FILE`
    gives it the node's hardware, which no GPU here could."""
    container = release.container("DaemonSet", "agent")
    command = list(container["command"])
    assert command[:2] == ["python", "-m"], command
    return start_process(
        f"{release.name}-agent-{node}",
        [*command[1:], *container.get("args", []), *args],
        env=container_env(container, namespace=release.namespace, node_name=node),
        kubeconfig=agent_kubeconfig(release, folder),
        log_dir=folder,
    )


def agent_kubeconfig(release: Release, folder: Path) -> Path:
    """A kubeconfig for the chart's agent ServiceAccount, once its role is in effect: the
    API server's authorizer learns RBAC objects by watch, a moment after `helm install`
    (the DaemonSet's pod would be restarted until then; a test would see a 403)."""
    kubeconfig = release.kubeconfig("DaemonSet", "agent", folder)
    wait_for(
        lambda: allowed(release.cluster, kubeconfig, "patch", "nodes"),
        what="the agent's role to be in effect",
    )
    return kubeconfig


def agent_port(release: Release, folder: Path) -> CountedNodePort:
    """The agent's adapter in this process, authenticated as the chart's agent
    ServiceAccount, as its pod would be."""
    kubeconfig = agent_kubeconfig(release, folder)
    return CountedNodePort(config.new_client_from_config(str(kubeconfig)))


class CountedNodePort(NodePort):
    """The real NodePort, the name of each call made through it written down in `calls`
    (a spy at the seam: the API server cannot be asked how often it was called)."""

    def __init__(self, api: client.ApiClient) -> None:
        super().__init__(api)
        self.calls: list[str] = []

    def get_node(self, name: str) -> dict[str, Any]:
        self.calls.append("get_node")
        return super().get_node(name)

    def list_pods_on(self, node: str) -> list[dict[str, Any]]:
        self.calls.append("list_pods_on")
        return super().list_pods_on(node)

    def patch_labels(
        self,
        name: str,
        labels: Mapping[str, str | None],
        annotations: Mapping[str, str | None] | None = None,
    ) -> None:
        self.calls.append("patch_labels")
        super().patch_labels(name, labels, annotations)

    def patch_capacity(self, name: str, operations: list[dict[str, Any]]) -> None:
        self.calls.append("patch_capacity")
        super().patch_capacity(name, operations)


@dataclass
class ApiServer:
    """The chart's API as a process here, and the URL of its REST API (…/api)."""

    process: HostProcess
    url: str


def run_api(release: Release, folder: Path, **env: str) -> ApiServer:
    """The chart's API Deployment (`api.enabled`) as a process here: its command with only
    the listen address and port replaced (127.0.0.1 and a free port), its environment with
    the Secrets it names resolved, its emptyDir mounts as folders here, and a token of its
    ServiceAccount; ready once its readiness probe's path answers. `env`: more variables."""
    workload = release.workload("Deployment", "api")
    (container,) = workload["spec"]["template"]["spec"]["containers"]
    command = [str(part) for part in container["command"]]
    assert command[:2] == ["cohabit", "serve"], command
    port = free_port()
    for flag, value in (("--host", "127.0.0.1"), ("--port", str(port))):
        command[command.index(flag) + 1] = value
    names = [
        ref["name"]
        for entry in container.get("env") or []
        if (ref := (entry.get("valueFrom") or {}).get("secretKeyRef")) is not None
    ]
    environment = container_env(
        container,
        namespace=release.namespace,
        secrets=secret_data(release.cluster, release.namespace, names),
    )
    for mount, local in empty_dirs(workload, container, folder).items():
        environment = {
            key: str(local) + value.removeprefix(mount) if value.startswith(mount) else value
            for key, value in environment.items()
        }
    process = start_process(
        f"{release.name}-api",
        ["-m", "cohabit", *command[1:]],
        env={**environment, **env},
        kubeconfig=release.kubeconfig("Deployment", "api", folder),
        log_dir=folder,
    )
    url = f"http://127.0.0.1:{port}"
    probe = container["readinessProbe"]["httpGet"]["path"]
    wait_for(
        lambda: _answers(url + probe) or not process.alive(),
        what="the API's readiness probe",
    )
    if not process.alive():
        raise AssertionError(f"the API exited:\n{process.output()[-3000:]}")
    return ApiServer(process=process, url=f"{url}/api")


def _answers(url: str) -> bool:
    import urllib.request

    try:
        with urllib.request.urlopen(url, timeout=2) as response:
            return bool(response.status == 200)
    except OSError:
        return False
