"""The engine-argument table: every engine × hardware class (GPU, TP 2, MIG slice, AMD GPU,
unified pool, CPU pool) × backend gets exactly these arguments and environment from
`launch.build_launch`, and the combinations no engine supports fail with one clear error.
Plus the flags that follow from a deployment's settings and the server's choices."""

from __future__ import annotations

import argparse
import importlib.util
import re
from dataclasses import replace
from pathlib import Path
from types import ModuleType

import pytest

from cohabit.estimate.checkpoint import load_shape
from cohabit.estimate.estimate import Estimate, estimate_shape
from cohabit.estimate.settings import EngineSettings, KvSizing
from cohabit.runtime.engines import llamacpp, vllm
from cohabit.runtime.engines.launch import build_launch
from cohabit.runtime.engines.spec import HardLimit, LaunchSpec, LaunchTarget
from cohabit.runtime.errors import BudgetTooSmall, EngineChoiceError, LaunchError
from cohabit.runtime.interface import LaunchRequest
from cohabit.runtime.mlxserve import parse as split_mlx_args
from cohabit.runtime.tinymodel import write_tiny_model
from cohabit.units import GIB
from tests.estimate.conftest import shape_of
from tests.runtime.conftest import FAKE_VLLM, launch_request

PORT = 41234
MIG_UUID = "MIG-1f3c9a2e-77aa-5b1c-9e0d-2b6a9c1d4e5f"
LLAMA = "llama-3.1-8b-instruct"
HAMI = "/usr/local/vgpu/libvgpu.so"

# Backends: what differs between them is only the target. Kubernetes pods add theirs here.
TARGETS = {"local": LaunchTarget(port=PORT, python="python3")}

# Hardware classes: (fleet in tests/runtime/conftest.py, budget GiB, tensor parallel).
HARDWARE = {
    "gpu": ("nvidia", 24, 1),
    "gpu-tp2": ("nvidia", 30, 2),
    "mig": ("mig", 20, 1),
    "amd-gpu": ("amd", 48, 1),
    "unified": ("apple", 12, 1),
    "cpu": ("cpu", 6, 1),
}


@pytest.fixture(scope="module")
def tiny_gguf(tmp_path_factory: pytest.TempPathFactory) -> Path:
    return write_tiny_model(tmp_path_factory.mktemp("tiny") / "tiny.gguf")


def request_for(engine: str, hardware: str, model: str) -> LaunchRequest:
    """Llama-3.1-8B at 16,000 tokens, sized by the estimator, for vLLM and MLX; the tiny
    GGUF for llama.cpp (its layers fit from the file)."""
    fleet, gib, tp = HARDWARE[hardware]
    settings = EngineSettings(max_model_len=16000, tensor_parallel=tp)
    estimate: Estimate | None = None
    if engine in ("vllm", "mlx"):
        estimate = estimate_shape(shape_of(LLAMA), engine=engine, settings=settings)
    else:
        settings = EngineSettings()
    return launch_request(
        fleet, gib, tp=tp, engine=engine, model_path=model, settings=settings, estimate=estimate
    )


def vllm_args(*, tp: int, utilization: str) -> tuple[str, ...]:
    return (
        "vllm", "serve", "/models/llama", "--host", "127.0.0.1", "--port", str(PORT),
        "--served-model-name=tiny", "--tensor-parallel-size", str(tp),
        "--gpu-memory-utilization", utilization, "--max-model-len", "16000",
        "--max-num-seqs", "1024", "--max-num-batched-tokens", "8192",
    )  # fmt: skip


def llamacpp_args(model: str, *, layers: int) -> tuple[str, ...]:
    return (
        "python3", "-m", "llama_cpp.server", f"--model={model}", "--model_alias=tiny",
        "--host", "127.0.0.1", "--port", str(PORT), "--n_ctx", "256",
        "--n_gpu_layers", str(layers),
    )  # fmt: skip


