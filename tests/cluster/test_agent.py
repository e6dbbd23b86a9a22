"""The node agent on the real API server, as the chart runs it and as the chart's role lets it.

Layers: the agent runs here as a process (`harness.run_agent`: the installed DaemonSet's
command, arguments and environment, authenticated with a TokenRequest token of the chart's
agent ServiceAccount, so a missing permission is a real 403), or in this process where a
test counts its calls (`NodeAgent` over the real `NodePort`, same token). Its node is one of
kwok's: the real API server validates every label, annotation and status patch the agent
sends. kwok plays no kubelet's part in extended resources, so the harness does what a
kubelet does with them (copy capacity to allocatable; zero them on a restart), each as the
real node status patch it is. The budget backend is the status patch: the device-plugin
backend needs a kubelet's gRPC socket, and is tested against a fake kubelet in
tests/kube/test_agent.py.

The hardware is the recorded boundary: no GPU is here, so the agent gets a fleet file
(`--fleet`) exported from the Node that discovery makes of recorded NVML answers
(inventory.py), and its memory report is off with it. The one agent run on this machine's
own hardware (real discovery, a CPU pool) also writes its memory report.
"""

from __future__ import annotations

from collections.abc import Iterator
from dataclasses import replace
from pathlib import Path
from typing import Any

import pytest
from kubernetes import client

from cohabit.hardware.amd import discover_amd
from cohabit.hardware.errors import DiscoveryError
from cohabit.hardware.host import read_host_memory
from cohabit.hardware.labels import annotations_for_node, labels_for_node
from cohabit.hardware.model import Node
from cohabit.hardware.nvidia import discover_nvidia
from cohabit.kube import crd
from cohabit.kube.agent import NodeAgent, StatusPatchAdvertiser, budgets_for_node
from cohabit.kube.nodememory import ANNOTATION_MEMORY, report_from_annotation
from tests.cluster.conftest import Nodes, Releases
from tests.cluster.harness import (
    Cluster,
    HostProcess,
    Release,
    agent_kubeconfig,
    agent_port,
    allowed,
    apply,
    copy_capacity_to_allocatable,
    kwok_node,
    model_deployment,
    ours,
    phase,
    restart_kubelet,
    run_agent,
    run_operator,
    values_for,
    wait_for,
)
from tests.cluster.inventory import discovered, fleet_file, recording
from tests.hardware import fakes

PREFIX = "cohabit.dev/"
BUDGETS = {f"cohabit.dev/vram-gb-gpu-{i}": "15" for i in range(4)}
WHOLE = {f"cohabit.dev/gpu-{i}": "1" for i in range(4)}
# The agent as the unprivileged install runs it, checking its node every second; the memory
# report off, as nothing is measured on a fleet file's hardware.
STATUS_PATCH = {
    "budgetBackend": "status-patch",
    "intervalSeconds": 1,
    "meter": {"intervalSeconds": 0},
}


def node_of(api: client.ApiClient, name: str) -> Any:
    return client.CoreV1Api(api).read_node(name)


def capacity_is(api: client.ApiClient, name: str, wanted: dict[str, str]) -> bool:
    return ours(node_of(api, name).status.capacity) == wanted


@pytest.fixture
def status_patch(namespace: str, releases: Releases) -> Release:
    return releases.install(values_for(namespace, agent=STATUS_PATCH))


@pytest.fixture
def agents() -> Iterator[list[HostProcess]]:
    """The agents a test started; stopped afterwards."""
    started: list[HostProcess] = []
    yield started
    for process in started:
        process.stop()


def start_agent(
    agents: list[HostProcess], release: Release, folder: Path, node: str, *args: str
) -> HostProcess:
    """The chart's agent for `node`, stopped when the test ends."""
    process = run_agent(release, folder, node, *args)
    agents.append(process)
    return process


def t4_box(folder: Path, node: str, *, cards: int | None = None) -> Path:
    """The fleet file of the recorded 4 x T4 box (or its first `cards` cards), as `node`."""
    return fleet_file(folder, discovered(node, recording(cards=cards)))


# --- labels, annotations and budgets --------------------------------------------------------


