"""The DRA kubelet plugin of `gpu.cohabit.dev` against the kubelet's protocol: no kubelet runs
here, so the kubelet is played by a gRPC client speaking it over the plugin's unix sockets in
a temporary directory, the calls the kubelet makes:
- the plugin watcher's GetInfo, then NotifyRegistrationStatus, on <driver>-reg.sock
  (kubernetes pkg/kubelet/pluginmanager/operationexecutor/operation_generator.go,
  messages from k8s.io/kubelet pkg/apis/pluginregistration/v1/api.proto);
- the DRA manager's NodePrepareResources and NodeUnprepareResources on dra.sock, one Claim
  (namespace, uid, name) each, answers keyed by claim uid (kubernetes
  pkg/kubelet/cm/dra/plugin/dra_plugin.go, messages from k8s.io/kubelet
  pkg/apis/dra/v1/api.proto, tag v0.37.0-beta.0).
Claims are ResourceClaims as the API server returns them once the scheduler allocated them
(k8s.io/api resource/v1 types.go: AllocationResult, DeviceRequestAllocationResult); GPUs
come from the recorded NVML snapshots of tests/fixtures/hardware."""

from __future__ import annotations

import json
from collections.abc import Callable, Iterator, Mapping
from pathlib import Path
from typing import Any

import grpc
import pytest

from cohabit.hardware.model import Node
from cohabit.kube import dra
from cohabit.kube.draplugin.plugin import (
    DraPluginServer,
    dra_pb2,
    dra_pb2_grpc,
    registration_pb2,
    registration_pb2_grpc,
)
from cohabit.units import GIB
from tests.cluster.inventory import discovered, recording

NODE = "gpu-node-0"
NAMESPACE = "models"
T4_0 = "GPU-5f0c2b7e-9a1d-4c3e-8b6a-1d2e3f405a61"
T4_1 = "GPU-7a1b3c5d-2e4f-4a6b-9c8d-0e1f2a3b4c52"
H100_0_MIG_2 = "MIG-8e9f0a1b-2c3d-5e4f-9a5b-6c7d8e9f0a93"  # gpu-0-part-2, a 1g.10gb
SHARE = "0b6f4c1e-3a2d-4e5f-9a8b-7c6d5e4f3a21"
T4_BYTES = 15360 * 1024**2  # the T4's 15360 MiB, all of it
MIG_1G_BYTES = 10334765056  # the recorded 1g.10gb instance


def result(
    device: str, *, pool: str = NODE, gib: int | None = None, share: str | None = None
) -> dict[str, Any]:
    """One DeviceRequestAllocationResult of request "gpu" (the one `dra.memory_claim` asks);
    `gib`: the consumed memory of a shared device (absent for a device taken whole)."""
    found: dict[str, Any] = {
        "request": "gpu",
        "driver": dra.DRIVER,
        "pool": pool,
        "device": device,
    }
    if share is not None:
        found["shareID"] = share
    if gib is not None:
        found["consumedCapacity"] = {dra.MEMORY: f"{gib}Gi"}
    return found


def allocated_claim(name: str, uid: str, results: list[dict[str, Any]]) -> dict[str, Any]:
    """`dra.memory_claim`'s claim as the API server returns it allocated: its uid and
    status.allocation (the devices' results and the node they pin the pod to)."""
    claim = dra.memory_claim(
        name=name, namespace=NAMESPACE, shards=len(results), bytes_per_shard=6 * GIB
    )
    claim["metadata"]["uid"] = uid
    pools = sorted({r["pool"] for r in results})
    claim["status"] = {
        "allocation": {
            "devices": {"results": results},
            "nodeSelector": {
                "nodeSelectorTerms": [
                    {"matchFields": [{"key": "metadata.name", "operator": "In", "values": pools}]}
                ]
            },
        }
    }
    return claim


class FakeKubelet:
    """The kubelet's side of the plugin's two sockets (see the module docstring)."""

    def __init__(self, server: DraPluginServer) -> None:
        self.registration_channel = grpc.insecure_channel(f"unix://{server.registration_socket}")
        self.dra_channel = grpc.insecure_channel(f"unix://{server.dra_socket}")
        self.registration = registration_pb2_grpc.RegistrationStub(self.registration_channel)
        self.dra = dra_pb2_grpc.DRAPluginStub(self.dra_channel)

    def prepare(self, *claims: tuple[str, str]) -> dict[str, Any]:
        """NodePrepareResources for (name, uid) claims in NAMESPACE; answers by uid."""
        request = dra_pb2.NodePrepareResourcesRequest(
            claims=[dra_pb2.Claim(namespace=NAMESPACE, name=n, uid=u) for n, u in claims]
        )
        return dict(self.dra.NodePrepareResources(request, timeout=10).claims)

    def unprepare(self, *claims: tuple[str, str]) -> dict[str, Any]:
        request = dra_pb2.NodeUnprepareResourcesRequest(
            claims=[dra_pb2.Claim(namespace=NAMESPACE, name=n, uid=u) for n, u in claims]
        )
        return dict(self.dra.NodeUnprepareResources(request, timeout=10).claims)

    def close(self) -> None:
        self.registration_channel.close()
        self.dra_channel.close()


