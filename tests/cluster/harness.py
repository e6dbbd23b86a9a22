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
import shutil
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

ROOT = Path(__file__).resolve().parents[2]
CLUSTER_SCRIPT = ROOT / "scripts" / "cluster.sh"
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
    """A cluster of this session's own (when no run started one), on free ports."""
    if shutil.which("go") is None:
        unavailable("Go is not installed, and the control plane is built with it")
    env = {
        **os.environ,
        "COHABIT_CLUSTER_DIR": str(state_dir),
        "COHABIT_CLUSTER_PORT": str(free_ports(6)),
    }
    up = subprocess.run(
        ["bash", str(CLUSTER_SCRIPT), "up"], env=env, capture_output=True, text=True, check=False
    )
    if up.returncode != 0:
        unavailable(f"scripts/cluster.sh up failed:\n{up.stderr[-3000:]}")
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
    """The first of `count` consecutive loopback ports nobody listens on."""
    for _ in range(100):
        with socket.socket() as probe:
            probe.bind(("127.0.0.1", 0))
            base = probe.getsockname()[1]
        if base + count < 65000 and all(_free(base + i) for i in range(count)):
            return base
    raise RuntimeError(f"no {count} consecutive free ports")


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


def copy_capacity_to_allocatable(core: client.CoreV1Api, name: str, prefix: str) -> dict[str, str]:
    """What a kubelet does with extended resources a node status patch put in capacity:
    allocatable follows it (kwok does not emulate this). Returns what was copied."""
    capacity = core.read_node_status(name).status.capacity or {}
    ours = {key: value for key, value in capacity.items() if key.startswith(prefix)}
    if ours:
        operations = [
            {
                "op": "add",
                "path": "/status/allocatable/" + key.replace("~", "~0").replace("/", "~1"),
                "value": value,
            }
            for key, value in ours.items()
        ]
        core.patch_node_status(name, operations)
    return ours


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
    cluster: Cluster, kubeconfig: Path, verb: str, resource: str, namespace: str = ""
) -> bool:
    """`kubectl auth can-i` for the identity in `kubeconfig` (a SelfSubjectAccessReview)."""
    args = ["auth", "can-i", verb, resource]
    if namespace:
        args += ["-n", namespace]
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
        if "value" in entry:
            env[entry["name"]] = str(entry["value"])
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
    needs; the chart's pod would see the same variables."""
    log = log_dir / f"{name}.log"
    environment = {
        "PATH": os.environ.get("PATH", "/usr/bin:/bin"),
        "HOME": os.environ.get("HOME", "/tmp"),
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
    crds: bool = True,
) -> Release:
    """`helm install` of the chart into `namespace` with these values (a values file, as a
    user writes one). The release is named after the namespace unless `name` is given:
    its ClusterRoles are cluster-wide, named after the release."""
    name = name or f"cohabit-{namespace.removeprefix('t-')}"
    values_file = folder / f"{name}-values.yaml"
    values_file.write_text(yaml.safe_dump(dict(values)))
    args = ["install", name, str(CHART), "-n", namespace, "-f", str(values_file)]
    if not crds:
        args.append("--skip-crds")
    cluster.run("helm", *args)
    return Release(cluster=cluster, name=name, namespace=namespace)


def values_for(namespace: str, **more: Any) -> dict[str, Any]:
    """Values every test install gets: placement kept on the test's own nodes, and the
    operator serving the test's namespace alone (cluster-wide it would serve every test's
    ModelDeployments)."""
    values: dict[str, Any] = {
        "placement": {"nodeSelector": {GROUP_LABEL: namespace}},
        "operator": {"watchNamespace": namespace},
    }
    for key, value in more.items():
        if isinstance(value, dict) and isinstance(values.get(key), dict):
            values[key] = {**values[key], **value}
        else:
            values[key] = value
    return values


def run_operator(release: Release, folder: Path, **env: str) -> HostProcess:
    """The chart's operator as a process here: the installed Deployment's command and
    environment, its ServiceAccount's token, and a loopback port for kopf's liveness
    endpoint (ready once the operator has started)."""
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
        kubeconfig=release.kubeconfig("Deployment", "operator", folder),
        log_dir=folder,
    )
    wait_for(
        lambda: _answers(f"http://127.0.0.1:{health}/healthz") or not process.alive(),
        what="the operator's liveness endpoint",
    )
    if not process.alive():
        raise AssertionError(f"the operator exited:\n{process.output()[-3000:]}")
    return process


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
