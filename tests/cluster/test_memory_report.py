"""The node agent's memory report on the real API server: the meter writes it to a kwok
node through the real `NodePort`, authenticated as the chart's agent ServiceAccount, and the
control plane (`cohabit serve --backend kubernetes`, the chart's API run here as a process
on real PostgreSQL, the store that backend requires) and the operator (run here as a
process) read it back and plan with it.

What stays recorded is what no API server holds: the drivers' answers (NVML replayed
through the real pynvml, tests/hardware/test_usage.py; or through pynvml's function names,
tests/hardware/fakes.py) and /proc/<pid>/cgroup files recorded on real nodes
(tests/fixtures/kube/proc_cgroup.json), with the recorded pod UID replaced by the UID the API
server gave the real pod, since no kubelet runs here. The CPU pool is this machine's, with
real processes. The meter's heartbeat runs on an injected clock, so nothing waits for time.
"""

from __future__ import annotations

import json
import logging
import threading
from collections.abc import Iterator
from contextlib import contextmanager
from dataclasses import dataclass, replace
from datetime import UTC, datetime, timedelta
from pathlib import Path
from typing import Any

import httpx
import psutil
import pytest
from kubernetes import client
from prometheus_client.parser import text_string_to_metric_families

from cohabit.hardware.host import discover_host
from cohabit.hardware.usage import measure_node
from cohabit.kube import crd
from cohabit.kube.cluster import KubernetesPort
from cohabit.kube.nodememory import ANNOTATION_MEMORY, NodeMemory, report_from_annotation
from cohabit.kube.nodemeter import NodeMeter
from cohabit.kube.podcgroup import pod_uid_in, pod_uid_of
from cohabit.kube.resources import LABEL_DEPLOYMENT, LABEL_MANAGED_BY, MANAGED_BY
from cohabit.kube.runtime import ClusterMeasure, md_name
from cohabit.units import GIB, MIB
from tests.cluster.conftest import Nodes, Releases
from tests.cluster.harness import (
    GROUP_LABEL,
    WAIT_S,
    CountedNodePort,
    Release,
    agent_port,
    apply,
    copy_capacity_to_allocatable,
    model_deployment,
    phase,
    run_agent,
    run_api,
    run_operator,
    values_for,
    wait_for,
)
from tests.cluster.inventory import discovered, fleet_file, recording
from tests.hardware import fakes
from tests.hardware.test_usage import recorded_nvml
from tests.kube.test_podcgroup import RECORDED
from tests.service.server import register_tiny_gguf, wait_status
from tests.service.test_meter import hold_memory
from tests.service.test_meter_gpu import H100_MIG
from tests.store.databases import fresh_database_url

ENGINE_CGROUP = next(r for r in RECORDED if r["name"].startswith("v2 systemd driver, containerd"))
OTHER_CGROUP = next(r for r in RECORDED if r["name"].startswith("v2 cgroupfs driver"))
ENGINE, ENGINE_CHILD, OTHER = 4242, 4243, 48213  # the H100 recording's pids
# The one-card T4 box of the recorded 4 x T4 answers: its card holds 6442450944 bytes of one
# process (pid 41217) in no pod of ours, and 6711934976 bytes in all.
T4_USED_BYTES = 6711934976
T4_BUDGET = {"cohabit.dev/vram-gb-gpu-0": "15"}
AGENT = {"budgetBackend": "status-patch", "meter": {"intervalSeconds": 0}}


def cgroup_file(recorded: dict[str, Any], uid: str) -> str:
    """A recorded /proc/<pid>/cgroup file, naming the pod `uid` instead of the recorded one
    (in both spellings: as is, and with the systemd driver's "-" → "_")."""
    text = str(recorded["text"])
    for old, new in (
        (recorded["uid"], uid),
        (recorded["uid"].replace("-", "_"), uid.replace("-", "_")),
    ):
        text = text.replace(old, new)
    assert pod_uid_in(text) == uid
    return text


def bound_pod(api: client.ApiClient, namespace: str, node: str, name: str, *, engine: bool) -> str:
    """A pod bound to `node` (an engine pod of ours, or anybody's); its UID."""
    labels = {LABEL_MANAGED_BY: MANAGED_BY, LABEL_DEPLOYMENT: name} if engine else {}
    body = {
        "metadata": {"name": name, "labels": labels},
        "spec": {"nodeName": node, "containers": [{"name": "main", "image": "busybox"}]},
    }
    created = client.CoreV1Api(api).create_namespaced_pod(namespace, body)
    return str(created.metadata.uid)