def test_the_agent_labels_its_node_annotates_its_devices_and_publishes_its_budgets(
    api: client.ApiClient,
    nodes: Nodes,
    status_patch: Release,
    agents: list[HostProcess],
    tmp_path: Path,
) -> None:
    """Our labels set and the stale ones of ours removed (another card's memory, a UUID of a
    card gone), everyone else's kept; the budgets in capacity, and in allocatable once the
    kubelet's part has copied them."""
    node = nodes.add("t4", labels={"cohabit.dev/gpu-9-memory-mib": "81920", "team": "ml"})
    client.CoreV1Api(api).patch_node(
        node, {"metadata": {"annotations": {"cohabit.dev/gpu-9-uuid": "GPU-gone", "x/y": "z"}}}
    )
    hardware = discovered(node, recording())
    process = start_agent(
        agents, status_patch, tmp_path, node, "--fleet", str(fleet_file(tmp_path, hardware))
    )

    process.wait_for(lambda: capacity_is(api, node, BUDGETS), what="the budgets in capacity")
    found = node_of(api, node)
    assert (
        ours(found.metadata.labels)
        == labels_for_node(hardware)
        == {
            "cohabit.dev/gpu-vendor": "nvidia",
            "cohabit.dev/gpu-count": "4",
            "cohabit.dev/gpu-product": "Tesla-T4",
            "cohabit.dev/gpu-accel-version": "12.2",
            "cohabit.dev/gpu-memory-class": "discrete",
            "cohabit.dev/gpu-memory-mib": "15360",
        }
    )
    assert found.metadata.labels["team"] == "ml"
    assert ours(found.metadata.annotations) == annotations_for_node(hardware)
    assert found.metadata.annotations["cohabit.dev/gpu-0-uuid"].startswith("GPU-5f0c2b7e")
    assert found.metadata.annotations["x/y"] == "z"
    core = client.CoreV1Api(api)
    assert copy_capacity_to_allocatable(core, node, PREFIX) == BUDGETS
    assert ours(node_of(api, node).status.allocatable) == BUDGETS
    assert process.alive()


def test_budgets_are_published_again_after_a_kubelet_restart_zeroes_them_or_one_is_removed(
    api: client.ApiClient,
    nodes: Nodes,
    status_patch: Release,
    agents: list[HostProcess],
    tmp_path: Path,
) -> None:
    node = nodes.add("t4")
    process = start_agent(
        agents, status_patch, tmp_path, node, "--fleet", str(t4_box(tmp_path, node))
    )
    process.wait_for(lambda: capacity_is(api, node, BUDGETS), what="the budgets")
    core = client.CoreV1Api(api)
    copy_capacity_to_allocatable(core, node, PREFIX)

    restart_kubelet(core, node)
    # Allocatable is the kubelet's: the agent puts capacity back, the kubelet follows.
    assert ours(node_of(api, node).status.allocatable) == dict.fromkeys(BUDGETS, "0")
    process.wait_for(lambda: capacity_is(api, node, BUDGETS), what="the budgets again")
    assert copy_capacity_to_allocatable(core, node, PREFIX) == BUDGETS

    core.patch_node_status(
        node, [{"op": "remove", "path": "/status/capacity/cohabit.dev~1vram-gb-gpu-2"}]
    )
    process.wait_for(lambda: capacity_is(api, node, BUDGETS), what="the removed budget back")
    assert process.alive()


