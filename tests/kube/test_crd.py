"""The ModelDeployment models: specs parsed (or refused with one line naming the field), the
status written on the wire, and read back as the control plane's placement fields."""

from __future__ import annotations

from datetime import UTC, datetime
from typing import Any

import pytest

from cohabit.kube import crd
from cohabit.kube.errors import InvalidSpec


def test_spec_defaults() -> None:
    spec = crd.parse_spec({"model": "Qwen/Qwen3-0.6B"}, name="ns/a")
    assert (spec.engine, spec.tensor_parallel_size, spec.state, spec.service_port) == (
        "vllm",
        1,
        "running",
        8080,
    )
    assert spec.vram_bytes is None


@pytest.mark.parametrize(
    ("spec", "message"),
    [
        pytest.param({}, "ModelDeployment ns/a: spec.model: Field required", id="no-model"),
        pytest.param(
            {"model": "m", "vram": "lots"},
            "ModelDeployment ns/a: spec.vram: Value error, spec.vram: cannot read 'lots' as a "
            "size (examples: 16GiB, 15360MiB, 20GB)",
            id="bad-size",
        ),
        pytest.param(
            {"model": "m", "engine": "tgi"},
            "ModelDeployment ns/a: spec.engine: Input should be 'vllm' or 'llamacpp'",
            id="unknown-engine",
        ),
        pytest.param(
            {"model": "m", "tensorParalelSize": 2},
            "ModelDeployment ns/a: spec.tensorParalelSize: Extra inputs are not permitted",
            id="typo",
        ),
    ],
)
def test_bad_specs_name_the_field(spec: dict[str, Any], message: str) -> None:
    with pytest.raises(InvalidSpec) as raised:
        crd.parse_spec(spec, name="ns/a")
    assert str(raised.value) == message


def test_status_round_trips_to_placement_fields() -> None:
    now = datetime(2026, 11, 30, 6, 0, tzinfo=UTC)
    status = crd.ModelDeploymentStatus(
        phase=crd.Phase.DEPLOYED,
        topology="standalone_cluster",
        node="edge-t4-0",
        gpu_indices=(1,),
        hardware_class="software_shared",
        sharing_class="fractional",
        gpu_vendor="nvidia",
        allocated_bytes=6 << 30,
        allocated_capacity_gb=6,
        conditions=(crd.condition(crd.READY, ok=True, reason="Ready", now=now),),
    )
    wire = status.to_wire()
    assert wire["gpuIndices"] == [1]
    assert wire["conditions"][0]["lastTransitionTime"] == "2026-11-30T06:00:00Z"
    assert wire["lastErrorCode"] is None  # sent as null: a merge patch clears old errors
    assert crd.placement_fields(wire) == {
        "topology": "standalone_cluster",
        "node": "edge-t4-0",
        "gpu_indices": [1],
        "partition": None,
        "hardware_class": "software_shared",
        "sharing_class": "fractional",
        "gpu_vendor": "nvidia",
        "allocated_bytes": 6 << 30,
        "allocated_capacity_gb": 6,
        "notices": [],
    }


def test_status_ignores_fields_it_does_not_own() -> None:
    assert crd.parse_status({"phase": "FAILED", "kopf": {"progress": {}}}).phase is crd.Phase.FAILED
