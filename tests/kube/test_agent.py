"""The node agent against an emulated API server (kmock, real HTTP on 127.0.0.1): labels,
budgets published by node-status PATCH and re-published after the kubelet zeroes them; and the
device-plugin backend against a fake kubelet `Registration` gRPC server on a temporary unix
socket. GPUs come from the recorded NVML snapshots of tests/fixtures/hardware; the kubelet's
part in the emulator is `FakeKubelet` (allocatable follows capacity; a restart zeroes
extended resources, as kubernetes PR #64784 describes)."""

from __future__ import annotations

import os
import subprocess
import sys
import threading
from collections.abc import Iterator
from concurrent import futures
from pathlib import Path
from typing import Any

import grpc
import pytest

from cohabit.hardware.labels import annotations_for_node
from cohabit.hardware.model import Node
from cohabit.hardware.nvidia import discover_nvidia
from cohabit.kube.agent import (
    DevicePluginAdvertiser,
    NodeAgent,
    StatusPatchAdvertiser,
    budgets_for_node,
    capacity_patch,
    label_patch,
)
from cohabit.kube.cluster import NodePort
from cohabit.kube.deviceplugin.plugin import (
    KUBELET_SOCKET,
    Allocation,
    GpuBudget,
    api_pb2,
    api_pb2_grpc,
)
from cohabit.kube.errors import AgentError
from cohabit.kube.nodememory import ANNOTATION_MEMORY
from tests.hardware import fakes
from tests.kube.emulator import NODES, Emulator, FakeKubelet

NODE = "edge-t4-0"
BUDGETS = {f"cohabit.dev/vram-gb-gpu-{i}": "15" for i in range(4)}


def t4x4() -> Node:
    return discover_nvidia(fakes.nvml("nvml_t4x4.json"), name=NODE)


def add_node(emulator: Emulator, labels: dict[str, str] | None = None) -> None:
    emulator.put(
        NODES,
        {
            "apiVersion": "v1",
            "kind": "Node",
            "metadata": {
                "name": NODE,
                "labels": {"kubernetes.io/hostname": NODE, **(labels or {})},
            },
            "status": {"capacity": {"cpu": "8", "memory": "32523456Ki"}},
        },
    )


def allocatable(emulator: Emulator) -> dict[str, str]:
    node = emulator.get(NODES, NODE) or {}
    found = node.get("status", {}).get("allocatable", {})
    return {k: v for k, v in found.items() if k.startswith("cohabit.dev/")}


def test_status_patch_agent_labels_the_node_and_republishes_after_kubelet_restart(
    emulator: Emulator,
) -> None:
    add_node(emulator, {"cohabit.dev/gpu-9-memory-mib": "81920"})  # stale, from other cards
    kubelet = FakeKubelet(emulator, NODE)
    api = NodePort(emulator.api())
    agent = NodeAgent(
        node_name=NODE, api=api, node=t4x4(), advertiser=StatusPatchAdvertiser(api, NODE)
    )

    agent.start()
    kubelet.sync()
    labels = (emulator.get(NODES, NODE) or {})["metadata"]["labels"]
    assert {k: v for k, v in labels.items() if k.startswith("cohabit.dev/")} == {
        "cohabit.dev/gpu-vendor": "nvidia",
        "cohabit.dev/gpu-count": "4",
        "cohabit.dev/gpu-product": "Tesla-T4",
        "cohabit.dev/gpu-accel-version": "12.2",
        "cohabit.dev/gpu-memory-class": "discrete",
        "cohabit.dev/gpu-memory-mib": "15360",
    }
    assert allocatable(emulator) == BUDGETS

    writes = len(emulator.requests())
    assert agent.tick() is False  # nothing lost: a read, no write
    assert [m for m, _ in emulator.requests()[writes:]] == ["GET"]

    kubelet.restart()
    assert allocatable(emulator) == dict.fromkeys(BUDGETS, "0")
    before = len(emulator.requests())
    assert agent.tick() is True
    assert emulator.requests()[before:] == [
        ("GET", f"/api/v1/nodes/{NODE}"),
        ("PATCH", f"/api/v1/nodes/{NODE}/status"),
    ]
    kubelet.sync()
    assert allocatable(emulator) == BUDGETS


