"""One deployment's fault stays its own: a runtime that raises while starting, probing,
stopping, adopting or reading the logs of one deployment ends that deployment alone (ERROR
with the fault as its message and time, or STOPPED for a stop), while the others stay
DEPLOYED, keep their budgets and are never stopped; later deployments still start. A pass
that fails as a whole shows in `/serving/health` with its reason. A host name too long for
the lease column still drives deployments, on SQLite and PostgreSQL.

Engines are the in-process scripted double behind a fault-injecting wrapper at the runtime
seam (tests/service/faulty_runtime.py); tests/e2e/test_containment.py does the same with real
llama.cpp engines."""

from __future__ import annotations

import socket
import time
from pathlib import Path

import httpx
import pytest
from sqlalchemy import text

from cohabit.service.control import admission as service
from cohabit.service.control.reconciler import Reconciler
from cohabit.store import deployments, ledger
from cohabit.store.database import Database
from cohabit.store.records import DeploymentStatus
from cohabit.store.tables import OWNER_CHARS
from cohabit.units import GIB
from tests.service.faulty_runtime import FaultyRuntime, Step
from tests.service.scripted_runtime import Script, ScriptedRuntime
from tests.service.server import serving, settings_for, wait_for
from tests.service.test_reconciler import admit, status

S = DeploymentStatus
LONG_HOST = "inference-server-7f9c6d5b8-" + "x" * 34  # 61 characters, as a pod's can be


def passes(reconciler: Reconciler, count: int = 2) -> None:
    for _ in range(count):
        reconciler.run_once()


# step → (the victim's status, its last_error_code) afterwards
OUTCOMES = {
    Step.START: (S.ERROR, "RUNTIME_ERROR"),
    Step.STATUS: (S.ERROR, "RUNTIME_ERROR"),
    Step.ADOPT: (S.ERROR, "RUNTIME_ERROR"),
    Step.STOP: (S.STOPPED, None),
    Step.LOGS: (S.DEPLOYED, None),
}


@pytest.mark.parametrize("step", list(Step))
def test_a_fault_in_one_deployment_leaves_the_others_deployed(
    db: Database, model_id: str, step: Step
) -> None:
    inner = ScriptedRuntime(Script(ready_after_polls=1))
    runtime = FaultyRuntime(inner, {})
    driver = Reconciler(db, runtime, owner="first", lease_s=0.3)
    healthy = [admit(db, model_id, 4 * GIB) for _ in range(2)]
    passes(driver)
    victim = admit(db, model_id, 4 * GIB)
    runtime.faults[victim] = step
    passes(driver)
    if step is Step.ADOPT:  # the driver dies; the next one takes all three over
        time.sleep(0.4)
        driver = Reconciler(db, runtime, owner="second", lease_s=5.0)
        passes(driver)
    elif step is Step.STOP:
        assert service.stop(db, runtime, victim) is True  # stopped, the fault logged
        passes(driver)
    elif step is Step.LOGS:
        handle = service.handle_from_json(deployments.get(db, victim).engine_handle)
        (line,) = service.engine_logs(runtime, handle, tail=10)
        assert line == f"(logs unavailable: InjectedFault: injected logs fault for {victim})"
        other = service.handle_from_json(deployments.get(db, healthy[0]).engine_handle)
        assert service.engine_logs(runtime, other, tail=10)[0].startswith("loading ")

    assert (step, victim) in runtime.raised
    record = deployments.get(db, victim)
    assert (record.status, record.last_error_code) == OUTCOMES[step]
    if record.status is S.ERROR:
        assert record.last_error_message == f"InjectedFault: injected {step} fault for {victim}"
        assert record.last_error_at is not None
    for deployment_id in healthy:
        assert status(db, deployment_id) is S.DEPLOYED
        assert deployments.get(db, deployment_id).claimed_by == driver.owner
    assert not set(inner.stops) & set(healthy)  # nothing healthy was ever stopped
    held = {r.deployment_id for r in ledger.reservations(db)}
    assert held == set(healthy) | ({victim} if record.status is S.DEPLOYED else set())

    later = admit(db, model_id, 2 * GIB)  # the runtime is not poisoned for what comes next
    passes(driver)
    assert status(db, later) is S.DEPLOYED


def test_a_failing_pass_makes_the_reconciler_unhealthy_with_the_reason(
    tmp_path: Path, database_url: str
) -> None:
    """The database loses the deployments table under a running server (a fault of the whole
    pass, not of one deployment): health says so, with the database's own words, until it is
    back."""
    settings = settings_for(tmp_path, database_url)
    with (
        serving(settings, ScriptedRuntime()) as api,
        httpx.Client(base_url=api, timeout=30) as client,
    ):

        def reconciler() -> dict[str, str]:
            entries = client.get("/serving/health").json()
            entry: dict[str, str] = next(e for e in entries if e["component"] == "reconciler")
            return entry

        assert reconciler() == {"component": "reconciler", "status": "running"}
        db = Database(database_url)
        try:
            with db.engine.begin() as connection:
                connection.execute(text("ALTER TABLE deployments RENAME TO deployments_away"))
            failing = wait_for(lambda: (e := reconciler())["status"] == "failing" and e)
            assert "deployments" in failing["reason"]
            assert failing["reason"].split(":")[0] in ("OperationalError", "ProgrammingError")
            assert failing["since"]
            with db.engine.begin() as connection:
                connection.execute(text("ALTER TABLE deployments_away RENAME TO deployments"))
            wait_for(lambda: reconciler() == {"component": "reconciler", "status": "running"})
        finally:
            db.dispose()


def test_a_61_character_host_name_still_drives_deployments(
    db: Database, model_id: str, monkeypatch: pytest.MonkeyPatch
) -> None:
    """The lease owner names the host, bounded to the claimed_by column: on PostgreSQL a
    longer id fails every pass (StringDataRightTruncation) and nothing is ever deployed."""
    monkeypatch.setattr(socket, "gethostname", lambda: LONG_HOST)
    driver = Reconciler(db, ScriptedRuntime())
    assert len(driver.owner) <= OWNER_CHARS
    assert driver.owner.startswith(LONG_HOST[:31])
    deployment_id = admit(db, model_id, 4 * GIB)
    passes(driver)
    record = deployments.get(db, deployment_id)
    assert (record.status, record.claimed_by) == (S.DEPLOYED, driver.owner)
