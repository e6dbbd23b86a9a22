"""The pure pieces of `cohabit serve --backend kubernetes` (kube/runtime.py): the names it
gives ModelDeployments, the fit llama.cpp gets in a pod, a ModelDeployment's status as the
reconciler's engine status, and the fleet less what others hold. No server: tests/cluster
runs them against a real one."""

from __future__ import annotations

import re
from datetime import UTC, datetime
from pathlib import Path
from typing import Any

import pytest
from hypothesis import given
from hypothesis import strategies as st

from cohabit.estimate.checkpoint import load_shape
from cohabit.estimate.settings import EngineSettings
from cohabit.hardware.model import Fleet, Gpu, Node, Partition, Vendor
from cohabit.kube import crd
from cohabit.kube.controller import ModelDeploymentRef, launch_request, sized
from cohabit.kube.fleetview import fleet_less_held
from cohabit.kube.runtime import engine_status, md_name, model_deployment
from cohabit.placement.decision import Placement
from cohabit.placement.planner import plan
from cohabit.placement.request import PlacementRequest
from cohabit.placement.state import FleetState, Reservation
from cohabit.runtime.engines.launch import build_launch
from cohabit.runtime.engines.spec import LaunchTarget
from cohabit.runtime.interface import EngineState, LaunchRequest, RuntimeErrorCode
from cohabit.runtime.tinymodel import write_tiny_model
from cohabit.units import GIB

NOW = datetime(2026, 11, 30, 6, 0, tzinfo=UTC)
# The CRD's CEL rule on metadata.name (a Service is named after it), and the pod's suffix.
DNS_1035 = re.compile(r"[a-z]([-a-z0-9]*[a-z0-9])?")
POD_SUFFIX = "-engine"


@given(st.uuids().map(str) | st.text(max_size=120))
def test_every_name_the_control_plane_derives_is_a_dns_1035_label(deployment_id: str) -> None:
    """The API server refuses a ModelDeployment whose name is not a DNS-1035 label (the
    CRD's rule, as for the Service named after it), and a pod name past 63 characters."""
    name = md_name(deployment_id)
    assert DNS_1035.fullmatch(name), name
    assert len(name + POD_SUFFIX) <= 63


T4 = Gpu(index=0, vendor=Vendor.NVIDIA, product="Tesla T4", memory_bytes=15 * GIB)


def placed(fleet: Fleet, vram_gib: int, tp: int = 1) -> Placement:
    request = PlacementRequest(name="d", vram_bytes=vram_gib * GIB, tensor_parallel=tp)
    decision = plan(FleetState(fleet=fleet), request)
    assert isinstance(decision, Placement)
    return decision


def launch(placement: Placement, model_path: str, engine: str = "vllm") -> LaunchRequest:
    return LaunchRequest(
        deployment_id="0b6c1f8e-6f4e-4b4e-9d53-3c1c2d7e9a10",
        engine=engine,
        model_path=model_path,
        served_model_name="chat",
        placement=placement,
        budget_bytes=placement.allocated_bytes,
        device_total_bytes=placement.first.total_bytes,
        settings=EngineSettings(max_model_len=4096),
    )


def test_llamacpp_pod_gets_the_fit_the_local_launcher_makes(tmp_path: Path) -> None:
    """The operator cannot read the GGUF (it is in the pod's volume); the control plane fits
    the layers and context from it and carries them, so the pod's llama-server gets what a
    local one would for the same budget."""
    gguf = write_tiny_model(tmp_path / "tiny.gguf")
    request = launch(placed(Fleet(nodes=(Node(name="n", gpus=(T4,)),)), 2), str(gguf), "llamacpp")
    body = model_deployment(request, namespace="team-a")
    spec = crd.parse_spec(body["spec"], name="team-a/x")
    ref = ModelDeploymentRef(
        name="x", namespace="team-a", uid=None, generation=1, spec=body["spec"], status={}
    )
    in_pod = launch_request(ref, spec, request.placement, sized(ref.key, spec))
    where = LaunchTarget(port=8080, executable="llama-server")
    local = build_launch(request, where, shape=load_shape(gguf))
    assert build_launch(in_pod, where).argv == local.argv


def _gpu(gpu: Gpu) -> dict[str, Any]:
    return {name: getattr(gpu, name) for name in gpu.__dataclass_fields__}


