"""A deployment's revision, on SQLite and PostgreSQL: every store function that writes a
deployment row bumps it, except the lease writes (claim, renew, let go), which keep it; a
server keeps its rendering of a record while the revision is the same, so a write that
forgot to bump it would leave a stale record on every list page.

Three checks: each write function, run in the order a deployment lives through them, moves
the revision (or, for the lease, does not); every UPDATE statement those functions send to
the deployments table sets the revision; and every function in the store that writes the
deployments table is one of those the first check runs."""

from __future__ import annotations

import ast
import importlib
import inspect
import pkgutil
from collections.abc import Callable
from datetime import timedelta
from typing import Any

from sqlalchemy import event, select

import cohabit.store
from cohabit.placement.reasons import NoFit
from cohabit.placement.request import PlacementRequest
from cohabit.store import copies, deployments, ledger, memory, queue, residency, scaling
from cohabit.store.database import Database, utcnow
from cohabit.store.memory import MemorySample
from cohabit.store.records import DeploymentFailure, DeploymentStatus
from cohabit.store.tables import DeploymentRow
from cohabit.units import GIB
from tests.store import test_store
from tests.store.helpers import add_deployment, add_model

S = DeploymentStatus
db = test_store.db  # the fixture: a migrated database that holds a T4 fleet
OWNER = "me"
KEEPS, BUMPS = "keeps", "bumps"


def revision(db: Database, deployment_id: str) -> int:
    with db.read() as session:
        found = session.scalar(
            select(DeploymentRow.revision).where(DeploymentRow.id == deployment_id)
        )
    assert found is not None
    return found


def lifecycle(deployment_id: str) -> list[tuple[str, str, Callable[[Database], object]]]:
    """(write function, what it does to the revision, the call) in the order a deployment
    lives through them: placed, queued, taken, deployed, measured, used, put to sleep and
    awake again, unloaded, loaded, failed, stopped."""
    request = PlacementRequest(name=deployment_id, vram_bytes=6 * GIB)
    failure = DeploymentFailure(status=S.FAILED, code="OOM", message="out of memory")
    no_fit = {"reasons": []}

    def deploying(db: Database) -> object:
        return deployments.advance(
            db, deployment_id, owner=OWNER, allowed=[S.REQUESTED, S.QUEUED], to=S.DEPLOYING
        )

    return [
        ("deployments.claim", KEEPS, lambda db: deployments.claim(db, owner=OWNER, lease_s=30)),
        ("deployments.renew", KEEPS, lambda db: deployments.renew(db, owner=OWNER, lease_s=60)),
        ("deployments.advance", BUMPS, deploying),
        (
            "queue.enqueue",
            BUMPS,
            lambda db: queue.enqueue(
                db, deployment_id, owner=OWNER, message="no room", no_fit=no_fit
            ),
        ),
        (
            "queue.show_position",
            BUMPS,
            lambda db: queue.show_position(
                db, deployment_id, position=1, message="first in line", no_fit=no_fit
            ),
        ),
        ("queue.take", BUMPS, lambda db: queue.take(db, deployment_id, owner=OWNER, lease_s=30)),
        (
            "ledger.reserve",
            BUMPS,
            lambda db: ledger.reserve(
                db, deployment_id=deployment_id, owner=OWNER, request=request
            ),
        ),
        (
            "deployments.advance",
            BUMPS,
            lambda db: deployments.advance(
                db, deployment_id, owner=OWNER, allowed=[S.DEPLOYING], to=S.DEPLOYED
            ),
        ),
        (
            "memory.save_samples",
            BUMPS,
            lambda db: memory.save_samples(
                db, {deployment_id: MemorySample(used_bytes=GIB, at=utcnow())}
            ),
        ),
        (
            "scaling.note_use",
            BUMPS,
            lambda db: scaling.note_use(db, {deployment_id: utcnow() + timedelta(seconds=1)}),
        ),
        (
            "residency.begin_sleep",
            BUMPS,
            lambda db: residency.begin_sleep(db, deployment_id, weights_bytes=GIB),
        ),
        ("residency.awake", BUMPS, lambda db: residency.awake(db, deployment_id)),
        ("deployments.let_go", KEEPS, lambda db: deployments.let_go(db, owner=OWNER)),
        ("scaling.unload", BUMPS, lambda db: scaling.unload(db, deployment_id)),
        ("scaling.load", BUMPS, lambda db: scaling.load(db, deployment_id)),
        (
            "deployments.release_as",
            BUMPS,
            lambda db: deployments.release_as(
                db, deployment_id, allowed=[S.REQUESTED], values={"no_fit": no_fit}
            ),
        ),
        ("deployments.end", BUMPS, lambda db: deployments.end(db, deployment_id, failure=failure)),
    ]


