"""What an engine's status means for its deployment, as a table: (the runtime's status of the
engine, whether the deployment had served) → nothing yet, or the failure it ends with (its
status, code and line). No database and no reconciler (service/control/failures.py)."""

from __future__ import annotations

from datetime import UTC, datetime

import pytest

from cohabit.runtime.interface import EngineState, EngineStatus, RuntimeErrorCode
from cohabit.service.control.failures import engine_failure
from cohabit.store.records import DeploymentStatus

AT = datetime(2026, 12, 3, 12, 0, tzinfo=UTC)
OOM = RuntimeErrorCode.OOM
FAILED, STOPPED = EngineState.FAILED, EngineState.STOPPED

# (case, engine state, its code, its line, served, expected (status, code, message) or None)
CASES = [
    ("starting: nothing yet", EngineState.STARTING, None, None, False, None),
    ("ready: nothing to record", EngineState.READY, None, None, False, None),
    ("ready after serving", EngineState.READY, None, None, True, None),
    (
        "out of memory while starting: the user must change something",
        FAILED,
        OOM,
        "CUDA out of memory",
        False,
        (DeploymentStatus.FAILED, "OOM", "CUDA out of memory"),
    ),
    (
        "out of memory after serving: worth a retry as is",
        FAILED,
        OOM,
        "CUDA out of memory",
        True,
        (DeploymentStatus.ERROR, "OOM", "CUDA out of memory"),
    ),
    (
        "exited with no code and no line",
        FAILED,
        None,
        None,
        False,
        (DeploymentStatus.ERROR, "CONTAINER_EXITED", "engine failed"),
    ),
    (
        "stopped by someone else",
        STOPPED,
        None,
        None,
        True,
        (DeploymentStatus.ERROR, "CONTAINER_EXITED", "engine stopped"),
    ),
    (
        "its files are gone",
        FAILED,
        RuntimeErrorCode.MUST_REDOWNLOAD,
        "no such file",
        False,
        (DeploymentStatus.MUST_REDOWNLOAD, "MUST_REDOWNLOAD", "no such file"),
    ),
    (
        "a start-up timeout after serving counts as serving's",
        FAILED,
        RuntimeErrorCode.STARTUP_TIMEOUT,
        "not ready in 600 s",
        True,
        (DeploymentStatus.ERROR, "STARTUP_TIMEOUT", "not ready in 600 s"),
    ),
]


@pytest.mark.parametrize(
    ("state", "code", "line", "served", "expected"),
    [pytest.param(*case[1:], id=case[0]) for case in CASES],
)
def test_an_engine_status(
    state: EngineState,
    code: RuntimeErrorCode | None,
    line: str | None,
    served: bool,
    expected: tuple[DeploymentStatus, str, str] | None,
) -> None:
    engine = EngineStatus(state=state, error_code=code, error_message=line, error_at=AT)
    failure = engine_failure(engine, served=served)
    if expected is None:
        assert failure is None
        return
    assert failure is not None
    assert (failure.status, failure.code, failure.message) == expected
    assert failure.at == AT
