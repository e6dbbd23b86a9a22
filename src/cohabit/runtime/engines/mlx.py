"""MLX launcher: mlx-lm's server on Apple silicon, the `metal_spawner` path (pure).

mlx_lm.server has no memory flag, so the command runs `cohabit.runtime.mlxserve`, which sets
MLX's memory limit and wired limit to the budget and then starts mlx-lm's server in the same
process. The KV caches the server keeps between requests are capped by
`--prompt-cache-bytes` (mlx_lm/server.py, `main`) at the KV bytes the estimate reserved.
The server parses with argparse, so the model path goes as `--model=PATH` (`spec.option`),
never read as a flag.
"""

from __future__ import annotations

from cohabit.runtime.engines.spec import LaunchSpec, LaunchTarget, option
from cohabit.runtime.interface import LaunchRequest
from cohabit.runtime.mlxserve import MlxLimits, launcher_argv

ENGINE = "mlx"
STARTUP_TIMEOUT_S = 600.0


def limits(request: LaunchRequest) -> MlxLimits:
    """Both limits are the budget: the pool share placement reserved for this model."""
    return MlxLimits(
        memory_limit_bytes=request.budget_bytes, wired_limit_bytes=request.budget_bytes
    )


def build_launch(request: LaunchRequest, target: LaunchTarget) -> LaunchSpec:
    """The mlx-lm server command for `request` at `target`, inside its budget (the
    placement is an Apple pool: `launch.build_launch` checks)."""
    server_args = [
        option("--model", target.model(request)),
        "--host",
        target.host,
        "--port",
        str(target.port),
    ]
    if request.estimate is not None:
        server_args += ["--prompt-cache-bytes", str(request.estimate.kv_cache_bytes)]
    url = target.url()
    return LaunchSpec(
        engine=ENGINE,
        argv=(*launcher_argv(target.python, limits(request), server_args), *request.extra_args),
        env={},
        port=target.port,
        base_url=url,
        health_url=f"{url}/v1/models",
        startup_timeout_s=STARTUP_TIMEOUT_S,
    )