@pytest.mark.parametrize(
    ("status", "state", "code", "message"),
    [
        pytest.param({}, EngineState.STARTING, None, None, id="no-status-yet"),
        pytest.param(
            {"phase": "DEPLOYED", "conditions": [{"type": "Ready", "status": "True",
             "lastTransitionTime": "2026-11-30T06:00:00Z"}]},
            EngineState.READY, None, None, id="ready",
        ),
        pytest.param(
            {"phase": "ERROR", "lastErrorCode": "OOM", "lastErrorMessage": "killed",
             "lastErrorAt": "2026-11-30T05:59:00Z"},
            EngineState.FAILED, RuntimeErrorCode.OOM, "killed", id="runtime-code-kept",
        ),
        pytest.param(
            {"phase": "FAILED", "lastErrorCode": "NoFitError",
             "lastErrorMessage": "insufficient_capacity: 0/1 nodes are available"},
            EngineState.FAILED, RuntimeErrorCode.RUNTIME_ERROR,
            "NoFitError: insufficient_capacity: 0/1 nodes are available",
            id="cluster-refused-the-pin",
        ),
        pytest.param(
            {"phase": "FAILED", "lastErrorCode": "NoFitError", "observedGeneration": 1},
            EngineState.STARTING, None, None, id="stale-status-of-an-older-spec",
        ),
        pytest.param({"phase": "STOPPED"}, EngineState.STOPPED, None, None, id="stopped-by-hand"),
    ],
)  # fmt: skip
def test_status_maps_to_engine_status(
    status: dict[str, Any],
    state: EngineState,
    code: RuntimeErrorCode | None,
    message: str | None,
) -> None:
    md = {"metadata": {"name": "x", "generation": 2}, "status": status}
    found = engine_status(md, key="team-a/x", now=NOW)
    assert (found.state, found.error_code) == (state, code)
    if message is not None:
        assert found.error_message == message
        assert found.error_at is not None


def test_status_of_a_vanished_or_slow_model_deployment() -> None:
    gone = engine_status(None, key="team-a/x", now=NOW)
    assert (gone.state, gone.error_code) == (EngineState.FAILED, RuntimeErrorCode.CONTAINER_EXITED)
    slow = engine_status(
        {
            "metadata": {"creationTimestamp": "2026-11-30T05:00:00Z"},
            "status": {"phase": "DEPLOYING"},
        },
        key="team-a/x",
        now=NOW,
        startup_timeout_s=600,
    )
    assert (slow.state, slow.error_code) == (EngineState.FAILED, RuntimeErrorCode.STARTUP_TIMEOUT)


@pytest.mark.parametrize(
    ("node", "held", "expected"),
    [
        pytest.param(Node(name="n", gpus=(T4,)), [(0, None, 4)], 11 * GIB, id="shared-gpu"),
        pytest.param(
            Node(name="n", gpus=(Gpu(**{**_gpu(T4), "partitions": (
                Partition(profile="1g.5gb", memory_bytes=5 * GIB),
                Partition(profile="1g.5gb", memory_bytes=5 * GIB))}),)),
            [(0, 1, 5)], 5 * GIB, id="mig-slice-taken",
        ),
        pytest.param(
            Node(name="n", memory_bytes=64 * GIB), [(None, None, 16)], 40 * GIB, id="cpu-pool",
        ),
    ],
)  # fmt: skip
def test_fleet_less_held_takes_off_others_but_not_ours(
    node: Node, held: list[tuple[int | None, int | None, int]], expected: int
) -> None:
    """`expected`: the total free capacity left to the control plane; ours never subtracts."""
    theirs = [
        Reservation(deployment="team-b/x", node="n", gpu_index=g, partition_index=p,
                    reserved_bytes=size * GIB)
        for g, p, size in held
    ]  # fmt: skip
    state = FleetState(fleet=Fleet(nodes=(node,)), reservations=tuple(theirs))
    mine = Reservation(
        deployment="team-a/cohabit-1",
        node="n",
        gpu_index=held[0][0],
        partition_index=held[0][1],
        reserved_bytes=GIB,
    )
    fleet = fleet_less_held(state.with_reservations([mine]), keep={"team-a/cohabit-1"})
    assert sum(FleetState(fleet=fleet).free_bytes()) == expected
