"""Worker server processes for the concurrency and restart tests, and the ledger invariants
those tests check straight in the database."""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import time
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path

import httpx
import psutil
from sqlalchemy import select
from sqlalchemy.orm import Session

from cohabit.placement.state import FleetState
from cohabit.store import deployments, ledger
from cohabit.store.database import Database
from cohabit.store.records import HOLDING, DeploymentStatus
from cohabit.store.tables import DeploymentRow

REPO = Path(__file__).parents[2]


def start_worker(
    database_url: str, data_dir: Path, *args: str
) -> tuple[subprocess.Popen[str], str]:
    """Start one worker; return it and its API root once it answers health."""
    process = subprocess.Popen(
        [sys.executable, "-m", "tests.service.worker", database_url, str(data_dir), *args],
        cwd=REPO,
        stdout=subprocess.PIPE,
        stderr=subprocess.DEVNULL,
        text=True,
        env=os.environ | {"PYTHONPATH": os.pathsep.join([str(REPO), *_python_path()])},
    )
    assert process.stdout is not None
    line = process.stdout.readline()
    if not line.startswith("PORT "):
        stop_worker(process)
        raise RuntimeError(f"worker did not start: {line!r}")
    api = f"http://127.0.0.1:{int(line.split()[1])}/api"
    deadline = time.monotonic() + 60
    while True:
        if _healthy(api):
            return process, api
        if time.monotonic() > deadline or process.poll() is not None:
            stop_worker(process)
            raise RuntimeError("worker never answered health")
        time.sleep(0.05)


@contextmanager
def workers(database_url: str, data_dir: Path, count: int, *args: str) -> Iterator[list[str]]:
    """`count` workers against one database; all are killed on the way out."""
    started: list[subprocess.Popen[str]] = []
    apis: list[str] = []
    try:
        for _ in range(count):
            process, api = start_worker(database_url, data_dir, *args)
            started.append(process)
            apis.append(api)
        yield apis
    finally:
        for process in started:
            stop_worker(process)


class Zygote:
    """A worker started with --zygote: `fork()` starts a fresh server in a moment (the imports
    are done once) and returns its pid and API root once it answers health; `kill(pid)`
    SIGKILLs that server and returns once it has stopped running."""

    def __init__(self, database_url: str, data_dir: Path, *args: str) -> None:
        command = [sys.executable, "-m", "tests.service.worker", database_url, str(data_dir)]
        self.process = subprocess.Popen(
            [*command, *args, "--zygote"],
            cwd=REPO,
            stdin=subprocess.PIPE,
            stdout=subprocess.PIPE,
            stderr=subprocess.DEVNULL,
            text=True,
            env=os.environ | {"PYTHONPATH": os.pathsep.join([str(REPO), *_python_path()])},
        )

    def fork(self) -> tuple[int, str]:
        assert self.process.stdin is not None and self.process.stdout is not None
        self.process.stdin.write("fork\n")
        self.process.stdin.flush()
        _, pid, _, port = self.process.stdout.readline().split()
        api = f"http://127.0.0.1:{port}/api"
        deadline = time.monotonic() + 60
        while not _healthy(api):
            assert time.monotonic() < deadline, "the forked server never answered health"
            time.sleep(0.05)
        return int(pid), api

    @staticmethod
    def kill(pid: int) -> None:
        os.kill(pid, signal.SIGKILL)
        deadline = time.monotonic() + 30
        while _running(pid):
            assert time.monotonic() < deadline, f"server {pid} outlived SIGKILL"
            time.sleep(0.02)

    def close(self) -> None:
        for child in psutil.Process(self.process.pid).children():
            child.kill()
        stop_worker(self.process)
        if self.process.stdin is not None:
            self.process.stdin.close()


def _healthy(api: str) -> bool:
    try:
        return httpx.get(f"{api}/serving/health", timeout=5).status_code == 200
    except httpx.TransportError:
        return False


def _running(pid: int) -> bool:
    try:
        return psutil.Process(pid).status() != psutil.STATUS_ZOMBIE
    except psutil.NoSuchProcess:
        return False


def _python_path() -> list[str]:
    """The caller's own PYTHONPATH entries (a checkout's src/ before an installed copy)."""
    return [entry for entry in os.environ.get("PYTHONPATH", "").split(os.pathsep) if entry]


def stop_worker(process: subprocess.Popen[str]) -> None:
    process.kill()
    process.wait(30)
    if process.stdout is not None:
        process.stdout.close()


def check_ledger(db: Database) -> FleetState:
    """No device over-reserved; no reservation without a deployment that holds it; no
    INITIALIZING or DEPLOYED deployment without its reservation — all read in one snapshot
    (REPEATABLE READ on PostgreSQL; a SQLite read transaction is one already)."""
    engine = db.engine
    if not db.is_sqlite:
        engine = engine.execution_options(isolation_level="REPEATABLE READ")
    with Session(engine) as session, session.begin():
        state = ledger.fleet_state(session)
        records = {
            row.id: deployments.to_record(row) for row in session.scalars(select(DeploymentRow))
        }
    used = state.used_bytes()
    for slot in state.slots:
        assert used.get(slot.key, 0) <= slot.capacity_bytes, f"{slot.location} over-reserved"
    holders = {r.deployment for r in state.reservations}
    for deployment_id in holders:
        assert records[deployment_id].status in HOLDING, records[deployment_id]
    for record in records.values():
        if record.status in (DeploymentStatus.INITIALIZING, DeploymentStatus.DEPLOYED):
            assert record.id in holders, f"{record.id} {record.status} holds nothing"
    return state
