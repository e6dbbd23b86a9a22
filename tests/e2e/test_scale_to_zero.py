"""Scale to zero with a real llama.cpp engine (the tiny model on llama-cpp-python's server, on
the CPU) behind the real LocalRuntime and SQLite, driven by the reconciler's own thread: a
`min_copies: 0` deployment with a one-second keep-alive serves a chat completion, is unloaded
once idle (its process group gone, its budget released, still listed and routable), and
`Reconciler.load` brings it back serving on a new engine; its duration's end then stops it.
The gateway's side (a request that loads it) is tested with the gateway."""

from __future__ import annotations

from collections.abc import Iterator
from datetime import timedelta
from pathlib import Path
from typing import TypeVar

import httpx
import pytest
from sqlalchemy import update

from cohabit.runtime.interface import handle_from_json
from cohabit.runtime.process import group_alive
from cohabit.runtime.tinymodel import write_tiny_model
from cohabit.service.control.reconciler import Reconciler
from cohabit.service.registry.catalog import Registration, register_model
from cohabit.store import deployments, events, ledger
from cohabit.store.database import Database, utcnow
from cohabit.store.records import DeploymentRecord, DeploymentStatus
from cohabit.store.tables import DeploymentRow
from cohabit.units import GIB
from tests.e2e.engines import eventually, running_reconciler
from tests.service.server import T4_FLEET
from tests.service.test_reconciler import admit

S = DeploymentStatus
CHAT = {"messages": [{"role": "user", "content": "hello"}], "max_tokens": 4}
READY_S = 120.0
T = TypeVar("T")


@pytest.fixture
def reconciler(tmp_path: Path) -> Iterator[Reconciler]:
    with running_reconciler(tmp_path, T4_FLEET) as driver:
        yield driver


def in_status(db: Database, deployment_id: str, wanted: S) -> DeploymentRecord | None:
    record = deployments.get(db, deployment_id)
    assert record.status in {wanted, S.REQUESTED, S.DEPLOYING, S.INITIALIZING, S.DEPLOYED}, (
        record.last_error_message
    )
    return record if record.status is wanted else None


def chat(record: DeploymentRecord) -> tuple[int, str]:
    """A chat completion straight to the engine; its pid and the reply."""
    handle = handle_from_json(record.engine_handle)
    assert handle is not None and handle.base_url and handle.pid
    reply = httpx.post(
        f"{handle.base_url}/v1/chat/completions",
        json={"model": "tiny", **CHAT},
        timeout=60,
        trust_env=False,
    )
    assert reply.status_code == 200, reply.text
    return handle.pid, reply.json()["choices"][0]["message"]["content"]


def test_an_idle_engine_is_unloaded_and_loaded_again(
    reconciler: Reconciler, tmp_path: Path
) -> None:
    db = reconciler.db
    model = register_model(
        db, Registration(name="tiny", path=str(write_tiny_model(tmp_path / "tiny.gguf")))
    )
    deployment_id = admit(db, model.id, 6 * GIB, min_copies=0, keep_alive_s=1, duration_min=60)
    activity = reconciler.activity
    activity.begin(deployment_id)  # a request waiting for it: kept loaded meanwhile
    reconciler.wake()
    first_pid, reply = chat(eventually(lambda: in_status(db, deployment_id, S.DEPLOYED)))
    assert reply
    activity.finish(deployment_id, seconds=0.5, ok=True)

    unloaded = eventually(lambda: in_status(db, deployment_id, S.UNLOADED), timeout_s=30)
    assert (unloaded.placement, unloaded.engine_handle) == (None, None)
    eventually(lambda: True if not group_alive(first_pid) else None, timeout_s=30)
    assert ledger.reservations(db) == []
    assert [r.id for r in deployments.serving(db, "tiny")] == [deployment_id]
    (unload_event,) = [e for e in events.since(db, deployment_id) if e.kind == "unloaded"]
    assert unload_event.message.startswith("unloaded: idle for ")

    activity.begin(deployment_id)
    assert reconciler.load(deployment_id) is True
    assert reconciler.load(deployment_id) is False  # one load, however many ask
    second_pid, reply = chat(eventually(lambda: in_status(db, deployment_id, S.DEPLOYED)))
    assert reply and second_pid != first_pid
    assert [r.reserved_bytes for r in ledger.reservations(db)] == [6 * GIB]
    activity.finish(deployment_id, seconds=0.5, ok=True)
    activity.begin(deployment_id)  # in flight again: only its duration can end it now

    with db.write() as session:  # an hour is too long to wait: its end is moved to now
        session.execute(
            update(DeploymentRow)
            .where(DeploymentRow.id == deployment_id)
            .values(ends_at=utcnow() - timedelta(seconds=1))
        )
    stopped = eventually(lambda: in_status(db, deployment_id, S.STOPPED), timeout_s=30)
    assert stopped.stopped_at is not None
    eventually(lambda: True if not group_alive(second_pid) else None, timeout_s=30)
    assert ledger.reservations(db) == []
    last = events.since(db, deployment_id)[-1]
    assert (last.kind, last.message) == ("stopped", "stopped: its duration of 60 min ended")