def test_every_write_but_the_lease_bumps_the_revision(db: Database) -> None:
    model = add_model(db)
    deployment_id = add_deployment(db, model, GIB).id
    assert revision(db, deployment_id) == 0
    updates: list[str] = []

    def capture(_conn: Any, _cursor: Any, statement: str, *_: Any) -> None:
        if statement.lstrip().upper().startswith("UPDATE DEPLOYMENTS"):
            updates.append(" ".join(statement.split()))

    event.listen(db.engine, "before_cursor_execute", capture)
    try:
        for name, effect, write in lifecycle(deployment_id):
            before = revision(db, deployment_id)
            result = write(db)
            if name in ("deployments.claim", "ledger.reserve"):  # it did take, it did place
                assert result and not isinstance(result, NoFit), f"{name}: {result}"
            after = revision(db, deployment_id)
            if effect == BUMPS:
                assert after > before, f"{name} left the revision at {before}"
            else:
                assert after == before, f"{name} moved the revision {before} -> {after}"
    finally:
        event.remove(db.engine, "before_cursor_execute", capture)
    assert deployments.get(db, deployment_id).status is S.FAILED
    assert updates  # every one of them sets the revision, to itself or one more
    for statement in updates:
        assigned = statement.upper().partition(" SET ")[2].partition(" WHERE ")[0]
        assert "REVISION=" in assigned.replace(" ", ""), statement


def test_the_page_follows_the_revision(db: Database) -> None:
    model = add_model(db)
    first, second = (add_deployment(db, model, GIB).id for _ in range(2))
    pairs = {e.id: e.revision for e in deployments.page_revisions(db, limit=10)}
    assert pairs == {first: 0, second: 0}
    ((record, loaded),) = deployments.with_revisions(db, [first])
    assert record.id == first and loaded == 0
    deployments.end(db, first)
    pairs = {e.id: e.revision for e in deployments.page_revisions(db, limit=10)}
    assert pairs[first] > 0 and pairs[second] == 0


COPY_WRITES = {"copies.add", "copies.end_all"}  # test_copy_writes_move_the_page_keys


def test_copy_writes_move_the_page_keys(db: Database) -> None:
    """A new copy is a new row (revision 0) that the page's copy read finds; ending copies
    bumps each row it ends."""
    model = add_model(db)
    deployment_id = add_deployment(db, model, GIB).id
    assert deployments.claim(db, owner=OWNER, lease_s=30)
    request = PlacementRequest(name=deployment_id, vram_bytes=GIB)
    assert not isinstance(
        ledger.reserve(db, deployment_id=deployment_id, owner=OWNER, request=request), NoFit
    )
    for status in (S.DEPLOYING, S.DEPLOYED):
        assert deployments.advance(
            db, deployment_id, owner=OWNER, allowed=[S.REQUESTED, S.DEPLOYING], to=status
        )
    assert copies.add(db, deployment_id) is not None
    ((copy_id, copy_revision),) = deployments.copy_revisions(db, [deployment_id])[deployment_id]
    assert copy_revision == 0
    before = {deployment_id: revision(db, deployment_id), copy_id: 0}
    values = {"status": S.STOPPED.value, "claimed_by": None, "claimed_until": None}
    assert len(copies.end_all(db, deployment_id, values=values)) == 2
    assert all(revision(db, i) > was for i, was in before.items())
    assert deployments.copy_revisions(db, [deployment_id]) == {}


def _writes_deployments(function: ast.FunctionDef) -> bool:
    """Whether a store function writes deployment rows: an `update(DeploymentRow)`, or an
    attribute set on a row it got with `session.get(DeploymentRow, …)`."""
    calls = [node for node in ast.walk(function) if isinstance(node, ast.Call)]
    names_row = [
        call
        for call in calls
        if call.args and isinstance(call.args[0], ast.Name) and call.args[0].id == "DeploymentRow"
    ]
    updates = any(isinstance(c.func, ast.Name) and c.func.id == "update" for c in names_row)
    gets = any(isinstance(c.func, ast.Attribute) and c.func.attr == "get" for c in names_row)
    sets = any(
        isinstance(node, ast.Assign) and isinstance(node.targets[0], ast.Attribute)
        for node in ast.walk(function)
    )
    return updates or (gets and sets)


def test_the_lifecycle_runs_every_store_function_that_writes_a_deployment() -> None:
    """A new write function must join `lifecycle` (and show there what it does to the
    revision): every module of the store is read."""
    found = set()
    for module_info in pkgutil.iter_modules(cohabit.store.__path__):
        if module_info.ispkg:  # the migrations
            continue
        module = importlib.import_module(f"cohabit.store.{module_info.name}")
        for node in ast.parse(inspect.getsource(module)).body:
            if isinstance(node, ast.FunctionDef) and _writes_deployments(node):
                found.add(f"{module_info.name}.{node.name}")
    covered = {name for name, _, _ in lifecycle("x")} | COPY_WRITES
    # release() runs inside release_as() (end, unload), on the row that writes.
    assert found - covered == {"ledger.release"}