Serve = Callable[[Node, Mapping[str, dict[str, Any]]], tuple[DraPluginServer, FakeKubelet]]


@pytest.fixture
def serve(tmp_path: Path) -> Iterator[Serve]:
    """Start the plugin for a node whose API server holds `claims` (by name); short folder
    names, as unix socket paths are limited to ~107 bytes."""
    started: list[tuple[DraPluginServer, FakeKubelet]] = []

    def start(
        node: Node, claims: Mapping[str, dict[str, Any]]
    ) -> tuple[DraPluginServer, FakeKubelet]:
        def read_claim(namespace: str, name: str) -> dict[str, Any] | None:
            return claims.get(name) if namespace == NAMESPACE else None

        server = DraPluginServer(
            node,
            read_claim,
            plugins_dir=tmp_path / "p",
            registry_dir=tmp_path / "r",
            cdi_dir=tmp_path / "cdi",
        )
        server.start()
        kubelet = FakeKubelet(server)
        started.append((server, kubelet))
        return server, kubelet

    yield start
    for server, kubelet in started:
        kubelet.close()
        server.stop()


def t4(cards: int = 1) -> Node:
    return discovered(NODE, recording("nvml_t4x4.json", cards=cards))


def h100_mig() -> Node:
    return discovered(NODE, recording("nvml_h100_mig_mixed.json"))


def spec_of(server: DraPluginServer, uid: str) -> dict[str, Any]:
    return json.loads((server.cdi_dir / f"gpu.cohabit.dev-{uid}.json").read_text())


def test_the_plugin_watcher_learns_the_driver_and_its_dra_socket(serve: Serve) -> None:
    server, kubelet = serve(t4(), {})
    info = kubelet.registration.GetInfo(registration_pb2.InfoRequest(), timeout=10)
    assert (info.type, info.name, list(info.supported_versions)) == (
        "DRAPlugin",
        "gpu.cohabit.dev",
        ["v1.DRAPlugin"],
    )
    assert info.endpoint == str(server.plugins_dir / "gpu.cohabit.dev" / "dra.sock")
    assert server.registration_socket == server.registry_dir / "gpu.cohabit.dev-reg.sock"
    assert not server.registration.registered.is_set()

    refused = registration_pb2.RegistrationStatus(plugin_registered=False, error="no handler")
    kubelet.registration.NotifyRegistrationStatus(refused, timeout=10)
    assert (server.registration.registered.is_set(), server.registration.error) == (
        False,
        "no handler",
    )
    taken = registration_pb2.RegistrationStatus(plugin_registered=True)
    kubelet.registration.NotifyRegistrationStatus(taken, timeout=10)
    assert (server.registration.registered.is_set(), server.registration.error) == (True, None)


@pytest.mark.parametrize(
    ("node", "results", "devices", "runtime_env", "device_env"),
    [
        pytest.param(
            t4, [result("gpu-0", gib=6, share=SHARE)],
            ["gpu-0"],
            [f"NVIDIA_VISIBLE_DEVICES={T4_0}"],
            [[f"COHABIT_VISIBLE_DEVICE_GPU_0={T4_0}",
              f"COHABIT_MEMORY_LIMIT_BYTES_GPU_0={6 * GIB}"]],
            id="t4-share-6gib",
        ),
        pytest.param(
            lambda: t4(cards=2),
            [result("gpu-0", gib=6, share=SHARE), result("gpu-1", gib=6, share=SHARE)],
            ["gpu-0", "gpu-1"],
            [f"NVIDIA_VISIBLE_DEVICES={T4_0},{T4_1}"],
            [[f"COHABIT_VISIBLE_DEVICE_GPU_0={T4_0}",
              f"COHABIT_MEMORY_LIMIT_BYTES_GPU_0={6 * GIB}"],
             [f"COHABIT_VISIBLE_DEVICE_GPU_1={T4_1}",
              f"COHABIT_MEMORY_LIMIT_BYTES_GPU_1={6 * GIB}"]],
            id="tensor-parallel-2",
        ),
        pytest.param(
            h100_mig, [result("gpu-0-part-2")],
            ["gpu-0-part-2"],
            [f"NVIDIA_VISIBLE_DEVICES={H100_0_MIG_2}"],
            [[f"COHABIT_VISIBLE_DEVICE_GPU_0_PART_2={H100_0_MIG_2}",
              f"COHABIT_MEMORY_LIMIT_BYTES_GPU_0_PART_2={MIG_1G_BYTES}"]],
            id="mig-partition-whole",
        ),
        pytest.param(
            t4, [result("gpu-0")],
            ["gpu-0"],
            [f"NVIDIA_VISIBLE_DEVICES={T4_0}"],
            [[f"COHABIT_VISIBLE_DEVICE_GPU_0={T4_0}",
              f"COHABIT_MEMORY_LIMIT_BYTES_GPU_0={T4_BYTES}"]],
            id="t4-taken-whole",
        ),
    ],
)  # fmt: skip
def test_prepare_answers_cdi_ids_and_writes_the_spec(
    serve: Serve,
    node: Callable[[], Node],
    results: list[dict[str, Any]],
    devices: list[str],
    runtime_env: list[str],
    device_env: list[list[str]],
) -> None:
    uid = "4f1c2d3e-5a6b-4c7d-8e9f-0a1b2c3d4e5f"
    server, kubelet = serve(node(), {"llama": allocated_claim("llama", uid, results)})
    answer = kubelet.prepare(("llama", uid))[uid]
    assert answer.error == ""
    share = [r.get("shareID") for r in results]
    assert [
        (list(d.request_names), d.pool_name, d.device_name, list(d.cdi_device_ids),
         d.share_id if d.HasField("share_id") else None)
        for d in answer.devices
    ] == [
        (["gpu"], NODE, name, [f"gpu.cohabit.dev/claim={uid}-{name}"], s)
        for name, s in zip(devices, share, strict=True)
    ]  # fmt: skip
    assert spec_of(server, uid) == {
        "cdiVersion": "0.5.0",
        "kind": "gpu.cohabit.dev/claim",
        "devices": [
            {"name": f"{uid}-{name}", "containerEdits": {"env": env}}
            for name, env in zip(devices, device_env, strict=True)
        ],
        "containerEdits": {"env": runtime_env},
    }