@pytest.mark.parametrize(
    ("fractional", "before", "after"),
    [
        pytest.param(True, BUDGETS, WHOLE, id="to-whole-gpus"),
        pytest.param(False, WHOLE, BUDGETS, id="to-fractional"),
    ],
)
def test_a_switch_of_placement_mode_publishes_the_new_resources_and_drops_the_old(
    api: client.ApiClient,
    namespace: str,
    nodes: Nodes,
    releases: Releases,
    agents: list[HostProcess],
    tmp_path: Path,
    fractional: bool,
    before: dict[str, str],
    after: dict[str, str],
) -> None:
    """`placement.vramPluginV2.enabled` flipped with `helm upgrade`: the DaemonSet's new
    arguments (`--whole-gpus`, or none) make the restarted agent publish one unit per card
    (`cohabit.dev/gpu-<i>: 1`) or the GiB budgets, and remove the other mode's; the kubelet
    then drops those from allocatable too."""

    def values(enabled: bool) -> dict[str, Any]:
        return values_for(
            namespace, agent=STATUS_PATCH, placement={"vramPluginV2": {"enabled": enabled}}
        )

    node = nodes.add("t4")
    fleet = t4_box(tmp_path, node)
    release = releases.install(values(fractional))
    first = start_agent(agents, release, tmp_path, node, "--fleet", str(fleet))
    first.wait_for(lambda: capacity_is(api, node, before), what="the first mode's resources")
    core = client.CoreV1Api(api)
    assert copy_capacity_to_allocatable(core, node, PREFIX) == before
    first.stop()

    release.upgrade(values(not fractional), tmp_path)
    args = release.container("DaemonSet", "agent")["args"]
    assert ("--whole-gpus" in args) is fractional
    second = start_agent(agents, release, tmp_path, node, "--fleet", str(fleet))
    second.wait_for(lambda: capacity_is(api, node, after), what="the new mode's alone")
    assert copy_capacity_to_allocatable(core, node, PREFIX) == after
    assert ours(node_of(api, node).status.allocatable) == after


# --- what the chart's role allows, and what the agent does with a refusal -----------------


@pytest.mark.parametrize(
    ("agent", "status_patches", "lists_pods"),
    [
        pytest.param({}, False, True, id="device-plugin-with-memory-report"),
        pytest.param({"budgetBackend": "status-patch"}, True, True, id="status-patch"),
        pytest.param(STATUS_PATCH, True, False, id="status-patch-without-memory-report"),
    ],
)
def test_the_agents_role_allows_what_it_needs_and_nothing_more(
    cluster: Cluster,
    namespace: str,
    nodes: Nodes,
    releases: Releases,
    tmp_path: Path,
    agent: dict[str, Any],
    status_patches: bool,
    lists_pods: bool,
) -> None:
    node = nodes.add("gpu")
    release = releases.install(values_for(namespace, agent=agent))
    identity = agent_kubeconfig(release, tmp_path)  # the role in effect: no answer is early

    def can(verb: str, resource: str, namespace: str = "", subresource: str = "") -> bool:
        return allowed(cluster, identity, verb, resource, namespace, subresource=subresource)

    assert can("get", f"nodes/{node}") and can("patch", f"nodes/{node}")
    assert can("patch", "nodes", subresource="status") is status_patches
    assert can("list", "pods") is lists_pods  # the memory report's pods on its node
    for verb, resource in (
        ("list", "nodes"),
        ("update", "nodes"),
        ("delete", "nodes"),
        ("create", "nodes"),
        ("create", "pods"),
        ("get", "pods"),
        ("delete", "pods"),
        ("get", "secrets"),
        ("list", "secrets"),
        ("create", "pods/eviction"),
        ("create", "modeldeployments.cohabit.dev"),
        ("list", "configmaps"),
    ):
        assert not can(verb, resource, namespace), f"the agent may {verb} {resource}"
    assert not can("update", "nodes", subresource="status")


def test_a_call_refused_at_the_start_ends_the_agent_with_the_servers_words(
    namespace: str,
    nodes: Nodes,
    releases: Releases,
    agents: list[HostProcess],
    tmp_path: Path,
) -> None:
    """Run as status-patch where the chart was installed for the device plugin, whose role
    has no `nodes/status`: the status PATCH is a real 403, and the agent exits saying so in
    one line (the pod's log), not with a traceback."""
    node = nodes.add("t4")
    release = releases.install(values_for(namespace))
    extra = ("--backend", "status-patch", "--meter-interval", "0")
    process = start_agent(
        agents, release, tmp_path, node, *extra, "--fleet", str(t4_box(tmp_path, node))
    )
    assert process.exited() == 1
    output = process.output()
    assert "Traceback" not in output, output
    account = f"system:serviceaccount:{namespace}:{release.name}-agent"
    assert output.splitlines()[-1] == (
        f'error: patch node {node} status: 403 Forbidden: nodes "{node}" is forbidden: '
        f'User "{account}" cannot patch resource "nodes/status" in API group "" at the '
        "cluster scope"
    )


