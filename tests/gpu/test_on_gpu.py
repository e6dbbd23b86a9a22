"""On a real NVIDIA GPU: `cohabit serve --fleet` (a fleet exported from this machine, with
its UUIDs) starts real llama.cpp CUDA servers, and NVML's own per-process figures show that
each engine runs on the device its deployment reserved and inside its budget.

- two engines on one GPU each stay within their budget;
- an engine placed on the machine's last GPU runs there, selected by UUID (on a multi-GPU
  host not CUDA's device 0);
- an engine placed on a MIG slice runs on that slice.

The model is a tiny llama written here with ~0.4 B random parameters (about 1.5 GB of f32
weights), big enough that offloading it shows up in NVML.
"""

from __future__ import annotations

from dataclasses import replace
from pathlib import Path
from typing import Any

import httpx
import pytest

from cohabit.hardware.fleetfile import dump_fleet
from cohabit.hardware.model import Fleet, Gpu, Node
from cohabit.runtime.tinymodel import TinyModelShape, write_tiny_model
from cohabit.units import GIB
from tests.cli.test_serve import cohabit_serve
from tests.e2e.engines import deploy, environ_of, wait_deployed

pytestmark = pytest.mark.gpu

BUDGET_GIB = 4
SHAPE = TinyModelShape(
    n_layers=8, n_embd=2048, n_heads=16, n_kv_heads=8, n_ff=5632, context_length=4096
)


def fleet_of(machine: Node, gpus: tuple[Gpu, ...]) -> str:
    return dump_fleet(Fleet(nodes=(replace(machine, gpus=gpus, notices=()),)))


def deployed(client: httpx.Client, model: Path, name: str) -> dict[str, Any]:
    return dict(wait_deployed(client, deploy(client, model, name, BUDGET_GIB * GIB), timeout_s=300))


def used_on(uuid: str, pid: int) -> int | None:
    """Bytes NVML says `pid` uses on the GPU or MIG device `uuid`; None when it is not there."""
    import pynvml

    pynvml.nvmlInit()
    try:
        handle = pynvml.nvmlDeviceGetHandleByUUID(uuid.encode())
        for process in pynvml.nvmlDeviceGetComputeRunningProcesses(handle):
            if process.pid == pid:
                return int(process.usedGpuMemory or 0)
        return None
    finally:
        pynvml.nvmlShutdown()


@pytest.fixture(scope="module")
def model(tmp_path_factory: pytest.TempPathFactory) -> Path:
    return write_tiny_model(tmp_path_factory.mktemp("models") / "big-tiny.gguf", shape=SHAPE)


def test_two_engines_on_one_gpu_stay_within_their_budgets(
    tmp_path: Path, machine: Node, llama_server: str, model: Path, data_dir: Path
) -> None:
    whole = [gpu for gpu in machine.gpus if not gpu.partitions]
    if not whole or (whole[0].memory_bytes or 0) < 2 * BUDGET_GIB * GIB:
        pytest.fail(f"needs a GPU without MIG and with at least {2 * BUDGET_GIB} GiB")
    with (
        cohabit_serve(tmp_path, fleet_of(machine, (whole[0],))) as (api, _process),
        httpx.Client(base_url=api, timeout=30) as client,
    ):
        records = [deployed(client, model, name) for name in ("first", "second")]
        for record in records:
            pid = int(record["instances"][0]["container_id"])
            assert record["gpu_id"] == whole[0].uuid
            used = used_on(whole[0].uuid or "", pid)
            print(f"{record['id']}: NVML {used} bytes, budget {BUDGET_GIB * GIB}")
            assert used is not None and used > 0, "the engine is not on the GPU"
            assert used <= BUDGET_GIB * GIB


def test_the_card_chosen_by_uuid_is_the_one_that_runs_it(
    tmp_path: Path, machine: Node, llama_server: str, model: Path, data_dir: Path
) -> None:
    last = max((gpu for gpu in machine.gpus if not gpu.partitions), key=lambda gpu: gpu.index)
    with (
        cohabit_serve(tmp_path, fleet_of(machine, (last,))) as (api, _process),
        httpx.Client(base_url=api, timeout=30) as client,
    ):
        record = deployed(client, model, "chosen")
        pid = int(record["instances"][0]["container_id"])
        assert environ_of(pid)["CUDA_VISIBLE_DEVICES"] == last.uuid
        assert used_on(last.uuid or "", pid), f"the engine does not run on GPU {last.index}"
        for other in machine.gpus:
            if other.uuid != last.uuid and not other.partitions:
                assert used_on(other.uuid or "", pid) is None


@pytest.mark.gpu_mig
def test_an_engine_on_a_mig_slice_runs_on_that_slice(
    tmp_path: Path, machine: Node, llama_server: str, model: Path, data_dir: Path
) -> None:
    sliced = [gpu for gpu in machine.gpus if gpu.partitions]
    if not sliced:
        pytest.fail("needs a GPU in MIG mode with at least one slice")
    with (
        cohabit_serve(tmp_path, fleet_of(machine, (sliced[0],))) as (api, _process),
        httpx.Client(base_url=api, timeout=30) as client,
    ):
        record = deployed(client, model, "sliced")
        assert record["hardware_class"] == "hardware_isolated"
        pid = int(record["instances"][0]["container_id"])
        slice_uuid = environ_of(pid)["CUDA_VISIBLE_DEVICES"]
        assert slice_uuid in {part.uuid for part in sliced[0].partitions}
        assert used_on(slice_uuid, pid) is not None, "the engine is not on its MIG slice"
