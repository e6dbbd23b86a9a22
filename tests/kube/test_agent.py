"""The node agent without an API server: the patches it computes, the budgets it makes of a
node, its command line; and the device-plugin backend against a fake kubelet `Registration`
gRPC server on a temporary unix socket (no kubelet runs here; kwok has no gRPC socket).
GPUs come from the recorded NVML snapshots of tests/fixtures/hardware. The agent on the real
API server, as the chart runs it, is tests/cluster/test_agent.py."""

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

from cohabit.hardware.model import Node
from cohabit.hardware.nvidia import discover_nvidia
from cohabit.kube.agent import (
    DevicePluginAdvertiser,
    budgets_for_node,
    capacity_patch,
    changes,
    label_patch,
    node_from_fleet,
)
from cohabit.kube.deviceplugin.plugin import (
    KUBELET_SOCKET,
    Allocation,
    GpuBudget,
    api_pb2,
    api_pb2_grpc,
)
from cohabit.kube.errors import AgentError
from tests.hardware import fakes

NODE = "edge-t4-0"


def t4x4() -> Node:
    return discover_nvidia(fakes.nvml("nvml_t4x4.json"), name=NODE)


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


@pytest.mark.parametrize(
    ("current", "patch"),
    [
        pytest.param({"cohabit.dev/gpu-count": "4", "team": "a"}, {}, id="in-place"),
        pytest.param({}, {"cohabit.dev/gpu-count": "4"}, id="node-registered-again"),
        pytest.param(
            {"cohabit.dev/gpu-count": "4", "cohabit.dev/gpu-9-uuid": "GPU-x"},
            {"cohabit.dev/gpu-9-uuid": None},
            id="stale-one-of-ours",
        ),
    ],
)
def test_a_pass_patches_only_what_the_node_does_not_already_say(
    current: dict[str, str], patch: dict[str, str | None]
) -> None:
    assert changes(current, {"cohabit.dev/gpu-count": "4"}) == patch


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

        assert advertiser.reconcile({}) is False  # the Node says nothing of plugins
        (directory / "cohabit-vram-gpu-0.sock").unlink()  # a restarting kubelet clears these
        assert advertiser.reconcile({}) is True
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


def agent(*args: str, env: dict[str, str]) -> subprocess.CompletedProcess[str]:
    """`python -m cohabit.kube.agent ARGS` as the DaemonSet's container runs it."""
    return subprocess.run(
        [sys.executable, "-m", "cohabit.kube.agent", *args],
        capture_output=True, text=True, env=env, timeout=60, check=False,
    )  # fmt: skip


def test_agent_without_node_name_says_what_is_missing() -> None:
    env = {k: v for k, v in os.environ.items() if k != "NODE_NAME"}
    done = agent("--backend", "status-patch", env=env)
    assert done.returncode != 0
    assert done.stderr.strip() == (
        "error: NODE_NAME is not set (the DaemonSet sets it from spec.nodeName)"
    )


def test_a_fleet_file_is_not_measured_so_the_agent_wants_its_memory_report_off(
    tmp_path: Path,
) -> None:
    done = agent(
        "--backend", "status-patch", "--fleet", str(tmp_path / "fleet.yaml"),
        env={**os.environ, "NODE_NAME": NODE},
    )  # fmt: skip
    assert done.returncode == 2
    assert done.stderr.splitlines()[-1] == (
        "python -m cohabit.kube.agent: error: --fleet describes hardware this machine need not "
        "have, so there is nothing to measure: give --meter-interval 0 with it"
    )


def test_the_node_is_taken_from_the_fleet_file_by_its_name(tmp_path: Path) -> None:
    path = fakes.fixture_path("fleet_gpus_cli.yaml")
    node = node_from_fleet(path, "t4")
    assert [(g.product, g.memory_bytes) for g in node.gpus] == [("Tesla T4", 15360 * 2**20)]
    with pytest.raises(
        AgentError,
        match=r"fleet_gpus_cli.yaml: no node named 'gone' \(it has "
        r"t4, a100, spark, cpu-box\)",
    ):
        node_from_fleet(path, "gone")


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
