"""The warm tier's choices as tables (service/control/warm.py): which deployments are started
able to sleep, and the bytes a sleep keeps on the GPU and parks in host memory. The acts
themselves run end to end in tests/e2e/test_warm_tier.py."""

from __future__ import annotations

from dataclasses import replace
from typing import Any

import pytest

from cohabit.estimate.engines import CUDA_CONTEXT_BYTES, VLLM_NON_TORCH_BYTES
from cohabit.estimate.estimate import estimate_shape
from cohabit.estimate.settings import EngineSettings
from cohabit.placement.decision import PlacementFields
from cohabit.service.control.warm import residue_bytes, sleeps_when_idle, weights_bytes
from cohabit.store.database import utcnow
from cohabit.store.records import DeploymentRecord, DeploymentStatus, Scaling
from tests.estimate.conftest import shape_of

LLAMA = estimate_shape(
    shape_of("llama-3.1-8b-instruct"), settings=EngineSettings(max_model_len=16000)
)


def placed_on(vendor: str | None, hardware_class: str) -> PlacementFields:
    return PlacementFields(
        topology="standalone_cluster",
        node_name="node-a",
        gpu_index=0,
        gpu_indices=(0,),
        partition=None,
        gpu_vendor=vendor,
        gpu_id="GPU-0",
        hardware_class=hardware_class,
        sharing_class="shared",
        allocated_bytes=24 << 30,
        device_total_bytes=80 << 30,
        notices=(),
    )


def record(**fields: Any) -> DeploymentRecord:
    base = DeploymentRecord(
        id="d",
        model_id="m",
        config_id="c",
        file_id=None,
        model_name="tiny",
        engine="vllm",
        request={},
        model_path="/models/tiny",
        requested_bytes=24 << 30,
        tensor_parallel=1,
        max_model_len=None,
        estimate=LLAMA.to_dict(),
        scaling=Scaling(min_copies=0),
        status=DeploymentStatus.DEPLOYED,
        placement=placed_on("nvidia", "software_shared"),
        no_fit=None,
        last_error_code=None,
        last_error_message=None,
        last_error_at=None,
        engine_handle=None,
        claimed_by=None,
        claimed_until=None,
        requested_at=utcnow(),
        deployed_at=None,
        stopped_at=None,
        released_at=None,
    )
    return replace(base, **fields)


@pytest.mark.parametrize(
    ("fields", "enabled", "sleeps"),
    [
        ({}, True, True),
        ({}, False, False),
        ({"scaling": Scaling(min_copies=1)}, True, False),
        ({"scaling": Scaling(min_copies=0, starting_copies=2, max_copies=3)}, True, True),
        ({"copy_of": "d0", "copy_index": 1}, True, True),  # each copy decides alone
        ({"engine": "llamacpp"}, True, False),
        ({"engine": "mlx"}, True, False),
        ({"placement": placed_on("amd", "software_shared")}, True, False),
        ({"placement": placed_on(None, "cpu")}, True, False),
        ({"placement": placed_on("nvidia", "hardware_isolated")}, True, True),
        ({"placement": None}, True, True),  # not placed yet: the launch decides on the GPU
    ],
    ids=[
        "vllm-nvidia",
        "tier-off",
        "never-unloads",
        "several-copies",
        "a-copy",
        "llamacpp",
        "mlx",
        "amd",
        "cpu",
        "mig",
        "unplaced",
    ],
)
def test_only_scale_to_zero_vllm_on_nvidia_sleeps(
    fields: dict[str, Any], enabled: bool, sleeps: bool
) -> None:
    assert sleeps_when_idle(record(**fields), enabled=enabled) is sleeps


def test_the_residue_is_the_estimates_overhead_and_the_weights_go_to_the_host() -> None:
    """Llama-3.1-8B at 16,000 tokens: 512 MiB CUDA context + 160 MiB workspaces + 156 MiB
    CUDA graphs stay on the card; its 16,060,522,496 bytes of bf16 weights go to the host."""
    sized = record()
    assert residue_bytes(sized) == 868_220_928
    assert weights_bytes(sized) == 16_060_522_496
    unsized = record(estimate=None)
    assert residue_bytes(unsized) == CUDA_CONTEXT_BYTES + VLLM_NON_TORCH_BYTES
    assert weights_bytes(unsized) == 0  # level 2: nothing to park
