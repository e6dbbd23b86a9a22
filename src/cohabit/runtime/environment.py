"""The environment an engine process starts with: a short allow-list of the server's, then
what the launch sets on purpose. Engines run model code (a checkpoint's own Python, a chat
template), so they never get the server's API or metrics token, its database URL, a Hugging
Face token or anything else its environment holds. Used by `spawner.LocalRuntime`.
"""

from __future__ import annotations

from collections.abc import Mapping

# Taken from the server's environment when set, each for something an engine does with it:
PASSED: tuple[str, ...] = (
    # Finding the engine's program and what it runs (vLLM's compilers, ninja).
    "PATH",
    # Cache and config roots: vLLM's ~/.cache/vllm and ~/.config/vllm (vllm/envs.py,
    # get_default_cache_root / get_default_config_root read XDG_CACHE_HOME, XDG_CONFIG_HOME,
    # else ~), llama.cpp's cache (common/common.cpp, fs_get_cache_directory: XDG_CACHE_HOME,
    # else $HOME/.cache).
    "HOME",
    "XDG_CACHE_HOME",
    "XDG_CONFIG_HOME",
    # Temporary files (Python's tempfile; torch's compile caches under it).
    "TMPDIR",
    # Text encoding and local time of what the engine prints.
    "LANG",
    "LANGUAGE",
    "TZ",
    # CUDA and ROCm libraries installed outside the linker's own paths; vLLM also looks for
    # NCCL there (vllm/envs.py, LD_LIBRARY_PATH), and builds kernels against CUDA_HOME.
    "LD_LIBRARY_PATH",
    "CUDA_HOME",
    # Python engines run under the server's interpreter and import what it imports
    # (llama-cpp-python's server, cohabit.runtime.mlxserve).
    "PYTHONPATH",
)
PASSED_PREFIXES: tuple[str, ...] = ("LC_",)  # the locale's categories (LC_ALL, LC_CTYPE, …)
UNBUFFERED = {"PYTHONUNBUFFERED": "1"}  # Python engines: lines reach the log as they happen


def passed(server_env: Mapping[str, str]) -> dict[str, str]:
    """What an engine takes from the server's environment: the allow-listed names only."""
    return {
        name: value
        for name, value in server_env.items()
        if name in PASSED or name.startswith(PASSED_PREFIXES)
    }


def engine_env(
    server_env: Mapping[str, str],
    *,
    launcher_env: Mapping[str, str],
    request_env: Mapping[str, str],
    marks: Mapping[str, str],
) -> dict[str, str]:
    """The engine's whole environment: the allow-listed part of the server's, the launcher's
    (visible devices, the HAMi-core limit), the request's own (it wins over the launcher's),
    then the marks that make the process ours, which nothing overrides."""
    return {**passed(server_env), **launcher_env, **request_env, **marks, **UNBUFFERED}
