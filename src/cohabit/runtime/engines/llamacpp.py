"""llama.cpp launcher: llama-cpp-python's server (`python -m llama_cpp.server`) or a
`llama-server` binary, with --n_gpu_layers and --n_ctx that fit the budget (pure).

On a GPU or unified pool, `llamacpp_settings_for_budget` does what llama.cpp's --fit does
against the budget instead of free memory: all layers on the device, the context halved
down to 2,048 tokens, then layers moved to the host. On a CPU pool nothing is offloaded.
"""

from __future__ import annotations

import sys

from cohabit.estimate.budget import BudgetShortfall, llamacpp_settings_for_budget
from cohabit.estimate.estimate import LLAMACPP_DEFAULT_CTX
from cohabit.estimate.shape import ModelShape
from cohabit.hardware.model import HardwareClass
from cohabit.runtime.engines.spec import LOCALHOST, LaunchSpec, base_url, visible_devices
from cohabit.runtime.errors import BudgetTooSmall
from cohabit.runtime.interface import LaunchRequest

ENGINE = "llamacpp"
STARTUP_TIMEOUT_S = 300.0  # GGUF files are mmapped; loading is mostly page faults
ALL_LAYERS = -1  # llama.cpp: offload every layer (used when the model's shape is unknown)


def context_size(request: LaunchRequest, shape: ModelShape | None) -> int:
    """The request's context, else llama-server's default capped at the model's own."""
    if request.max_model_len is not None:
        return request.max_model_len
    if shape is not None:
        return min(LLAMACPP_DEFAULT_CTX, shape.max_model_len)
    return LLAMACPP_DEFAULT_CTX


def build_launch(
    request: LaunchRequest,
    *,
    port: int,
    shape: ModelShape | None = None,
    server_binary: str | None = None,
    python: str = sys.executable,
) -> LaunchSpec:
    """The llama.cpp server command for `request` on `port`.

    `shape` (from the GGUF's metadata) lets the layers and context fit the budget; without
    it every layer is offloaded at the requested context. `server_binary` is a `llama-server`
    found on PATH; otherwise llama-cpp-python's server runs under `python`.

    Raises BudgetTooSmall when not even the compute buffers fit the budget.
    """
    ctx = context_size(request, shape)
    layers = ALL_LAYERS
    if request.placement.hardware_class is HardwareClass.CPU:
        layers = 0
    elif shape is not None:
        settings = llamacpp_settings_for_budget(
            shape, budget_bytes=request.budget_bytes, ctx_size=ctx
        )
        if isinstance(settings, BudgetShortfall):
            raise BudgetTooSmall(f"deployment {request.deployment_id!r}: {settings.message}")
        layers, ctx = settings.n_gpu_layers, settings.ctx_size
    url = base_url(port)
    if server_binary:
        argv = [
            server_binary,
            "--model",
            request.model_path,
            "--alias",
            request.served_model_name,
            "--host",
            LOCALHOST,
            "--port",
            str(port),
            "--ctx-size",
            str(ctx),
            "--n-gpu-layers",
            str(layers),
        ]
        health_url = f"{url}/health"
    else:
        # llama-cpp-python's server has no /health; /v1/models answers once the model loaded.
        argv = [
            python,
            "-m",
            "llama_cpp.server",
            "--model",
            request.model_path,
            "--model_alias",
            request.served_model_name,
            "--host",
            LOCALHOST,
            "--port",
            str(port),
            "--n_ctx",
            str(ctx),
            "--n_gpu_layers",
            str(layers),
        ]
        health_url = f"{url}/v1/models"
    return LaunchSpec(
        engine=ENGINE,
        argv=(*argv, *request.extra_args),
        env=visible_devices(request),
        port=port,
        base_url=url,
        health_url=health_url,
        startup_timeout_s=STARTUP_TIMEOUT_S,
    )