def written(core: client.CoreV1Api, node: str) -> NodeMemory | None:
    """The node's memory report as the API server has it; None without one."""
    annotations = core.read_node(node).metadata.annotations or {}
    text = annotations.get(ANNOTATION_MEMORY)
    return None if text is None else report_from_annotation(text, node=node)


class Seconds:
    """A monotonic clock that moves only when told to."""

    def __init__(self) -> None:
        self.now_s = 1000.0

    def __call__(self) -> float:
        return self.now_s


@pytest.fixture
def agent_release(namespace: str, releases: Releases) -> Release:
    """The chart with its agent's role (the memory report's `pods: list` comes with
    `agent.meter.intervalSeconds` > 0, the default), its API, and refusals tried again
    every second."""
    values = values_for(
        namespace,
        agent={"budgetBackend": "status-patch"},
        api={"enabled": True},
        placement={"retrySeconds": 1},
    )
    return releases.install(values)


# --- the meter, writing ----------------------------------------------------------------------


def test_gpu_memory_of_an_engine_pod_is_cohabits_and_another_pods_is_foreign(
    api: client.ApiClient,
    namespace: str,
    nodes: Nodes,
    agent_release: Release,
    tmp_path: Path,
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    """NVIDIA with MIG, from the recorded H100 + L40S answers: the engine pod's two
    processes are cohabit's, the notebook pod's foreign. Written when it moved and on the
    heartbeat, not on every sample; pods listed only for a pod UID not seen before."""
    recorded_nvml(monkeypatch, {"ENGINE": ENGINE, "ENGINE_CHILD": ENGINE_CHILD})
    node = nodes.add("h100")
    engine_uid = bound_pod(api, namespace, node, "md-engine", engine=True)
    other_uid = bound_pod(api, namespace, node, "notebook", engine=False)
    cgroups = {
        ENGINE: cgroup_file(ENGINE_CGROUP, engine_uid),
        ENGINE_CHILD: cgroup_file(ENGINE_CGROUP, engine_uid),
        OTHER: cgroup_file(OTHER_CGROUP, other_uid),
    }
    port = agent_port(agent_release, tmp_path)
    seconds = Seconds()
    meter = NodeMeter(
        node=replace(H100_MIG.nodes[0], name=node),
        api=port,
        interval_s=5,
        heartbeat_s=30,
        pod_of=lambda pid: pod_uid_in(cgroups.get(pid, "")),
        pids=lambda: pytest.fail("no pool here: the host's processes are not read"),
        monotonic_s=seconds,
    )

    assert meter.tick() is True

    report = written(client.CoreV1Api(api), node)
    assert report is not None
    assert (report.interval_s, report.heartbeat_s) == (5.0, 30.0)
    assert abs((datetime.now(UTC) - report.at).total_seconds()) < 60
    by_key = {d.key: d for d in report.devices}
    assert set(by_key) == {(node, 0, 0), (node, 0, 1), (node, 1, None)}
    mig = by_key[(node, 0, 0)]  # the engine (14 GiB) and its child (2 GiB), both its pod's
    assert (mig.total_bytes, mig.used_bytes, mig.free_bytes) == (
        42144366592,
        17716396032,
        24427970560,
    )
    assert mig.cohabit_bytes == 16 * GIB
    small = by_key[(node, 0, 1)]  # the notebook's pod: not an engine pod
    assert (small.used_bytes, small.cohabit_bytes) == (5098176512, 0)
    card = by_key[(node, 1, None)]  # NVML cannot say what the engine holds: none counted
    assert (card.used_bytes, card.cohabit_bytes) == (18013323264, 0)
    annotations = client.CoreV1Api(api).read_node(node).metadata.annotations
    entry = json.loads(annotations[ANNOTATION_MEMORY])["devices"][0]
    assert entry["foreign_bytes"] == 17716396032 - 16 * GIB
    assert port.calls == ["list_pods_on", "patch_labels"]

    # Nothing moved: not written again before the heartbeat, and the pods are known.
    port.calls.clear()
    seconds.now_s += 29
    assert meter.tick() is False
    assert port.calls == []
    seconds.now_s += 1  # 30 s since the write: the heartbeat is due
    assert meter.tick() is True
    assert port.calls == ["patch_labels"]


def test_on_a_cpu_pool_engine_pods_count_by_resident_memory_and_others_are_foreign(
    api: client.ApiClient,
    namespace: str,
    nodes: Nodes,
    agent_release: Release,
    tmp_path: Path,
) -> None:
    """Two real processes stand for two pods' (their cgroup files recorded ones, naming the
    real pods): the engine pod's 512 MiB are cohabit's, the other pod's 256 MiB are not.
    Only per-process figures are compared: the host's totals move with whatever else runs
    beside the test."""
    node = nodes.add("cpu")
    engine_uid = bound_pod(api, namespace, node, "md-engine", engine=True)
    other_uid = bound_pod(api, namespace, node, "notebook", engine=False)
    engine, other = hold_memory(512 * MIB), hold_memory(256 * MIB)
    recorded = {
        engine.pid: cgroup_file(ENGINE_CGROUP, engine_uid),
        other.pid: cgroup_file(OTHER_CGROUP, other_uid),
    }
    try:
        meter = NodeMeter(
            node=discover_host(name=node),
            api=agent_port(agent_release, tmp_path),
            # Every other process's cgroup is read from this machine's /proc.
            pod_of=lambda pid: pod_uid_in(recorded[pid]) if pid in recorded else pod_uid_of(pid),
        )
        assert meter.tick() is True
        report = written(client.CoreV1Api(api), node)
        assert report is not None
        (pool,) = report.devices
        rss = psutil.Process(engine.pid).memory_info().rss
        assert pool.key == (node, None, None)
        assert pool.cohabit_bytes is not None and pool.cohabit_bytes >= 512 * MIB
        # The engine's own resident memory, not the other pod's beside it.
        assert abs(pool.cohabit_bytes - rss) < 128 * MIB
        annotations = client.CoreV1Api(api).read_node(node).metadata.annotations
        (entry,) = json.loads(annotations[ANNOTATION_MEMORY])["devices"]
        assert entry["foreign_bytes"] == entry["used_bytes"] - entry["cohabit_bytes"]
        assert entry["used_bytes"] + entry["free_bytes"] <= entry["total_bytes"]
    finally:
        for process in (engine, other):
            process.kill()
            process.communicate()


# --- the control plane and the operator, reading ---------------------------------------------

TOKEN = "t0ken-of-the-test"


@dataclass(frozen=True, slots=True)
class Box:
    """The one-card T4 box on a kwok node: its recorded NVML answers, its fleet file, and
    the agent's adapter its meter writes through."""

    node: str
    snapshot: dict[str, Any]
    fleet: Path
    port: CountedNodePort

    def meter(self, **seams: Any) -> NodeMeter:
        """The agent's meter for the box, measuring the recording (the one process on the
        card is in no pod); `seams` replace more of its readers."""
        return NodeMeter(
            node=discovered(self.node, self.snapshot),
            api=self.port,
            measure=lambda hardware: measure_node(hardware, nvml=fakes.FakeNvml(self.snapshot)),
            pod_of=lambda pid: None,
            **seams,
        )


def start_agent(release: Release, folder: Path, box: Box) -> None:
    """The real agent, its hardware from the box's fleet file and so its report off; it
    stops once its node is labelled and its budget published. Its start removes a report
    left from before, as a running agent with its report off would keep doing."""
    agent = run_agent(release, folder, box.node, "--fleet", str(box.fleet), "--meter-interval", "0")
    core = client.CoreV1Api(release.cluster.api())
    try:
        agent.wait_for(
            lambda: (
                copy_capacity_to_allocatable(core, box.node, "cohabit.dev/") == T4_BUDGET
                and written(core, box.node) is None
            ),
            what="the T4's budget, and no report",
        )
    finally:
        agent.stop()


@pytest.fixture
def t4(nodes: Nodes, agent_release: Release, tmp_path: Path) -> Box:
    """The box labelled and given its 15 GiB budget by the real agent, the kubelet's part
    copied."""
    node = nodes.add("t4")
    snapshot = recording(cards=1)
    box = Box(
        node=node,
        snapshot=snapshot,
        fleet=fleet_file(tmp_path, discovered(node, snapshot)),
        port=agent_port(agent_release, tmp_path),
    )
    start_agent(agent_release, tmp_path, box)
    return box


@contextmanager
def metering(core: client.CoreV1Api, meter: NodeMeter) -> Iterator[NodeMemory]:
    """The meter's loop on its own thread, as the agent runs it; yields its first report
    once it is on the node."""
    stop = threading.Event()
    thread = threading.Thread(target=meter.run, args=(stop,), daemon=True)
    thread.start()
    try:
        yield wait_for(lambda: written(core, meter.node.name), what="the memory report")
    finally:
        stop.set()
        thread.join(30)


def foreign_message(node: str) -> str:
    return f"; 6.3 GiB held by processes outside cohabit on {node} gpu 0"


@pytest.fixture
def control_plane(
    api: client.ApiClient, namespace: str, agent_release: Release, tmp_path: Path
) -> Iterator[httpx.Client]:
    """The chart's API as a process here, on a fresh PostgreSQL database and the Secrets the
    chart's docs have users make; a client on its /api."""
    database = fresh_database_url("postgresql", tmp_path)
    url = next(database)
    core = client.CoreV1Api(api)
    for name, key, value in (
        ("cohabit-database", "url", url),
        ("cohabit-api-token", "token", TOKEN),
    ):
        core.create_namespaced_secret(
            namespace, {"metadata": {"name": name}, "stringData": {key: value}}
        )
    server = run_api(agent_release, tmp_path)
    try:
        headers = {"Authorization": f"Bearer {TOKEN}"}
        with httpx.Client(base_url=server.url, headers=headers, timeout=30) as session:
            yield session
    finally:
        server.process.stop()
        database.close()  # drops the database


def deploy(session: httpx.Client, model_id: str, vram_bytes: int) -> str:
    answer = session.post(
        "/serving/deploy_model", json={"m_id": model_id, "vram_allocation": vram_bytes}
    )
    assert answer.status_code == 202, answer.text
    return str(answer.json())


def measured_foreign(session: httpx.Client, node: str) -> int | None:
    devices = session.get("/cluster/memory").json()["devices"]
    found = [d for d in devices if (d["node"], d["gpu_index"]) == (node, 0)]
    return found[0]["foreign_bytes"] if found else None


def metered_foreign(session: httpx.Client, node: str) -> float | None:
    """The card's foreign bytes as /metrics shows them."""
    text = session.get(str(session.base_url.copy_with(path="/metrics"))).text
    for family in text_string_to_metric_families(text):
        for sample in family.samples:
            if sample.name == "cohabit_device_foreign_bytes" and sample.labels["node"] == node:
                return sample.value
    return None


def placed(
    api: client.ApiClient, namespace: str, session: httpx.Client, deployment_id: str, node: str
) -> None:
    """Reserved, and handed to the cluster as a ModelDeployment pinned to the T4."""
    record = wait_status(
        session, deployment_id, {"INITIALIZING", "DEPLOYING", "FAILED"}, timeout_s=WAIT_S
    )
    assert record["status"] != "FAILED", record["last_error_message"]
    md = wait_for(  # the record may say so a moment before the object is made
        lambda: client.CustomObjectsApi(api).get_namespaced_custom_object(
            crd.GROUP, crd.VERSION, namespace, crd.PLURAL, md_name(deployment_id)
        ),
        what="the pinned ModelDeployment",
    )
    assert md["spec"]["placement"] == {"node": node, "slots": [{"gpuIndex": 0}]}


def test_memory_a_node_agent_reports_held_outside_cohabit_bounds_placement(
    api: client.ApiClient,
    namespace: str,
    agent_release: Release,
    t4: Box,
    control_plane: httpx.Client,
    tmp_path: Path,
) -> None:
    """12 GiB of the 15 GiB budget fits while nothing else holds the card; while the
    agent reports 6.3 GiB held outside cohabit it is refused, naming that memory; once the
    report is gone it fits again."""
    session = control_plane
    model = register_tiny_gguf(session, tmp_path)
    first = deploy(session, model["id"], 12 * GIB)
    placed(api, namespace, session, first, t4.node)
    assert session.delete(f"/serving/deployment/{first}").status_code == 200
    wait_status(session, first, {"STOPPED"}, timeout_s=WAIT_S)

    core = client.CoreV1Api(api)
    with metering(core, t4.meter()) as report:
        assert [d.used_bytes for d in report.devices] == [T4_USED_BYTES]
        wait_for(
            lambda: measured_foreign(session, t4.node) == T4_USED_BYTES,
            what="the control plane to read the report",
        )
        wait_for(
            lambda: metered_foreign(session, t4.node) == T4_USED_BYTES,
            what="/metrics to show the report",
        )
        refused = wait_status(session, deploy(session, model["id"], 12 * GIB), timeout_s=WAIT_S)
        assert refused["status"] == "FAILED"
        assert refused["last_error_code"] == "NoFitError"
        assert refused["last_error_message"].endswith(foreign_message(t4.node))
        assert refused["no_fit"]["foreign_location"] == f"{t4.node} gpu 0"
        assert refused["no_fit"]["foreign_bytes"] == T4_USED_BYTES

    start_agent(agent_release, tmp_path, t4)
    wait_for(lambda: measured_foreign(session, t4.node) is None, what="the report dropped")
    placed(api, namespace, session, deploy(session, model["id"], 12 * GIB), t4.node)


def test_the_operator_plans_a_model_deployment_made_by_hand_with_the_report_too(
    api: client.ApiClient,
    namespace: str,
    agent_release: Release,
    t4: Box,
    tmp_path: Path,
) -> None:
    """No pin (made with kubectl): the operator plans alone, and the same report bounds it;
    the refusal is tried again (the memory may be given back), and once the report is gone
    the deployment is placed."""
    operator = run_operator(agent_release, tmp_path)
    core = client.CoreV1Api(api)
    try:
        with metering(core, t4.meter()):
            apply(api, model_deployment("by-hand", namespace, model="/models/m.gguf", vram="12GiB"))
            refused = phase(api, namespace, "by-hand", "FAILED", "DEPLOYED", "ERROR")
            assert refused["lastErrorCode"] == crd.NO_FIT_ERROR, refused
            assert refused["lastErrorMessage"].endswith(foreign_message(t4.node))
            assert "by-hand-engine" not in {
                p.metadata.name for p in core.list_namespaced_pod(namespace).items
            }
        start_agent(agent_release, tmp_path, t4)
        status = phase(api, namespace, "by-hand", "DEPLOYED")
        assert (status["node"], status["gpuIndices"]) == (t4.node, [0])
    finally:
        operator.stop()


# --- what the control plane makes of a report's age and form ---------------------------------


def test_a_stale_report_is_not_used_and_the_log_says_so_once(
    api: client.ApiClient, namespace: str, t4: Box, caplog: pytest.LogCaptureFixture
) -> None:
    """Older than its heartbeat plus three samples (30 + 3 × 5 s): the agent is gone. The
    reports are the meter's, written with its clock set back; the control plane's measure
    reads the real Nodes, with its own clock."""
    now = datetime.now(UTC)
    measure = ClusterMeasure(
        KubernetesPort(api, node_selector=f"{GROUP_LABEL}={namespace}"), clock=lambda: now
    )

    def written_at(age_s: float) -> None:
        assert t4.meter(clock=lambda: now - timedelta(seconds=age_s)).tick() is True

    written_at(44)
    (card,) = measure(fleet=None)  # type: ignore[arg-type]  # the fleet is not read
    assert (card.key, card.used_bytes, card.cohabit_bytes) == ((t4.node, 0, None), T4_USED_BYTES, 0)

    written_at(46)
    with caplog.at_level(logging.WARNING, logger="cohabit.kube.runtime"):
        assert measure(fleet=None) == []  # type: ignore[arg-type]
        assert measure(fleet=None) == []  # type: ignore[arg-type]
        written_at(0)
        assert len(measure(fleet=None)) == 1  # type: ignore[arg-type]
        t4.port.patch_labels(t4.node, {}, {ANNOTATION_MEMORY: "{not json"})
        assert measure(fleet=None) == []  # type: ignore[arg-type]
    lines = [r.getMessage() for r in caplog.records]
    assert lines == [
        f"node {t4.node}: memory report not used: its memory report is 46 s old (stale after "
        "45 s): is the node agent running?",
        f"node {t4.node}: memory report used again",
        f"node {t4.node}: memory report not used: its {ANNOTATION_MEMORY} annotation is "
        "unreadable: not JSON (Expecting property name enclosed in double quotes: line 1 "
        "column 2 (char 1))",
    ]
