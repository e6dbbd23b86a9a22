"""llama.cpp launcher: llama-cpp-python's server (`python -m llama_cpp.server`) or a
`llama-server` binary, with --n_gpu_layers and --n_ctx that fit the budget (pure).

On a GPU or unified pool, `llamacpp_settings_for_budget` does what llama.cpp's --fit does
against the budget instead of free memory: all layers on the device, the context halved
down to 2,048 tokens, then layers moved to the host. On a CPU pool nothing is offloaded.

The model path and the served name come from data and may start with `-`. llama-server
takes the argument after a flag as its value whatever it looks like (common/arg.cpp,
`common_params_parse_ex` reads `argv[++i]`) and knows no `--flag=value` form, so they follow
their flags there; llama-cpp-python's server parses with argparse, so they go as
`--flag=value` (`spec.option`).

The load's milestones (`MILESTONES`) are lines of llama.cpp's own log, which both servers
print (llama-cpp-python's with `verbose`, its default, llama_cpp/llama.py): the model
loader's first line, `llama_model_loader: loaded meta data with N key-value pairs…`, when
the server's code is imported and it opens the GGUF (src/llama-model-loader.cpp, the
`llama_model_loader` constructor), and `llama_context: constructing llama_context`, once
the weights are loaded and the context (KV cache, compute buffers) is built
(src/llama-context.cpp, the `llama_context` constructor, called by `llama_init_from_model`
after `llama_model_load_from_file` returned). Both are `LLAMA_LOG_INFO`, printed at the
default log level.
"""

from __future__ import annotations

from cohabit.estimate.budget import BudgetShortfall, llamacpp_settings_for_budget
from cohabit.estimate.estimate import LLAMACPP_DEFAULT_CTX
from cohabit.estimate.shape import ModelShape
from cohabit.hardware.model import HardwareClass
from cohabit.runtime.engines.spec import LaunchSpec, LaunchTarget, Markers, option
from cohabit.runtime.errors import BudgetTooSmall
from cohabit.runtime.interface import LaunchRequest, Milestone

ENGINE = "llamacpp"
STARTUP_TIMEOUT_S = 300.0  # GGUF files are mmapped; loading is mostly page faults
ALL_LAYERS = -1  # llama.cpp: offload every layer (used when the model's shape is unknown)
MILESTONES: Markers = (
    (Milestone.ENGINE_IMPORTED, "llama_model_loader: loaded meta data with "),
    (Milestone.WEIGHTS_LOADED, "llama_context: constructing llama_context"),
)
PYTHON_MODULE = "llama_cpp.server"  # llama-cpp-python's server, run as `python -m`
# What that server imports before it loads a model (llama_cpp/server/__main__.py: uvicorn,
# the app, its settings and argument parsing), and the parts of uvicorn its `uvicorn.run`
# picks at start (uvicorn/config.py, LOOP_FACTORIES, HTTP_PROTOCOLS, WS_PROTOCOLS and
# LIFESPAN at "auto"): a pre-imported launcher imports them once
# (runtime/forkserver.py). None touches a device.
PREIMPORTS = (
    "llama_cpp.server.__main__",
    "uvicorn.loops.auto",
    "uvicorn.protocols.http.auto",
    "uvicorn.protocols.websockets.auto",
    "uvicorn.lifespan.on",
)


def context_size(request: LaunchRequest, shape: ModelShape | None) -> int:
    """The sized context, else llama-server's default capped at the model's own."""
    if request.max_model_len is not None:
        return request.max_model_len
    if shape is not None:
        return min(LLAMACPP_DEFAULT_CTX, shape.max_model_len)
    return LLAMACPP_DEFAULT_CTX


def fitted(request: LaunchRequest, shape: ModelShape | None) -> tuple[int, int]:
    """The layers to offload and the context, as `build_launch` passes them. A backend
    that cannot read the GGUF where the engine runs (a pod) carries these instead."""
    ctx = context_size(request, shape)
    layers = ALL_LAYERS
    if request.placement.hardware_class is HardwareClass.CPU:
        layers = 0
    elif shape is not None:
        fit = llamacpp_settings_for_budget(shape, budget_bytes=request.budget_bytes, ctx_size=ctx)
        if isinstance(fit, BudgetShortfall):
            raise BudgetTooSmall(f"deployment {request.deployment_id!r}: {fit.message}")
        layers, ctx = fit.n_gpu_layers, fit.ctx_size
    configured = request.settings.n_gpu_layers
    if configured is not None and layers != 0:
        layers = configured if layers == ALL_LAYERS else min(layers, configured)
    return layers, ctx


def build_launch(
    request: LaunchRequest, target: LaunchTarget, *, shape: ModelShape | None = None
) -> LaunchSpec:
    """The llama.cpp server command for `request` at `target`.

    `shape` (from the GGUF's metadata) lets the layers and context fit the budget; without
    it every layer is offloaded at the sized context. `target.executable` is a
    `llama-server` binary; None runs llama-cpp-python's server under `target.python`. A
    configured `n_gpu_layers` caps the layers offloaded.

    Raises BudgetTooSmall when not even the compute buffers fit the budget.
    """
    layers, ctx = fitted(request, shape)
    model = target.model(request)
    url = target.url()
    if target.executable:
        argv = [
            target.executable,
            "--model",
            model,
            "--alias",
            request.served_model_name,
            "--host",
            target.host,
            "--port",
            str(target.port),
            "--ctx-size",
            str(ctx),
            "--n-gpu-layers",
            str(layers),
        ]
        health_url = f"{url}/health"
    else:
        # llama-cpp-python's server has no /health; /v1/models answers once the model loaded.
        argv = [
            target.python,
            "-m",
            PYTHON_MODULE,
            option("--model", model),
            option("--model_alias", request.served_model_name),
            "--host",
            target.host,
            "--port",
            str(target.port),
            "--n_ctx",
            str(ctx),
            "--n_gpu_layers",
            str(layers),
        ]
        health_url = f"{url}/v1/models"
    return LaunchSpec(
        engine=ENGINE,
        argv=(*argv, *request.extra_args),
        env=target.device_env_for(request),
        port=target.port,
        base_url=url,
        health_url=health_url,
        startup_timeout_s=STARTUP_TIMEOUT_S,
        milestones=MILESTONES,
    )