def mlx_args(*, budget: int, kv_bytes: int) -> tuple[str, ...]:
    return (
        "python3", "-m", "cohabit.runtime.mlxserve",
        "--memory-limit-bytes", str(budget), "--wired-limit-bytes", str(budget), "--",
        "--model=/models/llama", "--host", "127.0.0.1", "--port", str(PORT),
        "--prompt-cache-bytes", str(kv_bytes),
    )  # fmt: skip


GGUF = "<tiny.gguf>"  # replaced by the fixture's path
# engine, hardware, argv, env
VALID = [
    (
        "vllm",
        "gpu",
        vllm_args(tp=1, utilization="0.2918"),
        {"CUDA_VISIBLE_DEVICES": "GPU-node-a-0"},
    ),
    (
        "vllm",
        "gpu-tp2",
        vllm_args(tp=2, utilization="0.3671"),
        {"CUDA_VISIBLE_DEVICES": "GPU-node-a-0,GPU-node-a-1"},
    ),
    # The whole 40 GiB slice is the budget and its own total: capped at 0.92.
    ("vllm", "mig", vllm_args(tp=1, utilization="0.92"), {"CUDA_VISIBLE_DEVICES": MIG_UUID}),
    (
        "vllm",
        "amd-gpu",
        vllm_args(tp=1, utilization="0.2466"),
        {
            "ROCR_VISIBLE_DEVICES": "GPU-node-b-0",
            "HIP_VISIBLE_DEVICES": "0",
            "CUDA_VISIBLE_DEVICES": "0",
        },
    ),
    # 2 layers + the output layer of the tiny model fit every budget here.
    ("llamacpp", "gpu", llamacpp_args(GGUF, layers=3), {"CUDA_VISIBLE_DEVICES": "GPU-node-a-0"}),
    ("llamacpp", "mig", llamacpp_args(GGUF, layers=3), {"CUDA_VISIBLE_DEVICES": MIG_UUID}),
    (
        "llamacpp",
        "amd-gpu",
        llamacpp_args(GGUF, layers=3),
        {
            "ROCR_VISIBLE_DEVICES": "GPU-node-b-0",
            "HIP_VISIBLE_DEVICES": "0",
            "CUDA_VISIBLE_DEVICES": "0",
        },
    ),
    ("llamacpp", "unified", llamacpp_args(GGUF, layers=3), {}),
    ("llamacpp", "cpu", llamacpp_args(GGUF, layers=0), {}),
    ("mlx", "unified", mlx_args(budget=12 * GIB, kv_bytes=2113929216), {}),
]
INVALID = [
    ("vllm", "unified", "vLLM needs an NVIDIA or AMD GPU, not mac unified pool (apple)"),
    ("vllm", "cpu", "vLLM needs an NVIDIA or AMD GPU, not host cpu pool (cpu)"),
    ("mlx", "gpu", "MLX runs on Apple silicon only, not node-a gpu 0 (nvidia)"),
    ("mlx", "mig", "MLX runs on Apple silicon only, not node-m gpu 0 mig 3g.40gb #0 (nvidia)"),
    ("mlx", "amd-gpu", "MLX runs on Apple silicon only, not node-b gpu 0 (amd)"),
    ("mlx", "cpu", "MLX runs on Apple silicon only, not host cpu pool (cpu)"),
]
HEALTH = {"vllm": "/health", "llamacpp": "/v1/models", "mlx": "/v1/models"}
TIMEOUT = {"vllm": 1200.0, "llamacpp": 300.0, "mlx": 600.0}
# The log lines that mark a load's milestones (MLX's server prints none of its own).
MILESTONES = {"vllm": vllm.MILESTONES, "llamacpp": llamacpp.MILESTONES, "mlx": ()}


