"""Engine pods' inputs for their builders' tests: a recorded node, a spec, the placement the
planner makes there, as `ServingTarget`s (tests/kube/test_resources.py checks the pods built,
tests/cluster/test_engine_pod.py that a real API server admits them)."""

from __future__ import annotations

from typing import Any

from cohabit.estimate.estimate import Estimate
from cohabit.estimate.settings import EngineSettings
from cohabit.hardware.model import Topology
from cohabit.kube.crd import ModelDeploymentSpec
from cohabit.kube.fleetview import cluster_view
from cohabit.kube.resources import ServingTarget
from cohabit.placement.decision import Placement
from cohabit.placement.planner import plan
from cohabit.placement.request import PlacementRequest
from cohabit.runtime.interface import LaunchRequest
from cohabit.units import GIB
from tests.kube.conftest import node_object

STANDALONE_T4 = ("labels_cohabit_standalone.json", Topology.STANDALONE_CLUSTER)
ONE_T4 = ("labels_t4_standalone.json", Topology.STANDALONE_CLUSTER)
MANAGED_T4 = ("labels_t4.json", Topology.MANAGED_CLUSTER)
MIG_MIXED = ("labels_mig_mixed.json", Topology.MANAGED_CLUSTER)
GB10 = ("labels_gb10_standalone.json", Topology.STANDALONE_CLUSTER)
CPU = ("labels_cpu.json", Topology.STANDALONE_CLUSTER)
AMD = ("labels_amd_mi300x_cpx.json", Topology.MANAGED_CLUSTER)


def target(
    fixture: str,
    topology: Topology,
    spec: dict[str, Any],
    *,
    inject: bool = False,
    fractional: bool = True,
    estimate: Estimate | None = None,
    shape: Any = None,
    hard_limit_library: str | None = None,
) -> ServingTarget:
    parsed = ModelDeploymentSpec.model_validate(spec)
    view = cluster_view([node_object(fixture)], [], topology=topology, fractional=fractional)
    request = PlacementRequest(
        name="team-a/chat",
        vram_bytes=parsed.vram_bytes or GIB,
        tensor_parallel=parsed.tensor_parallel_size,
        engine=parsed.engine,
    )
    placement = plan(view.state, request)
    assert isinstance(placement, Placement), placement
    return ServingTarget(
        name="chat",
        namespace="team-a",
        uid="3f1c9a52-8a7e-4c43-9d3b-6a0f2f6f7b10",
        generation=1,
        spec=parsed,
        placement=placement,
        naming=view.resources[placement.node],
        launch=launch_of(parsed, placement, estimate),
        shape=shape,
        inject_visible_devices=inject,
        hard_limit_library=hard_limit_library,
    )


def launch_of(
    spec: ModelDeploymentSpec, placement: Placement, estimate: Estimate | None
) -> LaunchRequest:
    """The request the reconciler gives a local backend for this placement (budget per
    device, the device's total, the settings and the estimate admission sized)."""
    return LaunchRequest(
        deployment_id="team-a/chat",
        engine=spec.engine,
        model_path=spec.model,
        served_model_name="chat",
        placement=placement,
        budget_bytes=placement.allocated_bytes,
        device_total_bytes=placement.first.total_bytes,
        settings=EngineSettings(max_model_len=spec.config.max_model_len),
        estimate=estimate,
    )