def test_a_node_deleted_and_registered_again_is_labelled_and_given_its_budgets_again(
    api: client.ApiClient,
    namespace: str,
    nodes: Nodes,
    status_patch: Release,
    agents: list[HostProcess],
    tmp_path: Path,
) -> None:
    """While the Node is gone every pass is a 404, logged; the agent keeps going, and once a
    kubelet registers the node again (without our labels, annotations or budgets) the next
    pass puts them all back."""
    node = nodes.add("t4")
    hardware = discovered(node, recording())
    process = start_agent(
        agents, status_patch, tmp_path, node, "--fleet", str(fleet_file(tmp_path, hardware))
    )
    process.wait_for(lambda: capacity_is(api, node, BUDGETS), what="the budgets")
    core = client.CoreV1Api(api)
    core.delete_node(node)
    process.wait_for(
        lambda: f"get node {node}: 404 Not Found" in process.output(),
        what="the agent to log the missing node",
    )
    core.create_node(kwok_node(node, labels={}, capacity={}, group=namespace))

    def restored() -> bool:  # budgets (the status) and labels are two patches of one pass
        labels = ours(node_of(api, node).metadata.labels)
        return capacity_is(api, node, BUDGETS) and labels == labels_for_node(hardware)

    process.wait_for(restored, what="the budgets and labels again")
    found = node_of(api, node)
    assert ours(found.metadata.labels) == labels_for_node(hardware)
    assert ours(found.metadata.annotations) == annotations_for_node(hardware)
    assert process.alive()


# --- on this machine's own hardware ---------------------------------------------------------


def test_the_agent_on_this_machine_labels_a_cpu_pool_and_reports_its_memory(
    api: client.ApiClient,
    namespace: str,
    nodes: Nodes,
    releases: Releases,
    agents: list[HostProcess],
    tmp_path: Path,
) -> None:
    """No `--fleet`: the production path. Discovery finds no GPU here, so the node is a CPU
    pool (no budget); the meter, on as the chart has it by default, measures this machine's
    memory from /proc and writes the report to the node."""
    node = nodes.add("cpu")
    agent = {"budgetBackend": "status-patch", "meter": {"intervalSeconds": 1}}
    release = releases.install(values_for(namespace, agent=agent))
    process = start_agent(agents, release, tmp_path, node)

    def report() -> Any:
        text = (node_of(api, node).metadata.annotations or {}).get(ANNOTATION_MEMORY)
        return text and report_from_annotation(text, node=node)

    written = process.wait_for(report, what="the memory report")
    (pool,) = written.devices
    assert (pool.gpu_index, pool.partition_index) == (None, None)
    assert pool.total_bytes == read_host_memory().total_bytes
    assert pool.used_bytes + pool.free_bytes <= pool.total_bytes
    assert (written.interval_s, written.heartbeat_s) == (1.0, 30.0)
    found = node_of(api, node)
    assert ours(found.metadata.labels) == {"cohabit.dev/gpu-vendor": "cpu"}
    assert ours(found.status.capacity) == {}
    assert process.alive()


# --- the chart's DaemonSet under Pod Security ---------------------------------------------

ENFORCE = "pod-security.kubernetes.io/enforce"  # k8s.io/pod-security-admission api/constants.go


def refusals(api: client.ApiClient, namespace: str) -> list[str]:
    events = client.CoreV1Api(api).list_namespaced_event(namespace).items
    return [e.message for e in events if e.reason == "FailedCreate"]


def agent_pods_ready(api: client.ApiClient, release: Release) -> int:
    name = f"{release.name}-agent"
    found = client.AppsV1Api(api).read_namespaced_daemon_set(name, release.namespace)
    return int(found.status.number_ready or 0)


HOST_PID = "host namespaces (hostPID=true)"
PRIVILEGED = (
    f'{HOST_PID}, hostPath volumes (volume "device-plugins"), '
    'privileged (container "agent" must not set securityContext.privileged=true)'
)


