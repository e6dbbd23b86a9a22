"""Which engine runtime a server drives. `cohabit serve` calls `build_runtime`; tests hand
their own `EngineRuntime` to `create_app` instead."""

from __future__ import annotations

from typing import TYPE_CHECKING

from cohabit.service.errors import RuntimeUnavailable
from cohabit.service.settings import Settings

if TYPE_CHECKING:
    from cohabit.runtime.spawner import LocalRuntime


def build_runtime(settings: Settings) -> LocalRuntime:
    """The local process spawner, keeping its logs and state under the data directory, with
    its pre-imported launchers starting (unless the settings turn them off).

    Imported here, not at module level, so the API and its tests never load it.
    """
    try:
        from cohabit.runtime.spawner import LocalRuntime
    except ImportError as err:
        raise RuntimeUnavailable(f"the local engine runtime is not available: {err}") from None
    runtime = LocalRuntime(
        settings.data_dir,
        startup_timeout_s=settings.startup_timeout_s,
        vllm_kv_cache_bytes=settings.vllm_kv_cache_bytes,
        hard_limit_library=settings.hard_limit_library,
    )
    if settings.preimport_engines:
        runtime.preimport()
    return runtime
