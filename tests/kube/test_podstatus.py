"""A serving pod's status → phase, error code, NoFit reason. Pod statuses as the API server
reports them (scheduler messages in kube-scheduler's wording)."""

from __future__ import annotations

from typing import Any

import pytest

from cohabit.kube.crd import Phase
from cohabit.kube.podstatus import pod_report, unschedulable_reason

UNSCHEDULABLE_BUDGET = (
    "0/3 nodes are available: 1 Insufficient cohabit.dev/vram-gb-gpu-0, 2 node(s) didn't "
    "match Pod's node affinity/selector. preemption: 0/3 nodes are available: 1 No preemption "
    "victims found for incoming pod, 2 Preemption is not helpful for scheduling."
)


def status(**fields: Any) -> dict[str, Any]:
    return {"spec": {}, "status": fields}


@pytest.mark.parametrize(
    ("pod", "phase", "code", "no_fit"),
    [
        pytest.param(status(phase="Pending"), Phase.DEPLOYING, None, None, id="pending"),
        pytest.param(
            status(phase="Pending", conditions=[{"type": "PodScheduled", "status": "False",
                   "reason": "Unschedulable", "message": UNSCHEDULABLE_BUDGET}]),
            Phase.FAILED, "NoFitError", "insufficient_capacity", id="unschedulable-budget",
        ),
        pytest.param(
            status(phase="Running", conditions=[{"type": "PodScheduled", "status": "True"},
                                                {"type": "Ready", "status": "False"}]),
            Phase.INITIALIZING, None, None, id="loading",
        ),
        pytest.param(
            status(phase="Running", conditions=[{"type": "Ready", "status": "True"}]),
            Phase.DEPLOYED, None, None, id="ready",
        ),
        pytest.param(
            status(phase="Running", containerStatuses=[{"name": "engine", "state": {"waiting": {
                "reason": "CrashLoopBackOff", "message": "back-off 40s restarting"}},
                "lastState": {"terminated": {"reason": "Error", "exitCode": 1}}}]),
            Phase.ERROR, "CONTAINER_EXITED", None, id="crash-loop",
        ),
        pytest.param(
            status(phase="Running", containerStatuses=[{"name": "engine", "state": {"running": {}},
                "lastState": {"terminated": {"reason": "OOMKilled", "exitCode": 137}}}]),
            Phase.ERROR, "OOM", None, id="oom-killed",
        ),
        pytest.param(
            status(phase="Pending", containerStatuses=[{"name": "engine", "state": {"waiting": {
                "reason": "ImagePullBackOff", "message": "pull access denied"}}}]),
            Phase.ERROR, "RUNTIME_ERROR", None, id="image-pull",
        ),
    ],
)  # fmt: skip
def test_pod_report(pod: dict[str, Any], phase: Phase, code: str | None, no_fit: str | None):
    report = pod_report(pod)
    assert (report.phase, report.error_code) == (phase, code)
    assert (report.no_fit.value if report.no_fit else None) == no_fit


@pytest.mark.parametrize(
    ("message", "whole_gpu_managed", "reason"),
    [
        pytest.param(UNSCHEDULABLE_BUDGET, False, "insufficient_capacity", id="our-budget"),
        pytest.param(
            "0/2 nodes are available: 2 Insufficient nvidia.com/gpu.", True,
            "sharing_not_configured", id="whole-gpu-on-managed-without-sharing",
        ),
        pytest.param(
            "0/2 nodes are available: 2 Insufficient nvidia.com/gpu.", False,
            "insufficient_capacity", id="whole-gpu-elsewhere",
        ),
        pytest.param(
            "0/1 nodes are available: 1 Insufficient nvidia.com/mig-1g.10gb.", True,
            "insufficient_capacity", id="mig-slice",
        ),
        pytest.param(
            "0/1 nodes are available: 1 Insufficient memory.", False,
            "insufficient_system_memory", id="cpu-pool-memory",
        ),
        pytest.param(
            "0/4 nodes are available: 4 node(s) didn't match Pod's node affinity/selector.",
            False, "insufficient_capacity", id="node-gone",
        ),
    ],
)  # fmt: skip
def test_unschedulable_maps_to_no_fit_reasons(
    message: str, whole_gpu_managed: bool, reason: str
) -> None:
    assert unschedulable_reason(message, whole_gpu_managed=whole_gpu_managed).value == reason