@pytest.mark.parametrize(
    ("agent", "profile", "violations"),
    [
        pytest.param({}, "baseline", PRIVILEGED, id="device-plugin-baseline"),
        pytest.param({}, "privileged", None, id="device-plugin-privileged"),
        pytest.param(
            {"budgetBackend": "status-patch"}, "baseline", HOST_PID, id="memory-report-baseline"
        ),
        pytest.param(STATUS_PATCH, "restricted", None, id="no-memory-report-restricted"),
    ],
)
def test_where_pod_security_admits_the_agents_pods(
    api: client.ApiClient,
    namespace: str,
    nodes: Nodes,
    releases: Releases,
    agent: dict[str, Any],
    profile: str,
    violations: str | None,
) -> None:
    """What docs/kubernetes.md says: the device plugin's agent (privileged, the kubelet's
    socket directory) and the memory report (the host's PIDs) need a `privileged`
    namespace; the status-patch agent without the report passes `restricted`. The real
    admission plugin judges the DaemonSet controller's real pod creations."""
    nodes.add("gpu")
    client.CoreV1Api(api).patch_namespace(namespace, {"metadata": {"labels": {ENFORCE: profile}}})
    release = releases.install(values_for(namespace, agent=agent))
    if violations is None:
        wait_for(lambda: agent_pods_ready(api, release) == 1, what="the agent's pod")
        assert not refusals(api, namespace)
        return
    refused = wait_for(lambda: refusals(api, namespace), what="the agent's pod to be refused")
    assert agent_pods_ready(api, release) == 0
    for message in refused:
        assert message.endswith(f'violates PodSecurity "{profile}:latest": {violations}'), message


# --- end to end ---------------------------------------------------------------------------


def test_budgets_the_agent_publishes_let_two_models_share_a_t4_and_refuse_a_third(
    api: client.ApiClient,
    namespace: str,
    nodes: Nodes,
    status_patch: Release,
    agents: list[HostProcess],
    tmp_path: Path,
) -> None:
    """The real agent publishes the one T4's 15 GiB; the real operator places two 6 GiB
    models there through the real scheduler and refuses the third without making a pod."""
    node = nodes.add("t4")
    process = start_agent(
        agents, status_patch, tmp_path, node, "--fleet", str(t4_box(tmp_path, node, cards=1))
    )
    budget = {"cohabit.dev/vram-gb-gpu-0": "15"}
    process.wait_for(lambda: capacity_is(api, node, budget), what="the T4's budget")
    assert copy_capacity_to_allocatable(client.CoreV1Api(api), node, PREFIX) == budget
    operator = run_operator(status_patch, tmp_path)
    try:
        for name in ("model-a", "model-b"):
            apply(api, model_deployment(name, namespace, model="/models/m.gguf", vram="6GiB"))
            status = phase(api, namespace, name, "DEPLOYED", "FAILED", "ERROR")
            assert status["phase"] == "DEPLOYED", status
            assert (status["node"], status["gpuIndices"]) == (node, [0])
        apply(api, model_deployment("model-c", namespace, model="/models/m.gguf", vram="6GiB"))
        status = phase(api, namespace, "model-c", "FAILED", "DEPLOYED")
        assert status["lastErrorCode"] == crd.NO_FIT_ERROR
        assert status["lastErrorMessage"].startswith("insufficient_capacity")
    finally:
        operator.stop()
    pods = {p.metadata.name: p for p in client.CoreV1Api(api).list_namespaced_pod(namespace).items}
    assert "model-c-engine" not in pods
    for name in ("model-a", "model-b"):
        pod = pods[f"{name}-engine"]
        assert (pod.spec.node_name, pod.status.phase) == (node, "Running")
        assert pod.spec.containers[0].resources.requests["cohabit.dev/vram-gb-gpu-0"] == "6"


# --- in this process, counting the calls -----------------------------------------------------


def test_a_pass_with_nothing_lost_reads_once_and_writes_nothing(
    api: client.ApiClient, nodes: Nodes, status_patch: Release, tmp_path: Path
) -> None:
    node = nodes.add("t4")
    port = agent_port(status_patch, tmp_path)
    agent = NodeAgent(
        node_name=node,
        api=port,
        node=discovered(node, recording()),
        advertiser=StatusPatchAdvertiser(port, node),
    )
    agent.start()
    assert port.calls == ["get_node", "patch_labels", "get_node", "patch_capacity"]
    assert capacity_is(api, node, BUDGETS)

    port.calls.clear()
    assert agent.tick() is False
    assert port.calls == ["get_node"]

    restart_kubelet(client.CoreV1Api(api), node)
    port.calls.clear()
    assert agent.tick() is True
    assert port.calls == ["get_node", "patch_capacity"]
    assert capacity_is(api, node, BUDGETS)


