"""The lifecycle, one reconciler pass at a time (no HTTP): REQUESTED → DEPLOYING →
INITIALIZING → DEPLOYED; NoFit fails fast with nothing reserved or started; runtime failures
end in the status their code calls for with the budget released once; stop; and a second
process taking over once the first's lease has run out. Engines: the in-process double."""

from __future__ import annotations

import time
from datetime import timedelta
from typing import Any

import pytest

from cohabit.runtime.interface import RuntimeErrorCode
from cohabit.service.control import admission as service
from cohabit.service.control.reconciler import Reconciler
from cohabit.store import deployments, ledger
from cohabit.store.database import Database, utcnow
from cohabit.store.records import DeploymentStatus, Scaling
from cohabit.units import GIB
from tests.service.scripted_runtime import FAILED_AT, Script, ScriptedRuntime

S = DeploymentStatus


def admit(db: Database, model_id: str, size_bytes: int, **scaling: Any) -> str:
    """Admit the tiny model at `size_bytes`, with these `Scaling` fields."""
    request = service.DeployRequest(
        model_id=model_id,
        config_id=None,
        file_id=None,
        engine_name=None,
        vram_allocation=size_bytes,
        force_cpu=False,
        body={},
        scaling=Scaling(**scaling),
    )
    return service.admit(db, request).id


def status(db: Database, deployment_id: str) -> S:
    return deployments.get(db, deployment_id).status


def test_happy_path_passes_every_status(db: Database, model_id: str) -> None:
    runtime = ScriptedRuntime(Script(ready_after_polls=2))
    reconciler = Reconciler(db, runtime, owner="one")
    deployment_id = admit(db, model_id, 6 * GIB)
    assert status(db, deployment_id) is S.REQUESTED
    seen = []
    for _ in range(3):
        reconciler.run_once()
        seen.append(status(db, deployment_id))
    assert seen == [S.INITIALIZING, S.DEPLOYED, S.DEPLOYED]
    (launch,) = runtime.starts
    assert (launch.engine, launch.budget_bytes, launch.device_total_bytes) == (
        "llamacpp",
        6 * GIB,
        16 * GIB,
    )
    assert launch.model_path.endswith("tiny.gguf") and launch.max_model_len == 256
    record = deployments.get(db, deployment_id)
    assert record.deployed_at is not None and record.engine_handle is not None


def test_no_fit_fails_once_woken_with_nothing_reserved_or_started(
    db: Database, model_id: str
) -> None:
    """Woken by admission, not by its poll: the poll is a minute, the bound a sixth of it
    (a quiet machine takes a few milliseconds; the bound leaves room for a loaded one)."""
    runtime = ScriptedRuntime()
    reconciler = Reconciler(db, runtime, owner="one", poll_interval_s=60)
    first = admit(db, model_id, 10 * GIB)
    reconciler.run_once()
    reconciler.start()
    try:
        started = time.monotonic()
        refused = admit(db, model_id, 10 * GIB)
        reconciler.wake()
        while status(db, refused) is not S.FAILED and time.monotonic() - started < 10.0:
            time.sleep(0.01)
        assert time.monotonic() - started < 10.0
    finally:
        reconciler.stop()
    record = deployments.get(db, refused)
    assert record.last_error_code == "NoFitError"
    assert record.last_error_message is not None
    assert record.last_error_message.startswith("insufficient_capacity: 0/1 nodes fit")
    assert record.last_error_at is not None
    assert record.no_fit is not None and record.no_fit["requested_bytes"] == 10 * GIB
    assert [r.deployment_id for r in ledger.reservations(db)] == [first]
    assert [launch.deployment_id for launch in runtime.starts] == [first]


