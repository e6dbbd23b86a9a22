"""Launchers pin the exact command and environment each engine gets for a placement
(vLLM on one GPU, TP 2, a MIG slice and AMD; llama.cpp on a GPU and on a CPU pool; MLX)."""

from __future__ import annotations

from pathlib import Path

import pytest

from cohabit.estimate.checkpoint import load_shape
from cohabit.estimate.estimate import estimate_shape
from cohabit.runtime.engines import llamacpp, mlx, vllm
from cohabit.runtime.engines.spec import LaunchSpec
from cohabit.runtime.errors import BudgetTooSmall, EngineChoiceError, LaunchError
from cohabit.runtime.tinymodel import write_tiny_model
from tests.estimate.conftest import shape_of
from tests.runtime.conftest import launch_request

PORT = 41234
BASE = f"http://127.0.0.1:{PORT}"
MIG_UUID = "MIG-1f3c9a2e-77aa-5b1c-9e0d-2b6a9c1d4e5f"


def vllm_argv(*flags: str, model: str = "/models/llama") -> tuple[str, ...]:
    head = ("vllm", "serve", model, "--host", "127.0.0.1", "--port", str(PORT))
    return (*head, "--served-model-name", "tiny", *flags)


@pytest.mark.parametrize(
    ("fleet", "gib", "tp", "argv", "env"),
    [
        pytest.param(
            "nvidia",
            24,
            1,
            vllm_argv(
                "--tensor-parallel-size", "1", "--gpu-memory-utilization", "0.3",
                "--max-model-len", "16000",
            ),
            {"CUDA_VISIBLE_DEVICES": "GPU-node-a-0"},
            id="single-gpu",
        ),
        pytest.param(
            "nvidia",
            30,
            2,
            vllm_argv(
                "--tensor-parallel-size", "2", "--gpu-memory-utilization", "0.375",
                "--max-model-len", "16000",
            ),
            {"CUDA_VISIBLE_DEVICES": "GPU-node-a-0,GPU-node-a-1"},
            id="tp2",
        ),
        pytest.param(
            "mig",
            20,
            1,
            # The whole 40 GiB slice is the budget and its own total: capped at 0.92.
            vllm_argv(
                "--tensor-parallel-size", "1", "--gpu-memory-utilization", "0.92",
                "--max-model-len", "16000",
            ),
            {"CUDA_VISIBLE_DEVICES": MIG_UUID},
            id="mig-slice",
        ),
        pytest.param(
            "amd",
            48,
            1,
            vllm_argv(
                "--tensor-parallel-size", "1", "--gpu-memory-utilization", "0.25",
                "--max-model-len", "16000",
            ),
            {
                "ROCR_VISIBLE_DEVICES": "GPU-node-b-0",
                "HIP_VISIBLE_DEVICES": "0",
                "CUDA_VISIBLE_DEVICES": "0",
            },
            id="amd",
        ),
    ],
)  # fmt: skip
def test_vllm_argv_and_env(
    fleet: str, gib: int, tp: int, argv: tuple[str, ...], env: dict[str, str]
) -> None:
    request = launch_request(
        fleet, gib, tp=tp, engine="vllm", model_path="/models/llama", max_model_len=16000
    )
    spec = vllm.build_launch(request, port=PORT)
    assert spec == LaunchSpec(
        engine="vllm",
        argv=argv,
        env=env,
        port=PORT,
        base_url=BASE,
        health_url=f"{BASE}/health",
        startup_timeout_s=vllm.STARTUP_TIMEOUT_S,
    )


def test_vllm_flags_from_the_estimate() -> None:
    """Llama-3.1-8B, 24 GiB on an 80 GiB H100: the numbers budget.py's docstring works out."""
    request = launch_request(
        "nvidia", 24, engine="vllm", model_path="/models/llama", max_model_len=16000
    )
    estimate = estimate_shape(shape_of("llama-3.1-8b-instruct"), max_model_len=16000)
    by_utilization = vllm.build_launch(request, port=PORT, estimate=estimate)
    by_kv_bytes = vllm.build_launch(request, port=PORT, estimate=estimate, kv_cache_memory=True)
    assert by_utilization.argv[-4:] == (
        "--gpu-memory-utilization", "0.2918", "--max-model-len", "16000",
    )  # fmt: skip
    assert by_kv_bytes.argv[-4:] == ("--kv-cache-memory", "3520585728", "--max-model-len", "16000")


def test_vllm_budget_too_small_names_the_deployment() -> None:
    request = launch_request("nvidia", 4, engine="vllm", deployment_id="small", max_model_len=16000)
    estimate = estimate_shape(shape_of("llama-3.1-8b-instruct"), max_model_len=16000)
    with pytest.raises(BudgetTooSmall, match=r"deployment 'small': .*needs .* budget 4(\.00)? GiB"):
        vllm.build_launch(request, port=PORT, estimate=estimate)


