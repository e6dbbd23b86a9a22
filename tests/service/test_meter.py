"""The meter on this machine's CPU pool (no fleet file), with real processes and no doubles:

- a real llama.cpp server (llama-cpp-python's, on the tiny model the test writes): the bytes
  the meter attributes to it are > 0, within its budget and within 10% of the resident
  memory psutil reads for its process tree;
- a real process outside cohabit that holds 6 GiB shrinks the free budget the planner sees
  by about that much, so a deploy that fit before gets a NoFit naming the foreign memory,
  and fits again once that process has exited (the kernel populates the holder's pages in
  one mmap call, MAP_POPULATE: touching them one write fault at a time took 20-45 s on the
  shared two-core test machine);
- a test engine that grows past a tiny budget raises the over-budget event and health entry
  once, and with policy `stop` ends STOPPED with its budget released.

The host node keeps a 1 GiB OS reserve here (a fleet may set any), so that the measured
figures, not the default 8 GiB reserve of a 24 GiB machine, decide what is free.
"""

from __future__ import annotations

import subprocess
import sys
import time
from collections.abc import Callable, Iterator
from dataclasses import replace
from pathlib import Path

import httpx
import psutil
import pytest
from prometheus_client.parser import text_string_to_metric_families

from cohabit.hardware.host import discover_host
from cohabit.hardware.model import Fleet
from cohabit.runtime.engines.spec import LaunchSpec, base_url
from cohabit.runtime.interface import LaunchRequest, handle_from_json
from cohabit.runtime.spawner import LocalRuntime
from cohabit.runtime.tinymodel import write_tiny_model
from cohabit.service.api.serving import health_details
from cohabit.service.control import admission as service
from cohabit.service.control.overbudget import OverBudget
from cohabit.service.control.reconciler import Reconciler
from cohabit.service.registry.catalog import Registration, register_model
from cohabit.service.telemetry.meter import Meter
from cohabit.store import deployments, events, ledger
from cohabit.store.database import Database
from cohabit.store.records import DeploymentStatus
from cohabit.units import GIB, MIB
from tests.conftest import FIXTURES
from tests.service.scripted_runtime import ScriptedRuntime
from tests.service.server import deploy, serving, settings_for, wait_for, wait_status

S = DeploymentStatus
GROWING_ENGINE = FIXTURES / "runtime" / "growing_engine.py"
FOREIGN_BYTES = 6 * GIB


@pytest.fixture
def host_db(tmp_path: Path) -> Iterator[Database]:
    """SQLite holding this machine as a CPU pool with a 1 GiB OS reserve."""
    db = Database(f"sqlite:///{tmp_path / 'cohabit.db'}")
    db.migrate()
    ledger.save_fleet(db, Fleet(nodes=(replace(discover_host(), os_reserve_bytes=GIB),)))
    yield db
    db.dispose()


@pytest.fixture
def tiny_model(host_db: Database, tmp_path: Path) -> str:
    path = write_tiny_model(tmp_path / "models" / "tiny.gguf", seed=3)
    return register_model(host_db, Registration(name="tiny", path=str(path))).id


def admit(db: Database, model_id: str, size_bytes: int, **body: object) -> str:
    request = service.DeployRequest(
        model_id=model_id,
        config_id=None,
        file_id=None,
        engine_name=None,
        vram_allocation=size_bytes,
        force_cpu=False,
        body=body,
    )
    return service.admit(db, request).id


def drive(reconciler: Reconciler, db: Database, deployment_id: str, timeout_s: float = 90) -> S:
    """Reconciler passes until the deployment is serving or has ended."""
    deadline = time.monotonic() + timeout_s
    while True:
        reconciler.run_once()
        status = deployments.get(db, deployment_id).status
        if status not in (S.REQUESTED, S.DEPLOYING, S.INITIALIZING):
            return status
        if time.monotonic() > deadline:
            raise AssertionError(f"{deployment_id} still {status} after {timeout_s} s")
        time.sleep(0.1)


def tree_rss(pid: int) -> int:
    root = psutil.Process(pid)
    return sum(p.memory_info().rss for p in (root, *root.children(recursive=True)))