@pytest.mark.parametrize("backend", sorted(TARGETS))
@pytest.mark.parametrize(
    ("engine", "hardware", "argv", "env"),
    [pytest.param(*row, id=f"{row[0]}-{row[1]}") for row in VALID],
)
def test_engine_arguments(
    tiny_gguf: Path,
    backend: str,
    engine: str,
    hardware: str,
    argv: tuple[str, ...],
    env: dict[str, str],
) -> None:
    model = str(tiny_gguf) if engine == "llamacpp" else "/models/llama"
    request = request_for(engine, hardware, model)
    shape = load_shape(tiny_gguf) if engine == "llamacpp" else None
    spec = build_launch(request, TARGETS[backend], shape=shape)
    base = f"http://127.0.0.1:{PORT}"
    assert spec == LaunchSpec(
        engine=engine,
        argv=tuple(arg.replace(GGUF, model) for arg in argv),
        env=env,
        port=PORT,
        base_url=base,
        health_url=f"{base}{HEALTH[engine]}",
        startup_timeout_s=TIMEOUT[engine],
        milestones=MILESTONES[engine],
    )


@pytest.mark.parametrize("backend", sorted(TARGETS))
@pytest.mark.parametrize(
    ("engine", "hardware", "message"),
    [pytest.param(*row, id=f"{row[0]}-{row[1]}") for row in INVALID],
)
def test_engines_refuse_hardware_they_cannot_run_on(
    backend: str, engine: str, hardware: str, message: str
) -> None:
    request = request_for(engine, hardware, "/models/llama")
    with pytest.raises(EngineChoiceError, match=rf"^dep-1: {re.escape(message)}$"):
        build_launch(request, TARGETS[backend])


def flags_of(spec: LaunchSpec) -> dict[str, str]:
    """`--flag value` and `--flag=value` pairs after the model (flags without a value map to
    "")."""
    args = list(spec.argv[3:])
    flags: dict[str, str] = {}
    while args:
        flag, equals, value = args.pop(0).partition("=")
        if not equals:
            value = args.pop(0) if args and not args[0].startswith("--") else ""
        flags[flag] = value
    return flags


def test_vllm_flags_follow_the_settings_it_was_sized_for() -> None:
    settings = EngineSettings(
        max_model_len=4096,
        max_num_seqs=16,
        kv_cache_dtype="fp8",
        dtype="float16",
        quantization="fp8",
        enforce_eager=True,
    )
    estimate = estimate_shape(shape_of(LLAMA), settings=settings)
    request = launch_request(
        "nvidia", 24, engine="vllm", model_path="/models/llama", settings=settings,
        estimate=estimate,
    )  # fmt: skip
    flags = flags_of(build_launch(request, TARGETS["local"]))
    assert {k: flags[k] for k in flags if k not in ("--host", "--port")} == {
        "--served-model-name": "tiny",
        "--tensor-parallel-size": "1",
        "--gpu-memory-utilization": flags["--gpu-memory-utilization"],
        "--max-model-len": "4096",
        "--max-num-seqs": "16",
        "--max-num-batched-tokens": str(estimate.max_num_batched_tokens),
        "--dtype": "float16",
        "--quantization": "fp8",
        "--kv-cache-dtype": "fp8",
        "--enforce-eager": "",
    }


@pytest.mark.parametrize(
    ("server_bytes", "config", "by_bytes"),
    [
        (False, None, False),
        (True, None, True),
        (True, KvSizing.UTILIZATION, False),
        (False, KvSizing.BYTES, True),
    ],
    ids=["default", "server-bytes", "config-overrides-server", "config-bytes"],
)
def test_vllm_kv_cache_bytes_by_server_or_config(
    server_bytes: bool, config: KvSizing | None, by_bytes: bool
) -> None:
    """Llama-3.1-8B, 24 GiB on an 80 GiB H100: utilization 0.2918 or the KV bytes
    `vllm_settings_for_budget` works out (budget.py's worked example)."""
    settings = EngineSettings(max_model_len=16000, kv_sizing=config)
    request = launch_request(
        "nvidia", 24, engine="vllm", model_path="/models/llama", settings=settings,
        estimate=estimate_shape(shape_of(LLAMA), settings=settings),
    )  # fmt: skip
    target = replace(TARGETS["local"], vllm_kv_cache_bytes=server_bytes)
    flags = flags_of(build_launch(request, target))
    if by_bytes:
        assert flags["--kv-cache-memory-bytes"] == "3520585728"
        assert "--gpu-memory-utilization" not in flags
    else:
        assert flags["--gpu-memory-utilization"] == "0.2918"
        assert "--kv-cache-memory-bytes" not in flags