@pytest.mark.parametrize("memory_report", [True, False])
def test_the_agents_start_keeps_the_memory_report_only_while_it_reports(
    emulator: Emulator, memory_report: bool
) -> None:
    """The meter writes `cohabit.dev/memory` from its own thread, maybe before the agent's
    start cleans up stale annotations; with the report off, one left from before goes."""
    add_node(emulator)
    emulator.patch(NODES, NODE, {"metadata": {"annotations": {ANNOTATION_MEMORY: "{}"}}})
    api = NodePort(emulator.api())
    NodeAgent(
        node_name=NODE,
        api=api,
        node=t4x4(),
        advertiser=StatusPatchAdvertiser(api, NODE),
        memory_report=memory_report,
    ).start()
    annotations = (emulator.get(NODES, NODE) or {})["metadata"].get("annotations") or {}
    assert (ANNOTATION_MEMORY in annotations) is memory_report
    assert annotations_for_node(t4x4()).items() <= annotations.items()  # the start's own


@pytest.mark.parametrize(
    ("capacity", "has_capacity", "operations"),
    [
        pytest.param(
            {}, False,
            [{"op": "add", "path": "/status/capacity",
              "value": {"cohabit.dev/vram-gb-gpu-0": "15"}}],
            id="no-capacity-yet",
        ),
        pytest.param(
            {"cpu": "8", "cohabit.dev/vram-gb-gpu-0": "0"}, True,
            [{"op": "add", "path": "/status/capacity/cohabit.dev~1vram-gb-gpu-0", "value": "15"}],
            id="zeroed-by-kubelet",
        ),
        pytest.param(
            {"cohabit.dev/vram-gb-gpu-0": "15", "cohabit.dev/vram-gb-gpu-1": "15"}, True,
            [{"op": "remove", "path": "/status/capacity/cohabit.dev~1vram-gb-gpu-1"}],
            id="gpu-gone",
        ),
        pytest.param({"cohabit.dev/vram-gb-gpu-0": "15"}, True, [], id="in-place"),
    ],
)  # fmt: skip
def test_capacity_patch(capacity: dict[str, str], has_capacity: bool, operations: list) -> None:
    wanted = {"cohabit.dev/vram-gb-gpu-0": "15"}
    assert capacity_patch(capacity, wanted, has_capacity=has_capacity) == operations


def test_label_patch_removes_only_our_stale_labels() -> None:
    current = {"cohabit.dev/gpu-count": "8", "cohabit.dev/gpu-3-memory-mib": "1", "team": "a"}
    assert label_patch(current, {"cohabit.dev/gpu-count": "4"}) == {
        "cohabit.dev/gpu-3-memory-mib": None,
        "cohabit.dev/gpu-count": "4",
    }


def test_unified_node_publishes_one_budget_after_the_os_reserve() -> None:
    recorded = fakes.load("nvml_gb10.json")
    node = discover_nvidia(fakes.FakeNvml(recorded), name="spark", host=fakes.host_of(recorded))
    budgets = budgets_for_node(node)
    assert [(b.resource, b.units) for b in budgets] == [("cohabit.dev/vram-gb-gpu-0", 113)]