def test_a_stale_uid_fails_that_claim_only(serve: Serve) -> None:
    """The kubelet names a claim that was deleted and made again under the same name: that
    one answers an error, the other claim in the same call is prepared."""
    good, stale, recreated = (
        "1a2b3c4d-0000-4000-8000-000000000001",
        "1a2b3c4d-0000-4000-8000-000000000002",
        "1a2b3c4d-0000-4000-8000-000000000003",
    )
    claims = {
        "good": allocated_claim("good", good, [result("gpu-0", gib=6, share=SHARE)]),
        "again": allocated_claim("again", recreated, [result("gpu-0", gib=4)]),
    }
    server, kubelet = serve(t4(), claims)
    answers = kubelet.prepare(("good", good), ("again", stale))
    assert answers[good].error == ""
    assert [d.device_name for d in answers[good].devices] == ["gpu-0"]
    assert answers[stale].error == (
        f"ResourceClaim models/again has uid {recreated}, the kubelet asked for {stale} "
        "(deleted and created again?)"
    )
    assert list(answers[stale].devices) == []
    assert sorted(p.name for p in server.cdi_dir.iterdir()) == [f"gpu.cohabit.dev-{good}.json"]


@pytest.mark.parametrize(
    ("claims", "error"),
    [
        pytest.param(
            {"llama": allocated_claim("llama", "u-1", [result("gpu-0", pool="other-node")])},
            "ResourceClaim models/llama is allocated on other-node, not on this node gpu-node-0",
            id="other-node",
        ),
        pytest.param(
            {},
            "ResourceClaim models/llama not found",
            id="not-found",
        ),
        pytest.param(
            {"llama": allocated_claim("llama", "u-1", [])},
            "ResourceClaim models/llama has no gpu.cohabit.dev device allocated",
            id="not-allocated",
        ),
        pytest.param(
            {"llama": allocated_claim("llama", "u-1", [result("gpu-3", gib=6)])},
            "ResourceClaim models/llama: node gpu-node-0 has no device gpu-3 "
            "(its hardware changed since the slices were published?)",
            id="unknown-device",
        ),
    ],
)
def test_a_claim_this_node_cannot_prepare_answers_why(
    serve: Serve, claims: dict[str, dict[str, Any]], error: str
) -> None:
    server, kubelet = serve(t4(), claims)
    answer = kubelet.prepare(("llama", "u-1"))["u-1"]
    assert (answer.error, list(answer.devices)) == (error, [])
    assert not server.cdi_dir.exists() or list(server.cdi_dir.iterdir()) == []


def test_unprepare_removes_the_spec_and_a_second_unprepare_succeeds(serve: Serve) -> None:
    uid = "7e6d5c4b-3a29-4180-9f7e-6d5c4b3a2918"
    claims = {"llama": allocated_claim("llama", uid, [result("gpu-0", gib=6, share=SHARE)])}
    server, kubelet = serve(t4(), claims)
    assert kubelet.prepare(("llama", uid))[uid].error == ""
    spec = server.cdi_dir / f"gpu.cohabit.dev-{uid}.json"
    assert spec.exists()
    first = kubelet.unprepare(("llama", uid))
    assert (set(first), first[uid].error, spec.exists()) == ({uid}, "", False)
    again = kubelet.unprepare(("llama", uid))
    assert (set(again), again[uid].error) == ({uid}, "")


def test_stop_removes_both_sockets(serve: Serve) -> None:
    """The plugin watcher deregisters a plugin whose -reg.sock is gone."""
    server, _ = serve(t4(), {})
    assert server.registration_socket.exists() and server.dra_socket.exists()
    server.stop()
    assert not server.registration_socket.exists()
    assert not server.dra_socket.exists()
