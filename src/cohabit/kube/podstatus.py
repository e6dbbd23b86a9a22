"""A serving pod's state → the deployment's phase, error code, or NoFit reason.

Pure: the operator's pod handler passes the pod's wire JSON. A pod the kube-scheduler leaves
`Unschedulable` is the cluster saying "does not fit" after our own plan said it would (other
tenants' pods, a budget the kubelet zeroed): it maps to the same NoFit reasons.
"""

from __future__ import annotations

import re
from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any

from cohabit.kube.crd import Phase
from cohabit.placement.reasons import NoFitReason
from cohabit.runtime.interface import RuntimeErrorCode

_INSUFFICIENT = re.compile(r"Insufficient ([A-Za-z0-9./_-]*[A-Za-z0-9])")
_WAITING_FAULTS: Mapping[str, RuntimeErrorCode] = {
    "CrashLoopBackOff": RuntimeErrorCode.CONTAINER_EXITED,
    "ErrImagePull": RuntimeErrorCode.RUNTIME_ERROR,
    "ImagePullBackOff": RuntimeErrorCode.RUNTIME_ERROR,
    "InvalidImageName": RuntimeErrorCode.RUNTIME_ERROR,
    "CreateContainerConfigError": RuntimeErrorCode.RUNTIME_ERROR,
    "CreateContainerError": RuntimeErrorCode.RUNTIME_ERROR,
}


@dataclass(frozen=True, slots=True, kw_only=True)
class PodReport:
    """What one look at the pod says. `no_fit` is set when the scheduler refused it."""

    phase: Phase
    ready: bool = False
    error_code: str | None = None
    message: str = ""
    no_fit: NoFitReason | None = None


def pod_report(pod: Mapping[str, Any], *, whole_gpu_managed: bool = False) -> PodReport:
    """Read a pod. `whole_gpu_managed`: it asks for whole GPUs on a managed cluster without
    sharing, where "Insufficient nvidia.com/gpu" means `sharing_not_configured`."""
    status = pod.get("status") or {}
    conditions = {c.get("type"): c for c in status.get("conditions") or []}
    scheduled = conditions.get("PodScheduled") or {}
    if scheduled.get("status") == "False" and scheduled.get("reason") == "Unschedulable":
        message = str(scheduled.get("message") or "the scheduler found no node")
        return PodReport(
            phase=Phase.FAILED,
            error_code="NoFitError",
            message=message,
            no_fit=unschedulable_reason(message, whole_gpu_managed=whole_gpu_managed),
        )
    fault = _container_fault(status)
    if fault is not None:
        return fault
    if status.get("phase") == "Failed":
        return PodReport(
            phase=Phase.FAILED,
            error_code=RuntimeErrorCode.CONTAINER_EXITED.value,
            message=str(status.get("message") or status.get("reason") or "pod failed"),
        )
    if (conditions.get("Ready") or {}).get("status") == "True":
        return PodReport(phase=Phase.DEPLOYED, ready=True)
    if scheduled.get("status") == "True" or pod.get("spec", {}).get("nodeName"):
        return PodReport(phase=Phase.INITIALIZING)
    return PodReport(phase=Phase.DEPLOYING)


def unschedulable_reason(message: str, *, whole_gpu_managed: bool = False) -> NoFitReason:
    """The scheduler's "0/3 nodes are available: 1 Insufficient cohabit.dev/vram-gb-gpu-0, …"
    as a NoFit reason: host memory → insufficient_system_memory; whole vendor GPUs on a
    managed cluster without sharing → sharing_not_configured; anything else (our budgets, MIG
    slices, a node that went away) → insufficient_capacity."""
    names = _INSUFFICIENT.findall(message)
    if any(name in ("nvidia.com/gpu", "amd.com/gpu") for name in names) and whole_gpu_managed:
        return NoFitReason.SHARING_NOT_CONFIGURED
    if names and all(name == "memory" for name in names):
        return NoFitReason.INSUFFICIENT_SYSTEM_MEMORY
    return NoFitReason.INSUFFICIENT_CAPACITY


def _container_fault(status: Mapping[str, Any]) -> PodReport | None:
    for container in status.get("containerStatuses") or []:
        state = container.get("state") or {}
        last = (container.get("lastState") or {}).get("terminated") or {}
        terminated = state.get("terminated") or {}
        for ended in (terminated, last):
            if ended.get("reason") == "OOMKilled":
                return PodReport(
                    phase=Phase.ERROR,
                    error_code=RuntimeErrorCode.OOM.value,
                    message="the engine was killed for using more host memory than its limit",
                )
        waiting = state.get("waiting") or {}
        code = _WAITING_FAULTS.get(str(waiting.get("reason")))
        if code is not None:
            detail = waiting.get("message") or waiting.get("reason")
            if last.get("exitCode") is not None:
                detail = f"{detail} (last exit code {last['exitCode']})"
            return PodReport(phase=Phase.ERROR, error_code=code.value, message=str(detail))
    return None