class FakeKubeletRegistration:
    """The kubelet's Registration service on kubelet.sock; it records each request and, like
    the kubelet, dials the plugin back and reads its first device list."""

    def __init__(self, directory: Path) -> None:
        self.directory = directory
        self.registered: list[tuple[str, str, str]] = []
        self.devices: dict[str, list[str]] = {}
        self.lock = threading.Lock()
        self.server = grpc.server(futures.ThreadPoolExecutor(max_workers=2))
        api_pb2_grpc.add_RegistrationServicer_to_server(self, self.server)
        self.server.add_insecure_port(f"unix://{directory / KUBELET_SOCKET}")

    def Register(self, request: Any, context: Any) -> Any:  # noqa: N802 — the RPC's name
        with self.lock:
            self.registered.append((request.version, request.endpoint, request.resource_name))
        return api_pb2.Empty()


@pytest.fixture
def plugin_dir(tmp_path: Path) -> Iterator[tuple[Path, FakeKubeletRegistration]]:
    # Unix socket paths are limited to ~107 bytes; pytest's tmp paths can be long.
    directory = tmp_path
    kubelet = FakeKubeletRegistration(directory)
    kubelet.server.start()
    yield directory, kubelet
    kubelet.server.stop(grace=None).wait(timeout=5)


def plugin_stub(directory: Path, index: int) -> tuple[grpc.Channel, Any]:
    channel = grpc.insecure_channel(f"unix://{directory / f'cohabit-vram-gpu-{index}.sock'}")
    return channel, api_pb2_grpc.DevicePluginStub(channel)


def test_device_plugin_registers_lists_allocates_and_reregisters(
    plugin_dir: tuple[Path, FakeKubeletRegistration],
) -> None:
    directory, kubelet = plugin_dir
    budgets = budgets_for_node(t4x4())[:2]
    advertiser = DevicePluginAdvertiser(directory)
    try:
        advertiser.publish(budgets)
        assert kubelet.registered == [
            ("v1beta1", "cohabit-vram-gpu-0.sock", "cohabit.dev/vram-gb-gpu-0"),
            ("v1beta1", "cohabit-vram-gpu-1.sock", "cohabit.dev/vram-gb-gpu-1"),
        ]
        channel, stub = plugin_stub(directory, 1)
        with channel:
            stream = stub.ListAndWatch(api_pb2.Empty(), timeout=10)
            first = next(stream)
            assert [d.ID for d in first.devices][:2] == ["gpu1-gib-0000", "gpu1-gib-0001"]
            assert len(first.devices) == 15
            assert {d.health for d in first.devices} == {"Healthy"}
            stream.cancel()
            answer = stub.Allocate(
                api_pb2.AllocateRequest(
                    container_requests=[
                        api_pb2.ContainerAllocateRequest(devices_ids=["gpu1-gib-0000"])
                    ]
                ),
                timeout=10,
            )
            gpu1 = "GPU-7a1b3c5d-2e4f-4a6b-9c8d-0e1f2a3b4c52"
            assert dict(answer.container_responses[0].envs) == {"COHABIT_VISIBLE_DEVICE_1": gpu1}
            assert [d.name for d in answer.container_responses[0].cdi_devices] == [
                f"nvidia.com/gpu={gpu1}"
            ]
            with pytest.raises(grpc.RpcError) as refused:
                stub.Allocate(
                    api_pb2.AllocateRequest(
                        container_requests=[
                            api_pb2.ContainerAllocateRequest(devices_ids=["gpu0-gib-0000"])
                        ]
                    ),
                    timeout=10,
                )
            assert refused.value.code() is grpc.StatusCode.INVALID_ARGUMENT

        assert advertiser.reconcile() is False
        (directory / "cohabit-vram-gpu-0.sock").unlink()  # a restarting kubelet clears these
        assert advertiser.reconcile() is True
        assert kubelet.registered[-1] == (
            "v1beta1",
            "cohabit-vram-gpu-0.sock",
            "cohabit.dev/vram-gb-gpu-0",
        )
        assert len(kubelet.registered) == 3
    finally:
        advertiser.close()