def test_vllm_without_an_estimate_uses_budget_over_total_and_the_configured_limits() -> None:
    """A deployment sized by the caller (vram_allocation): no estimate to fit from."""
    settings = EngineSettings(max_model_len=8192, max_num_seqs=8)
    request = launch_request("nvidia", 24, engine="vllm", settings=settings)
    flags = flags_of(build_launch(request, TARGETS["local"]))
    assert (flags["--gpu-memory-utilization"], flags["--max-model-len"]) == ("0.3", "8192")
    assert flags["--max-num-seqs"] == "8" and "--max-num-batched-tokens" not in flags


def test_vllm_budget_too_small_names_the_deployment() -> None:
    settings = EngineSettings(max_model_len=16000)
    request = launch_request(
        "nvidia", 4, engine="vllm", deployment_id="small", settings=settings,
        estimate=estimate_shape(shape_of(LLAMA), settings=settings),
    )  # fmt: skip
    with pytest.raises(BudgetTooSmall, match=r"deployment 'small': .*needs .* budget 4(\.00)? GiB"):
        build_launch(request, TARGETS["local"])


@pytest.mark.parametrize("engine", ["vllm", "llamacpp"])
def test_hami_core_limit_env(engine: str, tiny_gguf: Path) -> None:
    """HAMi-core's names (src/multiprocess/multiprocess_memory_limit.{c,h}): a limit per
    visible device ordinal in MiB, and this deployment's own shared-region file."""
    model = str(tiny_gguf) if engine == "llamacpp" else "/models/llama"
    request = launch_request("nvidia", 24, tp=2 if engine == "vllm" else 1, engine=engine,
                             model_path=model)  # fmt: skip
    limit = HardLimit(library=HAMI, shared_cache="/data/engines/dep-1/hami.cache")
    target = replace(TARGETS["local"], hard_limit=limit)
    spec = build_launch(request, target, shape=load_shape(tiny_gguf) if engine != "vllm" else None)
    devices = {"CUDA_DEVICE_MEMORY_LIMIT_0": "24576m"}
    if engine == "vllm":
        devices["CUDA_DEVICE_MEMORY_LIMIT_1"] = "24576m"
    assert dict(spec.env) == {
        "CUDA_VISIBLE_DEVICES": "GPU-node-a-0,GPU-node-a-1" if engine == "vllm" else "GPU-node-a-0",
        "LD_PRELOAD": HAMI,
        "CUDA_DEVICE_MEMORY_SHARED_CACHE": "/data/engines/dep-1/hami.cache",
        **devices,
    }


def test_hami_core_limit_is_refused_on_amd() -> None:
    request = launch_request("amd", 48, engine="vllm")
    target = replace(TARGETS["local"], hard_limit=HardLimit(library=HAMI, shared_cache="/c"))
    with pytest.raises(LaunchError, match="NVIDIA GPUs only, not amd"):
        build_launch(request, target)