def pool_free(db: Database, meter: Meter) -> int:
    """The free budget the planner sees on the pool with the meter's latest figures."""
    state = ledger.current_state(db).with_measurement(meter.measurement())
    (free,) = state.free_bytes()
    return free


@pytest.mark.slow
def test_a_real_llama_cpp_engine_is_metered_by_its_resident_memory(
    host_db: Database, tiny_model: str, runtimes: Callable[..., LocalRuntime]
) -> None:
    runtime = runtimes(startup_timeout_s=90)
    reconciler = Reconciler(host_db, runtime, owner="one")
    meter = Meter(host_db, interval_s=5)
    deployment_id = admit(host_db, tiny_model, GIB)
    assert drive(reconciler, host_db, deployment_id) is S.DEPLOYED
    handle = handle_from_json(deployments.get(host_db, deployment_id).engine_handle)
    assert handle is not None and handle.pid is not None

    snapshot = meter.sample()
    own = tree_rss(handle.pid)

    reading = snapshot.deployments[deployment_id]
    assert reading.used_bytes is not None
    assert 0 < reading.used_bytes <= reading.budget_bytes == GIB
    assert abs(reading.used_bytes - own) <= 0.1 * own, (reading.used_bytes, own)
    (pool,) = snapshot.devices
    assert pool.cohabit_bytes == reading.used_bytes
    assert pool.foreign_bytes == pool.used_bytes - reading.used_bytes
    record = deployments.get(host_db, deployment_id)
    assert record.memory_used_bytes == reading.used_bytes
    memory = health_details(record)["memory"]
    assert memory["used_bytes"] == reading.used_bytes and memory["budget_bytes"] == GIB
    assert memory["over_budget"] is False
    assert [p.used_bytes for p in meter.history(deployment_id)] == [reading.used_bytes]


def hold_memory(size: int) -> subprocess.Popen[str]:
    """A process outside cohabit that holds `size` bytes of its own memory until killed: a
    private anonymous mapping the kernel fills at once (MAP_POPULATE, Linux), or written
    where that flag is missing."""
    code = (
        "import mmap, time\n"
        "populate = getattr(mmap, 'MAP_POPULATE', 0)\n"
        f"held = mmap.mmap(-1, {size}, flags=mmap.MAP_PRIVATE | mmap.MAP_ANONYMOUS | populate)\n"
        "if not populate:\n"
        f"    held.write(b'\\x01' * {size})\n"
        "print('holding', flush=True)\n"
        "time.sleep(120)\n"
    )
    child = subprocess.Popen([sys.executable, "-c", code], stdout=subprocess.PIPE, text=True)
    assert child.stdout is not None and child.stdout.readline().strip() == "holding"
    return child


@pytest.mark.slow
def test_memory_held_outside_cohabit_shrinks_what_placement_counts_on(
    host_db: Database, tiny_model: str
) -> None:
    reconciler = Reconciler(host_db, ScriptedRuntime(), owner="one")
    meter = Meter(host_db, interval_s=5, headroom_bytes=GIB)
    reconciler.measurement = meter.measurement
    holder = hold_memory(FOREIGN_BYTES)
    try:
        meter.sample()
        # More than is free beside the held memory, less than is free once it goes: the
        # plan counts this very sample, so the refusal does not hang on what other work on
        # the machine does meanwhile (a second suite gave back 3 GiB between two samples).
        wanted = pool_free(host_db, meter) + FOREIGN_BYTES // 2
        refused = admit(host_db, tiny_model, wanted)
        assert drive(reconciler, host_db, refused) is S.FAILED
    finally:
        holder.kill()
        holder.communicate()

    record = deployments.get(host_db, refused)
    assert record.last_error_code == "NoFitError"
    host = ledger.current_state(host_db).fleet.nodes[0].name
    message = record.last_error_message or ""
    assert message.startswith("insufficient_system_memory: 0/1 nodes fit")
    assert f"held by processes outside cohabit on {host} cpu pool" in message
    assert record.no_fit is not None and record.no_fit["foreign_location"] == f"{host} cpu pool"
    assert record.no_fit["foreign_bytes"] >= FOREIGN_BYTES

    def freed() -> bool:
        # The kernel takes the holder's pages back as it exits, and other work on a busy
        # machine moves the figures too: sample until the room is back.
        meter.sample()
        return pool_free(host_db, meter) > wanted

    wait_for(freed, timeout_s=30, interval_s=0.5)
    placed = admit(host_db, tiny_model, wanted)
    assert drive(reconciler, host_db, placed) is S.DEPLOYED
    assert [r.deployment_id for r in ledger.reservations(host_db)] == [placed]


