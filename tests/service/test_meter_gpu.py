"""The meter on NVIDIA GPUs with MIG, from NVML's recorded answers read through the real
pynvml (tests/hardware/test_usage.py explains the recording): an engine's memory on its MIG
slice is the sum over its process tree (a real process and its real child, whose pids the
recording is given), the rest of the slice's used memory is foreign, and placement then
refuses a card whose free memory others hold, naming it. Engines: the in-process double,
whose handle is pointed at the real process tree."""

from __future__ import annotations

import os
import signal
import subprocess
import sys
from collections.abc import Iterator
from pathlib import Path

import pynvml
import pytest

from cohabit.hardware.model import Fleet, Gpu, Node, Partition, Vendor
from cohabit.hardware.usage import nvidia_usage
from cohabit.placement.decision import Placement
from cohabit.placement.planner import plan
from cohabit.placement.reasons import NoFit
from cohabit.placement.request import PlacementRequest
from cohabit.service.control.reconciler import Reconciler
from cohabit.service.telemetry.meter import Meter
from cohabit.store import deployments, ledger
from cohabit.store.database import Database
from cohabit.store.records import DeploymentStatus
from cohabit.units import GIB, MIB
from tests.hardware.test_usage import recorded_nvml
from tests.service.scripted_runtime import ScriptedRuntime
from tests.service.test_meter import admit

S = DeploymentStatus
H100_MIG = Fleet(
    nodes=(
        Node(
            name="node-a",
            gpus=(
                Gpu(
                    index=0,
                    vendor=Vendor.NVIDIA,
                    product="NVIDIA H100 80GB HBM3",
                    memory_bytes=85520809984,
                    accel_version="12.4",
                    uuid="GPU-h100",
                    partitions=(
                        Partition(profile="3g.40gb", memory_bytes=40192 * MIB, uuid="MIG-a"),
                        Partition(profile="1g.10gb", memory_bytes=9728 * MIB, uuid="MIG-b"),
                    ),
                ),
                Gpu(
                    index=1,
                    vendor=Vendor.NVIDIA,
                    product="NVIDIA L40S",
                    memory_bytes=48305799168,
                    accel_version="12.4",
                    uuid="GPU-l40s",
                ),
            ),
        ),
    )
)


@pytest.fixture
def gpu_db(tmp_path: Path) -> Iterator[Database]:
    db = Database(f"sqlite:///{tmp_path / 'cohabit.db'}")
    db.migrate()
    ledger.save_fleet(db, H100_MIG)
    yield db
    db.dispose()


@pytest.fixture
def engine_tree() -> Iterator[tuple[int, int]]:
    """A real process with a real child: (engine pid, child pid)."""
    code = (
        "import subprocess, sys, time\n"
        "child = subprocess.Popen([sys.executable, '-c', 'import time; time.sleep(60)'])\n"
        "print(child.pid, flush=True)\n"
        "time.sleep(60)\n"
    )
    engine = subprocess.Popen(
        [sys.executable, "-c", code], stdout=subprocess.PIPE, text=True, start_new_session=True
    )
    assert engine.stdout is not None
    child = int(engine.stdout.readline())
    try:
        yield engine.pid, child
    finally:
        os.killpg(engine.pid, signal.SIGKILL)  # its own group (a new session): both of them
        engine.communicate()


def test_an_engine_on_a_mig_slice_is_metered_by_its_process_tree(
    gpu_db: Database, tmp_path: Path, engine_tree: tuple[int, int], monkeypatch: pytest.MonkeyPatch
) -> None:
    from cohabit.runtime.tinymodel import write_tiny_model
    from cohabit.service.registry.catalog import Registration, register_model

    engine, child = engine_tree
    recorded_nvml(monkeypatch, {"ENGINE": engine, "ENGINE_CHILD": child})
    path = write_tiny_model(tmp_path / "tiny.gguf", seed=1)
    model_id = register_model(gpu_db, Registration(name="tiny", path=str(path))).id
    reconciler = Reconciler(gpu_db, ScriptedRuntime(), owner="one")
    deployment_id = admit(gpu_db, model_id, 30 * GIB)
    reconciler.run_once()
    reconciler.run_once()
    record = deployments.get(gpu_db, deployment_id)
    assert record.placement is not None and record.placement.partition == "3g.40gb"
    assert deployments.advance(
        gpu_db,
        deployment_id,
        owner="one",
        allowed=(record.status,),
        to=record.status,
        values={"engine_handle": {"deployment_id": deployment_id, "pid": engine}},
    )
    meter = Meter(
        gpu_db, measure=lambda _fleet: nvidia_usage("node-a", nvml=pynvml), headroom_bytes=GIB
    )

    snapshot = meter.sample()

    reading = snapshot.deployments[deployment_id]
    assert reading.used_bytes == 16 * GIB  # 14 GiB + its child's 2 GiB
    assert reading.budget_bytes == 40192 * MIB and not reading.over_budget
    by_key = {d.key: d for d in snapshot.devices}
    mig = by_key[("node-a", 0, 0)]
    assert (mig.cohabit_bytes, mig.foreign_bytes) == (16 * GIB, 17716396032 - 16 * GIB)
    assert mig.location == "node-a gpu 0 mig 3g.40gb #0"
    small = by_key[("node-a", 0, 1)]
    assert (small.cohabit_bytes, small.foreign_bytes) == (0, 5098176512)

    # The 1g.10gb slice holds someone else's 4.5 GiB: not offered whole; the L40S has
    # 28.2 GiB free of 45: a 40 GiB request fits nowhere, and the NoFit says why.
    state = ledger.current_state(gpu_db).with_measurement(meter.measurement())
    small_request = plan(state, PlacementRequest(name="small", vram_bytes=4 * GIB))
    assert isinstance(small_request, Placement) and small_request.gpu_indices == [1]
    refused = plan(state, PlacementRequest(name="big", vram_bytes=40 * GIB))
    assert isinstance(refused, NoFit)
    assert refused.foreign_location == "node-a gpu 1"
    assert refused.message.endswith("; 16.8 GiB held by processes outside cohabit on node-a gpu 1")
    assert isinstance(plan(state.with_measurement(None), PlacementRequest(
        name="big", vram_bytes=40 * GIB)), Placement)  # fmt: skip
