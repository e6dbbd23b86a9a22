"""A fault-injecting wrapper around any EngineRuntime, at the seam the control plane calls: for
the deployments chosen (by served model name or deployment id), one step — start, status,
stop, adopt or logs — raises; every other call goes through to the runtime inside unchanged."""

from __future__ import annotations

import threading
from collections.abc import Mapping
from enum import StrEnum

from cohabit.runtime.interface import EngineHandle, EngineRuntime, EngineStatus, LaunchRequest


class Step(StrEnum):
    START = "start"
    STATUS = "status"
    STOP = "stop"
    ADOPT = "adopt"
    LOGS = "logs"


class InjectedFault(RuntimeError):
    """What a chosen step raises; its message names the step and the deployment."""


class FaultyRuntime:
    """`faults` maps a served model name or a deployment id to the step that raises for it."""

    def __init__(self, inner: EngineRuntime, faults: Mapping[str, Step]) -> None:
        self.inner = inner
        self.faults = dict(faults)
        self.raised: list[tuple[Step, str]] = []  # (step, deployment id), in order
        self._lock = threading.Lock()

    def _maybe_raise(self, step: Step, deployment_id: str) -> None:
        with self._lock:
            if self.faults.get(deployment_id) is step:
                self.raised.append((step, deployment_id))
                raise InjectedFault(f"injected {step.value} fault for {deployment_id}")

    def start(self, request: LaunchRequest) -> EngineHandle:
        with self._lock:  # later steps find the deployment by its id
            chosen = self.faults.get(request.served_model_name)
            if chosen is not None:
                self.faults[request.deployment_id] = chosen
        self._maybe_raise(Step.START, request.deployment_id)
        return self.inner.start(request)

    def status(self, handle: EngineHandle) -> EngineStatus:
        self._maybe_raise(Step.STATUS, handle.deployment_id)
        return self.inner.status(handle)

    def stop(self, handle: EngineHandle) -> None:
        self._maybe_raise(Step.STOP, handle.deployment_id)
        self.inner.stop(handle)

    def adopt(self, handle: EngineHandle) -> EngineHandle | None:
        self._maybe_raise(Step.ADOPT, handle.deployment_id)
        return self.inner.adopt(handle)

    def logs(self, handle: EngineHandle, *, tail: int = 200) -> list[str]:
        self._maybe_raise(Step.LOGS, handle.deployment_id)
        return self.inner.logs(handle, tail=tail)

    def engines(self) -> list[EngineHandle]:
        return self.inner.engines()