def test_vllm_hami_core_limit_env() -> None:
    request = launch_request("nvidia", 24, tp=2, engine="vllm", max_model_len=16000)
    spec = vllm.build_launch(request, port=PORT, hard_limit_library="/usr/local/vgpu/libvgpu.so")
    assert dict(spec.env) == {
        "CUDA_VISIBLE_DEVICES": "GPU-node-a-0,GPU-node-a-1",
        "LD_PRELOAD": "/usr/local/vgpu/libvgpu.so",
        "CUDA_DEVICE_MEMORY_LIMIT_0": "24576m",
        "CUDA_DEVICE_MEMORY_LIMIT_1": "24576m",
    }


def test_hami_core_limit_is_refused_on_amd() -> None:
    request = launch_request("amd", 48, engine="vllm")
    with pytest.raises(LaunchError, match="NVIDIA GPUs only, not amd"):
        vllm.build_launch(request, port=PORT, hard_limit_library="/usr/local/vgpu/libvgpu.so")


@pytest.fixture(scope="module")
def tiny_gguf(tmp_path_factory: pytest.TempPathFactory) -> Path:
    return write_tiny_model(tmp_path_factory.mktemp("tiny") / "tiny.gguf")


def llama_python_argv(model: str, *, ctx: int, layers: int) -> tuple[str, ...]:
    return (
        "python3", "-m", "llama_cpp.server", "--model", model, "--model_alias", "tiny",
        "--host", "127.0.0.1", "--port", str(PORT), "--n_ctx", str(ctx),
        "--n_gpu_layers", str(layers),
    )  # fmt: skip


@pytest.mark.parametrize(
    ("fleet", "env", "layers"),
    [
        # 2 layers + the output layer all fit a 6 GiB budget.
        pytest.param("gpu16", {"CUDA_VISIBLE_DEVICES": "GPU-local-0"}, 3, id="gpu"),
        pytest.param("cpu", {}, 0, id="cpu-pool"),
    ],
)
def test_llamacpp_python_server(
    tiny_gguf: Path, fleet: str, env: dict[str, str], layers: int
) -> None:
    request = launch_request(
        fleet, 6, engine="llamacpp", model_path=str(tiny_gguf), max_model_len=256
    )
    spec = llamacpp.build_launch(request, port=PORT, shape=load_shape(tiny_gguf), python="python3")
    assert spec == LaunchSpec(
        engine="llamacpp",
        argv=llama_python_argv(str(tiny_gguf), ctx=256, layers=layers),
        env=env,
        port=PORT,
        base_url=BASE,
        health_url=f"{BASE}/v1/models",
        startup_timeout_s=llamacpp.STARTUP_TIMEOUT_S,
    )


def test_llamacpp_server_binary_and_model_context(tiny_gguf: Path) -> None:
    """A llama-server on PATH is preferred; with no context asked, the model's own 256."""
    request = launch_request("gpu16", 6, engine="llamacpp", model_path=str(tiny_gguf))
    spec = llamacpp.build_launch(
        request, port=PORT, shape=load_shape(tiny_gguf), server_binary="/usr/bin/llama-server"
    )
    assert spec.argv == (
        "/usr/bin/llama-server", "--model", str(tiny_gguf), "--alias", "tiny",
        "--host", "127.0.0.1", "--port", str(PORT), "--ctx-size", "256", "--n-gpu-layers", "3",
    )  # fmt: skip
    assert spec.health_url == f"{BASE}/health"


def test_llamacpp_moves_layers_off_a_small_budget() -> None:
    """Llama-3.1-8B (16-bit, ~15 GiB of weights) in 2 GiB: the context drops to 2,048, then
    layers go to the host — never all 33 on the device."""
    request = launch_request("gpu16", 2, engine="llamacpp", max_model_len=8192)
    spec = llamacpp.build_launch(request, port=PORT, shape=shape_of("llama-3.1-8b-instruct"))
    argv = list(spec.argv)
    assert argv[argv.index("--n_ctx") + 1] == "2048"
    assert 0 <= int(argv[argv.index("--n_gpu_layers") + 1]) < 33


def test_mlx_server() -> None:
    request = launch_request("apple", 12, engine="mlx", model_path="/models/llama-mlx")
    spec = mlx.build_launch(request, port=PORT, python="python3")
    assert spec == LaunchSpec(
        engine="mlx",
        argv=(
            "python3", "-m", "mlx_lm.server", "--model", "/models/llama-mlx",
            "--host", "127.0.0.1", "--port", str(PORT),
        ),
        env={},
        port=PORT,
        base_url=BASE,
        health_url=f"{BASE}/v1/models",
        startup_timeout_s=mlx.STARTUP_TIMEOUT_S,
    )  # fmt: skip


def test_mlx_refuses_a_non_apple_placement() -> None:
    request = launch_request("nvidia", 12, engine="mlx")
    with pytest.raises(EngineChoiceError, match="Apple silicon only, not on node-a gpu 0"):
        mlx.build_launch(request, port=PORT)


def test_extra_args_come_last() -> None:
    request = launch_request("nvidia", 24, engine="vllm", extra_args=("--enforce-eager",))
    assert vllm.build_launch(request, port=PORT).argv[-1] == "--enforce-eager"