@pytest.mark.parametrize(
    ("script", "ends_in", "code"),
    [
        (
            Script(fail_code=RuntimeErrorCode.OOM, fail_message="CUDA out of memory"),
            S.FAILED,
            "OOM",
        ),
        (Script(fail_code=RuntimeErrorCode.CUDA_ERROR), S.ERROR, "CUDA_ERROR"),
        (Script(fail_code=RuntimeErrorCode.STARTUP_TIMEOUT), S.FAILED, "STARTUP_TIMEOUT"),
        (
            Script(fail_code=RuntimeErrorCode.MUST_REDOWNLOAD),
            S.MUST_REDOWNLOAD,
            "MUST_REDOWNLOAD",
        ),
        (Script(start_error="no llama-server binary"), S.ERROR, "RUNTIME_ERROR"),
        (
            Script(
                fail_code=RuntimeErrorCode.OOM,
                fail_message="CUDA out of memory",
                fail_after_polls=2,
            ),
            S.ERROR,
            "OOM",
        ),
        (
            Script(fail_code=RuntimeErrorCode.CONTAINER_EXITED, fail_after_polls=2),
            S.ERROR,
            "CONTAINER_EXITED",
        ),
    ],
    ids=[
        "oom",
        "cuda-error",
        "startup-timeout",
        "must-redownload",
        "start-raises",
        "oom-after-deployed-is-error",
        "exit-after-deployed-is-error",
    ],
)
def test_runtime_failure_records_its_code_and_releases_once(
    db: Database, model_id: str, script: Script, ends_in: S, code: str
) -> None:
    runtime = ScriptedRuntime(script)
    reconciler = Reconciler(db, runtime, owner="one")
    deployment_id = admit(db, model_id, 6 * GIB)
    for _ in range(3):
        reconciler.run_once()
    record = deployments.get(db, deployment_id)
    assert (record.status, record.last_error_code) == (ends_in, code)
    assert record.last_error_message
    served_first = script.fail_code is not None and script.fail_after_polls > 1
    assert (record.deployed_at is not None) is served_first
    if script.start_error is None:  # the engine's own failure time, not when we noticed
        assert record.last_error_at == FAILED_AT
    else:
        assert record.last_error_at is not None
    assert ledger.reservations(db) == []
    assert service.stop(db, runtime, deployment_id) is False  # already ended: nothing to do
    assert deployments.get(db, deployment_id).released_at == record.released_at


def test_stop_while_initializing_releases_and_stops_the_engine_once(
    db: Database, model_id: str
) -> None:
    runtime = ScriptedRuntime(Script(ready_after_polls=100))
    reconciler = Reconciler(db, runtime, owner="one")
    deployment_id = admit(db, model_id, 6 * GIB)
    reconciler.run_once()
    assert status(db, deployment_id) is S.INITIALIZING
    assert service.stop(db, runtime, deployment_id) is True
    assert status(db, deployment_id) is S.STOPPED
    assert ledger.reservations(db) == []
    assert runtime.stops == [deployment_id]  # stopped before the answer, whoever drives it
    reconciler.run_once()
    reconciler.run_once()
    assert runtime.stops == [deployment_id]  # the driver's own stop finds nothing left


def test_another_process_takes_over_when_the_lease_runs_out(db: Database, model_id: str) -> None:
    """The first reconciler stops passing (as if SIGKILLed); its engine died with it. The
    second adopts nothing while the first's lease holds, and once it has run out (put in
    the past here, rather than waited for) relaunches inside the budget still held."""
    first = Reconciler(db, ScriptedRuntime(Script(ready_after_polls=100)), owner="a", lease_s=600)
    deployment_id = admit(db, model_id, 6 * GIB)
    first.run_once()
    assert status(db, deployment_id) is S.INITIALIZING
    second_runtime = ScriptedRuntime()
    second = Reconciler(db, second_runtime, owner="b", lease_s=5)
    second.run_once()
    assert second_runtime.starts == []  # the lease is still "a"'s
    ran_out = {"claimed_until": utcnow() - timedelta(seconds=1)}
    assert deployments.advance(
        db, deployment_id, owner="a", allowed=(S.INITIALIZING,), to=S.INITIALIZING, values=ran_out
    )
    second.run_once()
    second.run_once()
    record = deployments.get(db, deployment_id)
    assert (record.status, record.claimed_by) == (S.DEPLOYED, "b")
    assert [launch.budget_bytes for launch in second_runtime.starts] == [6 * GIB]
    assert [r.deployment_id for r in ledger.reservations(db)] == [deployment_id]


def test_an_engine_started_by_a_driver_that_died_before_recording_it_is_adopted(
    db: Database, model_id: str
) -> None:
    """The first driver started the engine and died before it recorded INITIALIZING (the
    record is put back to that moment: DEPLOYING, placed, no handle, the lease run out). The
    engine still runs on this machine, so the next driver adopts it, records its handle, and
    it goes on to DEPLOYED with no second engine started."""
    runtime = ScriptedRuntime(Script(ready_after_polls=2))  # one machine: engines outlive drivers
    first = Reconciler(db, runtime, owner="a")
    deployment_id = admit(db, model_id, 6 * GIB)
    first.run_once()
    assert status(db, deployment_id) is S.INITIALIZING
    crashed = {"engine_handle": None, "claimed_by": None, "claimed_until": None}
    assert deployments.advance(
        db, deployment_id, owner="a", allowed=(S.INITIALIZING,), to=S.DEPLOYING, values=crashed
    )
    second = Reconciler(db, runtime, owner="b")
    second.run_once()
    second.run_once()
    record = deployments.get(db, deployment_id)
    assert (record.status, record.claimed_by) == (S.DEPLOYED, "b")
    assert record.engine_handle is not None and record.engine_handle["port"] is not None
    assert len(runtime.starts) == 1  # adopted, not started again
    assert [r.deployment_id for r in ledger.reservations(db)] == [deployment_id]