def test_device_plugin_without_a_kubelet_says_so(tmp_path: Path) -> None:
    advertiser = DevicePluginAdvertiser(tmp_path)
    with pytest.raises(AgentError, match=r"kubelet refused cohabit.dev/vram-gb-gpu-0 at unix://"):
        advertiser.publish(budgets_for_node(t4x4())[:1])
    advertiser.close()


def test_agent_without_node_name_says_what_is_missing() -> None:
    env = {k: v for k, v in os.environ.items() if k != "NODE_NAME"}
    done = subprocess.run(
        [sys.executable, "-m", "cohabit.kube.agent", "--backend", "status-patch"],
        capture_output=True, text=True, env=env, timeout=60, check=False,
    )  # fmt: skip
    assert done.returncode != 0
    assert done.stderr.strip() == (
        "error: NODE_NAME is not set (the DaemonSet sets it from spec.nodeName)"
    )


def kubelet_merge(answers: list[Any]) -> tuple[dict[str, str], list[str]]:
    """What the kubelet makes of several resources' `Allocate` answers for one container,
    as pkg/kubelet/cm/devicemanager/pod_devices.go `deviceRunContainerOptions` does: envs
    keyed by name, the first value kept and later ones for the same key dropped (logged as
    a conflict); CDI devices appended, each name once (`getCDIDeviceInfo`)."""
    envs: dict[str, str] = {}
    cdi: list[str] = []
    for answer in answers:
        for key, value in answer.envs.items():
            envs.setdefault(key, value)
        for device in answer.cdi_devices:
            if device.name not in cdi:
                cdi.append(device.name)
    return envs, cdi


def allocate_each(directory: Path, budgets: list[GpuBudget], allocation: Allocation) -> list[Any]:
    """Serve one plugin per budget and ask each for one device, as the kubelet does for a
    pod that requests every GPU's resource."""
    advertiser = DevicePluginAdvertiser(directory, allocation=allocation)
    answers = []
    try:
        advertiser.publish(budgets)
        for budget in budgets:
            channel, stub = plugin_stub(directory, budget.index)
            with channel:
                request = api_pb2.AllocateRequest(
                    container_requests=[
                        api_pb2.ContainerAllocateRequest(devices_ids=budget.device_ids[:6])
                    ]
                )
                answers.append(stub.Allocate(request, timeout=10).container_responses[0])
    finally:
        advertiser.close()
    return answers


def test_tensor_parallel_pod_gets_every_gpu_it_holds(
    plugin_dir: tuple[Path, FakeKubeletRegistration],
) -> None:
    """A TP-4 pod asks for four `vram-gb-gpu-<i>` resources: four plugins answer. With CDI
    the kubelet's merge keeps all four devices; one shared env key would keep one."""
    directory, _ = plugin_dir
    budgets = budgets_for_node(t4x4())
    uuids = [b.device for b in budgets]
    envs, cdi = kubelet_merge(allocate_each(directory, budgets, Allocation.CDI))
    assert cdi == [f"nvidia.com/gpu={u}" for u in uuids]
    assert envs == {f"COHABIT_VISIBLE_DEVICE_{i}": u for i, u in enumerate(uuids)}

    envs, cdi = kubelet_merge(allocate_each(directory, budgets, Allocation.ENV))
    assert cdi == []
    assert envs["NVIDIA_VISIBLE_DEVICES"] == uuids[0]  # the other three are dropped


def test_whole_gpu_mode_publishes_one_unit_per_device(emulator: Emulator) -> None:
    add_node(emulator)
    agent = NodeAgent(
        node_name=NODE,
        api=NodePort(emulator.api()),
        node=t4x4(),
        advertiser=StatusPatchAdvertiser(NodePort(emulator.api()), NODE),
        whole_gpus=True,
    )
    agent.start()
    capacity = (emulator.get(NODES, NODE) or {})["status"]["capacity"]
    assert {k: v for k, v in capacity.items() if k.startswith("cohabit.dev/")} == {
        f"cohabit.dev/gpu-{i}": "1" for i in range(4)
    }