def recorded_machines(name: str) -> list[Node]:
    """Every recorded machine discovery reads (NVML and amdsmi answers), named `name`; and
    one whose product name is longer than a label value may be and full of characters no
    label value may hold."""
    machines = []
    for path in sorted(fakes.HARDWARE.glob("nvml_*.json")) + sorted(
        fakes.HARDWARE.glob("amdsmi_*.json")
    ):
        snapshot = fakes.load(path.name)
        if "devices" not in snapshot and "processors" not in snapshot:
            continue  # a library that is missing or failed: nothing discovered
        try:
            if path.name.startswith("nvml_"):
                found = discover_nvidia(
                    fakes.FakeNvml(snapshot), name=name, host=fakes.host_of(snapshot)
                )
            else:
                found = discover_amd(
                    fakes.FakeAmdSmi(snapshot), name=name, host=fakes.host_of(snapshot)
                )
        except (DiscoveryError, KeyError):
            continue  # a failing device, or a usage-only recording
        if found is not None:
            machines.append(found)
    t4 = machines[0]
    odd = replace(
        t4.gpus[0],
        product="NVIDIA GeForce RTX 5090 D v2 (TM) Founders Edition / 32 GB GDDR7 — "
        "engineering sample #7",
        accel_version="12.8 (r570_00)",
    )
    return [*machines, replace(t4, gpus=(odd,))]


def test_what_the_agent_writes_for_every_recorded_machine_is_valid_on_the_real_server(
    api: client.ApiClient, nodes: Nodes, status_patch: Release, tmp_path: Path
) -> None:
    """The API server refuses a label value over 63 characters or outside
    `(([A-Za-z0-9][-A-Za-z0-9_.]*)?[A-Za-z0-9])?` and a bad resource name or quantity; each
    machine's labels, annotations and budgets, one after the other on one node, are
    accepted, and each start leaves none of the machine before."""
    node = nodes.add("any")
    port = agent_port(status_patch, tmp_path)
    machines = recorded_machines(node)
    assert len(machines) >= 7
    for machine in machines:
        NodeAgent(
            node_name=node, api=port, node=machine, advertiser=StatusPatchAdvertiser(port, node)
        ).start()
        found = node_of(api, node)
        assert ours(found.metadata.labels) == labels_for_node(machine)
        assert ours(found.metadata.annotations) == annotations_for_node(machine)
        wanted = {b.resource: str(b.units) for b in budgets_for_node(machine)}
        assert ours(found.status.capacity) == wanted
    assert ours(found.metadata.labels)["cohabit.dev/gpu-product"] == (
        "NVIDIA-GeForce-RTX-5090-D-v2-TM-Founders-Edition-32-GB-GDDR7-en"
    )


@pytest.mark.parametrize("memory_report", [True, False])
def test_the_agents_start_keeps_the_memory_report_only_while_it_reports(
    api: client.ApiClient,
    nodes: Nodes,
    status_patch: Release,
    tmp_path: Path,
    memory_report: bool,
) -> None:
    """The meter writes `cohabit.dev/memory` from its own thread, maybe before the agent's
    start cleans up stale annotations; with the report off, one left from before goes."""
    node = nodes.add("t4")
    port = agent_port(status_patch, tmp_path)
    port.patch_labels(node, {}, {ANNOTATION_MEMORY: "{}"})
    hardware = discovered(node, recording())
    NodeAgent(
        node_name=node,
        api=port,
        node=hardware,
        advertiser=StatusPatchAdvertiser(port, node),
        memory_report=memory_report,
    ).start()
    annotations = node_of(api, node).metadata.annotations or {}
    assert (ANNOTATION_MEMORY in annotations) is memory_report
    assert annotations_for_node(hardware).items() <= annotations.items()
