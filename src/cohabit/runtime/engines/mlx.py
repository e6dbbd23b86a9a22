"""MLX launcher: `mlx_lm.server` on Apple silicon, the `metal_spawner` path (pure).

mlx_lm.server has no memory flag: the budget is what placement reserved on the unified pool,
and the KV cache grows with use. The request's context is therefore not passed on; keeping
within the budget relies on the estimate the reservation was made from.
"""

from __future__ import annotations

import sys

from cohabit.hardware.model import Vendor
from cohabit.runtime.engines.spec import LOCALHOST, LaunchSpec, base_url
from cohabit.runtime.errors import EngineChoiceError
from cohabit.runtime.interface import LaunchRequest

ENGINE = "mlx"
STARTUP_TIMEOUT_S = 600.0


def build_launch(request: LaunchRequest, *, port: int, python: str = sys.executable) -> LaunchSpec:
    """The `python -m mlx_lm.server` command for `request` on `port`.

    Raises EngineChoiceError when the placement is not an Apple unified-memory pool.
    """
    if request.placement.gpu_vendor is not Vendor.APPLE:
        raise EngineChoiceError(
            f"deployment {request.deployment_id!r}: MLX runs on Apple silicon only, "
            f"not on {request.placement.first.location}"
        )
    argv = [
        python,
        "-m",
        "mlx_lm.server",
        "--model",
        request.model_path,
        "--host",
        LOCALHOST,
        "--port",
        str(port),
    ]
    url = base_url(port)
    return LaunchSpec(
        engine=ENGINE,
        argv=(*argv, *request.extra_args),
        env={},
        port=port,
        base_url=url,
        health_url=f"{url}/v1/models",
        startup_timeout_s=STARTUP_TIMEOUT_S,
    )