def test_a_pod_target_binds_every_interface_and_leaves_devices_to_the_plugin() -> None:
    request = launch_request("nvidia", 24, engine="vllm", model_path="/host/models/llama")
    pod = LaunchTarget(
        port=8000,
        host="0.0.0.0",
        executable="/usr/bin/vllm",
        model_path="/models/llama",
        device_env=False,
    )
    spec = build_launch(request, pod)
    assert spec.argv[:7] == (
        "/usr/bin/vllm", "serve", "/models/llama", "--host", "0.0.0.0", "--port", "8000",
    )  # fmt: skip
    assert dict(spec.env) == {}
    assert spec.base_url == "http://127.0.0.1:8000"


def test_llamacpp_server_binary_and_model_context(tiny_gguf: Path) -> None:
    """A llama-server binary is used when the target names one; with no context set, the
    model's own 256."""
    request = launch_request("gpu16", 6, engine="llamacpp", model_path=str(tiny_gguf))
    target = replace(TARGETS["local"], executable="/usr/bin/llama-server")
    spec = build_launch(request, target, shape=load_shape(tiny_gguf))
    assert spec.argv == (
        "/usr/bin/llama-server", "--model", str(tiny_gguf), "--alias", "tiny",
        "--host", "127.0.0.1", "--port", str(PORT), "--ctx-size", "256", "--n-gpu-layers", "3",
    )  # fmt: skip
    assert spec.health_url == f"http://127.0.0.1:{PORT}/health"


def test_llamacpp_moves_layers_off_a_small_budget() -> None:
    """Llama-3.1-8B (16-bit, ~15 GiB of weights) in 2 GiB: the context drops to 2,048, then
    layers go to the host — never all 33 on the device."""
    request = launch_request("gpu16", 2, engine="llamacpp", max_model_len=8192)
    spec = build_launch(request, TARGETS["local"], shape=shape_of(LLAMA))
    flags = flags_of(spec)
    assert flags["--n_ctx"] == "2048"
    assert 0 <= int(flags["--n_gpu_layers"]) < 33


def test_llamacpp_configured_layers_cap_the_fit(tiny_gguf: Path) -> None:
    settings = EngineSettings(n_gpu_layers=1)
    request = launch_request(
        "gpu16", 6, engine="llamacpp", model_path=str(tiny_gguf), settings=settings
    )
    flags = flags_of(build_launch(request, TARGETS["local"], shape=load_shape(tiny_gguf)))
    assert flags["--n_gpu_layers"] == "1"


@pytest.mark.parametrize(
    ("hardware", "engine", "sleep_mode", "sleeps"),
    [
        ("gpu", "vllm", True, True),
        ("gpu-tp2", "vllm", True, True),
        ("mig", "vllm", True, True),
        ("gpu", "vllm", False, False),
        ("amd-gpu", "vllm", True, False),
        ("gpu", "llamacpp", True, False),
    ],
    ids=["gpu", "gpu-tp2", "mig", "not-allowed", "amd", "llamacpp"],
)
def test_sleep_mode_only_for_vllm_on_nvidia_when_the_deployment_allows_it(
    hardware: str, engine: str, sleep_mode: bool, sleeps: bool, tiny_gguf: Path
) -> None:
    """--enable-sleep-mode and VLLM_SERVER_DEV_MODE=1 go together: vLLM registers /sleep,
    /wake_up and /is_sleeping only in its development mode
    (vllm/entrypoints/serve/sleep/api_router.py), and sleeps only where CUDA's allocator
    hands memory back; every other engine is unloaded instead."""
    fleet, gib, tp = HARDWARE[hardware]
    model = str(tiny_gguf) if engine == "llamacpp" else "/models/m"
    request = replace(
        launch_request(fleet, gib, tp=tp, engine=engine, model_path=model),
        sleep_mode=sleep_mode,
    )
    shape = load_shape(tiny_gguf) if engine == "llamacpp" else None
    spec = build_launch(request, TARGETS["local"], shape=shape)
    assert ("--enable-sleep-mode" in spec.argv) is sleeps
    assert spec.env.get("VLLM_SERVER_DEV_MODE") == ("1" if sleeps else None)


