"""The one entry point every backend calls to turn a launch request into an engine command.

The local spawner and the Kubernetes pod builder both call `build_launch(request, target)`;
only the `LaunchTarget` (bind host, port, program, model path as the process sees it, who
sets visible devices) differs between them, never the flags that hold the engine inside its
budget.
"""

from __future__ import annotations

from cohabit.estimate.shape import ModelShape
from cohabit.runtime.engines import check_hardware, llamacpp, mlx, vllm
from cohabit.runtime.engines.spec import LaunchSpec, LaunchTarget
from cohabit.runtime.interface import LaunchRequest


def build_launch(
    request: LaunchRequest, target: LaunchTarget, *, shape: ModelShape | None = None
) -> LaunchSpec:
    """The command for `request.engine` ("vllm", "llamacpp" or "mlx": already chosen).

    `shape` is the GGUF's metadata, which lets llama.cpp's layers and context fit the budget
    (other engines size from `request.estimate`).

    Raises LaunchError: EngineChoiceError for an engine that cannot run here, BudgetTooSmall
    when the budget cannot hold the smallest useful setting.
    """
    check_hardware(request.engine, request.placement)
    if request.engine == "vllm":
        return vllm.build_launch(request, target)
    if request.engine == "llamacpp":
        return llamacpp.build_launch(request, target, shape=shape)
    return mlx.build_launch(request, target)
