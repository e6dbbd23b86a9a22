"""Engines are pointed at the reserved device by identity (`visible_devices`): NVIDIA GPUs
and MIG slices by UUID, an index only in PCI bus order, AMD through ROCr's variable, nothing
for memory pools. The mixed workstation snapshot (an 8 GB RTX 3060 Ti on bus 01, a 24 GB RTX
3090 on bus 02) is a machine where NVML's order and CUDA's default order differ; CUDA's view of
each environment is worked out by tests/runtime/cuda_order.py from the CUDA documentation's
rules (no GPU here)."""

from __future__ import annotations

from dataclasses import replace

import pytest

from cohabit.hardware.amd import discover_amd
from cohabit.hardware.model import Fleet, Gpu, Node, Partition, Vendor
from cohabit.hardware.nvidia import discover_nvidia
from cohabit.placement.decision import Placement
from cohabit.placement.planner import plan
from cohabit.placement.request import PlacementRequest
from cohabit.placement.state import FleetState
from cohabit.runtime.engines.spec import visible_devices
from cohabit.runtime.errors import LaunchError
from cohabit.runtime.interface import LaunchRequest
from cohabit.units import GIB
from tests.hardware import fakes
from tests.runtime.conftest import FLEETS
from tests.runtime.cuda_order import visible_cards

WORKSTATION = "nvml_workstation_3060ti_3090.json"
RTX_3060_TI = "GPU-3c9a1f07-5b2e-8d44-0a6f-e1b27c9d4a30"
RTX_3090 = "GPU-8e41d2b6-07c3-f915-62ad-4b0e9f3c7d12"
MIG_UUID = "MIG-1f3c9a2e-77aa-5b1c-9e0d-2b6a9c1d4e5f"


def workstation(*, uuids: bool = True) -> Fleet:
    node = discover_nvidia(fakes.nvml(WORKSTATION), name="ws")
    assert node is not None
    if not uuids:
        node = replace(node, gpus=tuple(replace(gpu, uuid=None) for gpu in node.gpus))
    return Fleet(nodes=(node,))


def request_on(fleet: Fleet, gib: float, *, tp: int = 1) -> LaunchRequest:
    decision = plan(
        FleetState(fleet=fleet),
        PlacementRequest(name="dep", vram_bytes=int(gib * GIB), tensor_parallel=tp),
    )
    assert isinstance(decision, Placement), decision
    return LaunchRequest(
        deployment_id="dep",
        engine="vllm",
        model_path="/models/m",
        served_model_name="m",
        placement=decision,
        budget_bytes=decision.allocated_bytes,
        device_total_bytes=decision.first.total_bytes,
    )


@pytest.mark.parametrize(
    ("gib", "gpu_index", "card"),
    [(6, 0, RTX_3060_TI), (16, 1, RTX_3090)],
    ids=["fits-the-8gb-card", "needs-the-24gb-card"],
)
@pytest.mark.parametrize("uuids", [True, False], ids=["by-uuid", "by-bus-index"])
def test_the_engine_sees_the_card_placement_reserved(
    gib: int, gpu_index: int, card: str, uuids: bool
) -> None:
    """Binpack puts 6 GiB on the 8 GB card and 16 GiB on the 24 GB one. By UUID, or (UUID
    unknown) by NVML index with PCI bus order, CUDA shows the engine that card and no other."""
    request = request_on(workstation(uuids=uuids), gib)
    assert request.placement.first.gpu_index == gpu_index
    env = visible_devices(request)
    assert visible_cards(fakes.load(WORKSTATION), env) == [card]
    if uuids:
        assert env == {"CUDA_VISIBLE_DEVICES": card}
    else:
        assert env == {"CUDA_DEVICE_ORDER": "PCI_BUS_ID", "CUDA_VISIBLE_DEVICES": str(gpu_index)}


def test_on_this_machine_a_bare_index_is_the_wrong_card() -> None:
    """Why identities: CUDA's default order puts the faster 3090 first, so NVML's index 1
    (the 3090) given alone would start the engine on the 8 GB 3060 Ti."""
    snapshot = fakes.load(WORKSTATION)
    assert visible_cards(snapshot, {"CUDA_VISIBLE_DEVICES": "1"}) == [RTX_3060_TI]
    assert visible_cards(snapshot, {}) == [RTX_3090, RTX_3060_TI]


def mig_fleet(uuid: str | None) -> Fleet:
    gpu = Gpu(
        index=0,
        vendor=Vendor.NVIDIA,
        product="A100",
        memory_bytes=80 * GIB,
        uuid="GPU-5d2a",
        partitions=(Partition(profile="3g.40gb", memory_bytes=40 * GIB, uuid=uuid),),
    )
    return Fleet(nodes=(Node(name="node-m", gpus=(gpu,)),))


def cpx_fleet() -> Fleet:
    node = discover_amd(fakes.amdsmi("amdsmi_mi300x_cpx.json"), name="node-x")
    assert node is not None
    return Fleet(nodes=(node,))


@pytest.mark.parametrize(
    ("fleet", "gib", "tp", "env"),
    [
        pytest.param(
            FLEETS["nvidia"], 30, 2,
            {"CUDA_VISIBLE_DEVICES": "GPU-node-a-0,GPU-node-a-1"}, id="nvidia-tp2",
        ),
        pytest.param(mig_fleet(MIG_UUID), 20, 1, {"CUDA_VISIBLE_DEVICES": MIG_UUID}, id="mig"),
        pytest.param(
            FLEETS["amd"], 48, 1,
            {
                "ROCR_VISIBLE_DEVICES": "GPU-node-b-0",
                "HIP_VISIBLE_DEVICES": "0",
                "CUDA_VISIBLE_DEVICES": "0",
            },
            id="amd-by-uuid",
        ),
        pytest.param(
            cpx_fleet(), 20, 1,
            {"ROCR_VISIBLE_DEVICES": "0", "HIP_VISIBLE_DEVICES": "0", "CUDA_VISIBLE_DEVICES": "0"},
            id="amd-partitions-by-rocr-index",
        ),
        pytest.param(FLEETS["cpu"], 4, 1, {}, id="cpu-pool"),
        pytest.param(FLEETS["apple"], 4, 1, {}, id="unified-pool"),
    ],
)  # fmt: skip
def test_visible_devices(fleet: Fleet, gib: int, tp: int, env: dict[str, str]) -> None:
    assert visible_devices(request_on(fleet, gib, tp=tp)) == env


def test_a_mig_slice_without_its_uuid_is_refused_not_given_its_card() -> None:
    """The slice's card UUID would show CUDA a MIG-enabled card, which runs nothing."""
    with pytest.raises(LaunchError, match=r"mig 3g\.40gb #0 has no UUID.*nvidia-smi -L"):
        visible_devices(request_on(mig_fleet(None), 20))