def test_extra_args_come_last() -> None:
    request = launch_request("nvidia", 24, engine="vllm", extra_args=("--seed", "7"))
    assert build_launch(request, TARGETS["local"]).argv[-2:] == ("--seed", "7")


# Served names and model paths come from data; each of these is read as a flag when it is
# passed on its own after a flag: "-O3" and "-cc.level" are vLLM's own shorthands
# (vllm/utils/argparse_utils.py turns -O<n> into --optimization-level and a dotted flag into
# a config key).
FLAG_LIKE = ["-tiny", "--port", "-O3", "-cc.level"]


def fake_vllm() -> ModuleType:
    """tests/fixtures/runtime/fake_vllm.py, whose `parse` refuses what `vllm serve` refuses."""
    spec = importlib.util.spec_from_file_location("fake_vllm", FAKE_VLLM)
    assert spec is not None and spec.loader is not None
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


def with_name(request: LaunchRequest, name: str) -> LaunchRequest:
    return replace(request, served_model_name=name)


@pytest.mark.parametrize("name", FLAG_LIKE)
def test_vllm_takes_a_name_and_a_path_that_look_like_flags_as_values(name: str) -> None:
    settings = EngineSettings(dtype="-half")  # a config value is data too
    request = launch_request("nvidia", 24, engine="vllm", model_path="-m", settings=settings)
    spec = build_launch(with_name(request, name), TARGETS["local"])
    assert spec.argv[2] == "./-m"  # the same relative path, no longer a flag
    assert f"--served-model-name={name}" in spec.argv and "--dtype=-half" in spec.argv
    parsed = fake_vllm().parse(list(spec.argv[1:]))
    assert (parsed.model_tag, parsed.served_model_name) == ("./-m", [name])


@pytest.mark.parametrize("name", FLAG_LIKE)
def test_llama_cpp_pythons_own_parser_reads_the_name_and_path_back(name: str) -> None:
    """Parsed by llama-cpp-python's server parser itself (llama_cpp/server/__main__.py,
    `main`, builds it with `add_args_from_model`)."""
    from llama_cpp.server.cli import add_args_from_model, parse_model_from_args
    from llama_cpp.server.settings import ModelSettings, Settings

    request = launch_request("cpu", 6, engine="llamacpp", model_path="-tiny.gguf")
    spec = build_launch(with_name(request, name), TARGETS["local"])
    parser = argparse.ArgumentParser()
    add_args_from_model(parser, Settings)
    parser.add_argument("--config_file")
    model = parse_model_from_args(ModelSettings, parser.parse_args(list(spec.argv[3:])))
    assert (model.model, model.model_alias) == ("-tiny.gguf", name)


@pytest.mark.parametrize("name", FLAG_LIKE)
def test_llama_server_takes_the_argument_after_a_flag_whatever_it_looks_like(name: str) -> None:
    """llama-server reads the argument after a flag as its value, raw (common/arg.cpp,
    `common_params_parse_ex`: `argv[++i]`), and has no `--flag=value` form."""
    request = launch_request("cpu", 6, engine="llamacpp", model_path="-tiny.gguf")
    target = replace(TARGETS["local"], executable="/usr/bin/llama-server")
    argv = build_launch(with_name(request, name), target).argv
    assert argv[1:5] == ("--model", "-tiny.gguf", "--alias", name)


@pytest.mark.parametrize("name", FLAG_LIKE)
def test_mlx_lm_server_takes_the_model_path_as_a_value(name: str) -> None:
    """The server's arguments parsed as mlx_lm/server.py's argparse parser does."""
    request = launch_request("apple", 12, engine="mlx", model_path=name)
    _limits, server_args = split_mlx_args(build_launch(request, TARGETS["local"]).argv[3:])
    parser = argparse.ArgumentParser()
    for flag in ("--model", "--host", "--port", "--prompt-cache-bytes"):
        parser.add_argument(flag)
    assert parser.parse_args(server_args).model == name