def growing_launcher(grow_to: int) -> Callable[[LaunchRequest, int], LaunchSpec]:
    def launch(request: LaunchRequest, port: int) -> LaunchSpec:
        url = base_url(port)
        argv = (sys.executable, str(GROWING_ENGINE), "--port", str(port))
        return LaunchSpec(
            engine="llamacpp",
            argv=(*argv, "--grow-to", str(grow_to), "--after", "0.5"),
            port=port,
            base_url=url,
            health_url=f"{url}/health",
            startup_timeout_s=30.0,
        )

    return launch


def over_budget_setup(
    db: Database, model_id: str, runtimes: Callable[..., LocalRuntime], policy: str
) -> tuple[str, Reconciler, Meter]:
    """A deployment with a 64 MiB budget whose engine grows to 256 MiB, serving."""
    runtime = runtimes(launchers={"llamacpp": growing_launcher(256 * MIB)})
    reconciler = Reconciler(db, runtime, owner="one")
    meter = Meter(
        db,
        interval_s=5,
        tolerance_fraction=0.1,
        on_over_budget=OverBudget(db, runtime, restart=reconciler.restart, tolerance_fraction=0.1),
    )
    deployment_id = admit(db, model_id, 64 * MIB, over_budget=policy)
    assert drive(reconciler, db, deployment_id) is S.DEPLOYED
    handle = handle_from_json(deployments.get(db, deployment_id).engine_handle)
    assert handle is not None and handle.pid is not None
    deadline = time.monotonic() + 30
    while tree_rss(handle.pid) < 256 * MIB:
        assert time.monotonic() < deadline, "the test engine did not grow"
        time.sleep(0.1)
    return deployment_id, reconciler, meter


def kinds(db: Database, deployment_id: str) -> list[str]:
    return [event.kind for event in events.since(db, deployment_id)]


@pytest.mark.slow
def test_an_engine_over_its_budget_is_reported_once_and_left_running_by_default(
    host_db: Database, tiny_model: str, runtimes: Callable[..., LocalRuntime]
) -> None:
    deployment_id, _, meter = over_budget_setup(host_db, tiny_model, runtimes, "warn")
    reading = meter.sample().deployments[deployment_id]
    assert reading.over_budget and reading.used_bytes is not None
    assert reading.used_bytes > 64 * MIB * 1.1
    meter.sample()

    assert kinds(host_db, deployment_id).count("over_budget") == 1
    (event,) = [e for e in events.since(host_db, deployment_id) if e.kind == "over_budget"]
    assert event.data is not None and event.data["policy"] == "warn"
    assert "above its budget of 0.1 GiB" in event.message
    record = deployments.get(host_db, deployment_id)
    assert record.status is S.DEPLOYED and record.over_budget_since is not None
    memory = health_details(record)["memory"]
    assert memory["over_budget"] is True and memory["budget_bytes"] == 64 * MIB


@pytest.mark.slow
def test_policy_stop_ends_an_engine_over_its_budget_and_releases_the_budget(
    host_db: Database, tiny_model: str, runtimes: Callable[..., LocalRuntime]
) -> None:
    deployment_id, _, meter = over_budget_setup(host_db, tiny_model, runtimes, "stop")
    handle = handle_from_json(deployments.get(host_db, deployment_id).engine_handle)
    assert handle is not None and handle.pid is not None

    meter.sample()

    record = deployments.get(host_db, deployment_id)
    assert record.status is S.STOPPED
    assert ledger.reservations(host_db) == []
    assert not psutil.pid_exists(handle.pid) or (
        psutil.Process(handle.pid).status() == psutil.STATUS_ZOMBIE
    )
    assert kinds(host_db, deployment_id)[-2:] == ["over_budget", "stopped"]
    stopped = events.since(host_db, deployment_id)[-1]
    assert stopped.message.startswith("stopped: over its memory budget")


