"""An in-process EngineRuntime double for the service tests: no engine runs; each launch
follows a script (ready after N polls, fail with a code, refuse to start). It stands in for
the process spawner, which needs real engines; the reconciler sees only the protocol."""

from __future__ import annotations

import threading
from collections.abc import Mapping
from dataclasses import dataclass, field
from datetime import UTC, datetime
from pathlib import Path

from cohabit.runtime.interface import (
    EngineHandle,
    EngineState,
    EngineStatus,
    LaunchRequest,
    Milestone,
    MilestoneSeen,
    RuntimeErrorCode,
)

FAILED_AT = datetime(2026, 11, 1, 12, 0, tzinfo=UTC)  # every scripted failure "happens" then


def _now() -> datetime:
    return datetime.now(UTC)


@dataclass(frozen=True, slots=True, kw_only=True)
class Script:
    """What one engine does: READY after `ready_after_polls` status calls, FAILED with
    `fail_code` after `fail_after_polls` (READY in between when that comes later: an engine
    that served, then died); `start_error` makes start() itself raise. `milestones`: the
    load's milestones its log shows, the n-th first seen at the n-th poll."""

    ready_after_polls: int = 1
    fail_code: RuntimeErrorCode | None = None
    fail_message: str = "engine failed"
    fail_after_polls: int = 1
    start_error: str | None = None
    milestones: tuple[Milestone, ...] = ()


@dataclass
class _Engine:
    request: LaunchRequest
    script: Script
    handle: EngineHandle
    polls: int = 0
    stopped: bool = False
    lines: list[str] = field(default_factory=list)
    seen: list[MilestoneSeen] = field(default_factory=list)


class ScriptedRuntime:
    """Scripts are chosen by the launch's served model name, else `default`."""

    def __init__(
        self,
        default: Script | None = None,
        scripts: Mapping[str, Script] | None = None,
        *,
        log_dir: Path | None = None,
    ) -> None:
        self.log_dir = log_dir  # given: each engine's handle names a log file there
        self.default = default or Script()
        self.scripts = dict(scripts or {})
        self.starts: list[LaunchRequest] = []
        self.stops: list[str] = []
        self.discarded: list[str] = []
        self._engines: dict[str, _Engine] = {}
        self._lock = threading.Lock()
        self._next_port = 41000

    def start(self, request: LaunchRequest) -> EngineHandle:
        script = self.scripts.get(request.served_model_name, self.default)
        with self._lock:
            self.starts.append(request)
            if script.start_error is not None:
                raise RuntimeError(script.start_error)
            self._next_port += 1
            port = self._next_port
            handle = EngineHandle(
                deployment_id=request.deployment_id,
                pid=None,
                port=port,
                base_url=f"http://127.0.0.1:{port}",
                log_path=None if self.log_dir is None else str(self.log_dir / f"{port}.log"),
            )
            self._engines[request.deployment_id] = _Engine(
                request=request,
                script=script,
                handle=handle,
                lines=[f"loading {request.model_path} within {request.budget_bytes} bytes"],
            )
        return handle

    def status(self, handle: EngineHandle) -> EngineStatus:
        with self._lock:
            engine = self._engines.get(handle.deployment_id)
            if engine is None:
                return EngineStatus(
                    state=EngineState.FAILED,
                    error_code=RuntimeErrorCode.CONTAINER_EXITED,
                    error_message="no such engine",
                )
            if engine.stopped:
                return EngineStatus(state=EngineState.STOPPED)
            engine.polls += 1
            script = engine.script
            if len(engine.seen) < min(engine.polls, len(script.milestones)):
                milestone = script.milestones[len(engine.seen)]
                line = f"scripted: {milestone.value}"
                engine.seen.append(MilestoneSeen(milestone=milestone, at=_now(), line=line))
            if script.fail_code is not None and engine.polls >= script.fail_after_polls:
                engine.lines.append(script.fail_message)
                return EngineStatus(
                    state=EngineState.FAILED,
                    error_code=script.fail_code,
                    error_message=script.fail_message,
                    error_at=FAILED_AT,
                )
            seen = tuple(engine.seen)
            if engine.polls >= script.ready_after_polls:
                return EngineStatus(state=EngineState.READY, milestones=seen)
            return EngineStatus(state=EngineState.STARTING, milestones=seen)

    def stop(self, handle: EngineHandle) -> None:
        """`stops` records each engine stopped; stopping what is not running is a no-op."""
        with self._lock:
            engine = self._engines.get(handle.deployment_id)
            if engine is not None and not engine.stopped:
                engine.stopped = True
                self.stops.append(handle.deployment_id)

    def adopt(self, handle: EngineHandle) -> EngineHandle | None:
        with self._lock:
            engine = self._engines.get(handle.deployment_id)
            return None if engine is None or engine.stopped else engine.handle

    def engines(self) -> list[EngineHandle]:
        with self._lock:
            return [
                EngineHandle(deployment_id=deployment_id)
                for deployment_id, engine in self._engines.items()
                if not engine.stopped
            ]

    def logs(self, handle: EngineHandle, *, tail: int = 200) -> list[str]:
        with self._lock:
            engine = self._engines.get(handle.deployment_id)
            return [] if engine is None else engine.lines[-tail:]

    def discard(self, deployment_id: str) -> None:
        with self._lock:
            self.discarded.append(deployment_id)
            self._engines.pop(deployment_id, None)

    def fail(self, deployment_id: str, code: RuntimeErrorCode, message: str) -> None:
        """Make a running engine fail from its next status call on (a crash, a kill)."""
        with self._lock:
            engine = self._engines[deployment_id]
            engine.script = Script(fail_code=code, fail_message=message, fail_after_polls=0)