@pytest.mark.slow
def test_policy_restart_starts_the_engine_again_inside_the_budget_it_holds(
    host_db: Database, tiny_model: str, runtimes: Callable[..., LocalRuntime]
) -> None:
    deployment_id, reconciler, meter = over_budget_setup(host_db, tiny_model, runtimes, "restart")
    before = handle_from_json(deployments.get(host_db, deployment_id).engine_handle)
    assert before is not None and before.pid is not None

    meter.sample()

    after = handle_from_json(deployments.get(host_db, deployment_id).engine_handle)
    assert after is not None and after.pid not in (None, before.pid)
    assert not psutil.pid_exists(before.pid) or (
        psutil.Process(before.pid).status() == psutil.STATUS_ZOMBIE
    )
    assert drive(reconciler, host_db, deployment_id) is S.DEPLOYED
    assert [r.reserved_bytes for r in ledger.reservations(host_db)] == [64 * MIB]
    (event,) = [e for e in events.since(host_db, deployment_id) if e.kind == "over_budget"]
    assert event.message.endswith("restarting it inside its budget (policy restart)")


@pytest.mark.slow
def test_metrics_show_each_real_engine_within_its_budget_and_its_own_memory(
    tmp_path: Path,
) -> None:
    """`/metrics` of a real server on this machine's CPU pool (no fleet file) with two real
    llama.cpp engines, parsed with prometheus_client's own parser: each engine's used bytes
    are > 0, within its budget, and within 10% of the resident memory of its process tree as
    psutil reads it."""
    fleet = Fleet(nodes=(replace(discover_host(), os_reserve_bytes=GIB),))
    settings = settings_for(tmp_path, f"sqlite:///{tmp_path / 'cohabit.db'}", meter_interval_s=0.5)
    runtime = LocalRuntime(tmp_path / "data", startup_timeout_s=90)
    try:
        with (
            serving(settings, runtime, fleet=fleet) as api,
            httpx.Client(base_url=api, timeout=60) as http,
        ):
            path = write_tiny_model(tmp_path / "models" / "tiny.gguf", seed=3)
            model = http.post("/models/", json={"name": "tiny", "path": str(path)}).json()
            ids = [deploy(http, model["id"], vram_allocation=GIB).json() for _ in range(2)]
            pids = {}
            for deployment_id in ids:
                record = wait_status(http, deployment_id, timeout_s=120)
                assert record["status"] == "DEPLOYED", (
                    record["status"],
                    record["last_error_code"],
                    record["last_error_message"],
                )
                pids[deployment_id] = int(record["instances"][0]["container_id"])
            metrics_url = api.removesuffix("/api") + "/metrics"

            def scrape() -> dict[str, dict[str, float]] | None:
                text = http.get(metrics_url).text
                families = {f.name: f for f in text_string_to_metric_families(text)}
                figures = {
                    name: {s.labels["id"]: s.value for s in families[name].samples}
                    for name in ("cohabit_deployment_used_bytes", "cohabit_deployment_budget_bytes")
                }
                return (
                    figures if set(ids) <= set(figures["cohabit_deployment_used_bytes"]) else None
                )

            figures = wait_for(scrape, timeout_s=30, interval_s=0.5)
            own = {deployment_id: tree_rss(pid) for deployment_id, pid in pids.items()}
    finally:
        runtime.stop_all()

    for deployment_id in ids:
        used = figures["cohabit_deployment_used_bytes"][deployment_id]
        assert figures["cohabit_deployment_budget_bytes"][deployment_id] == GIB
        assert 0 < used <= GIB
        assert abs(used - own[deployment_id]) <= 0.1 * own[deployment_id], (used, own)
