"""`python -m cohabit.runtime.mlxserve`: mlx-lm's server held to a deployment's budget.

MLX has no command-line memory flag, so this small launcher sets the process's limits and
then hands over to mlx-lm's server in the same process::

    python -m cohabit.runtime.mlxserve --memory-limit-bytes N --wired-limit-bytes W \\
        -- --model PATH --host 127.0.0.1 --port P

`mx.set_memory_limit(N)`: the guideline MLX's allocator keeps to during graph evaluation
(past it, it waits for scheduled work and reuses its cache; an allocation fails only when the
system has no memory left), so it is not a hard cap. `mx.set_wired_limit(W)`: at most W bytes
are kept resident.
mlx-lm's `server.main()` sets the wired limit itself to the whole device's recommended
working set (mlx_lm/server.py, `main`), so here every later `set_wired_limit` call is capped
at W. The server runs through `mlx_lm.server.main`, the console script `mlx_lm.server`
that mlx-lm's setup.py declares; `python -m mlx_lm.server` is deprecated (server.py's
`__main__` says so).

Importing this module needs neither mlx nor mlx-lm; they are imported when it runs.
"""

from __future__ import annotations

import argparse
import sys
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from typing import Any

MODULE = "cohabit.runtime.mlxserve"


@dataclass(frozen=True, slots=True, kw_only=True)
class MlxLimits:
    memory_limit_bytes: int
    wired_limit_bytes: int


def launcher_argv(python: str, limits: MlxLimits, server_args: Sequence[str]) -> list[str]:
    """The command line that runs mlx-lm's server with `server_args` under `limits`."""
    return [
        python,
        "-m",
        MODULE,
        "--memory-limit-bytes",
        str(limits.memory_limit_bytes),
        "--wired-limit-bytes",
        str(limits.wired_limit_bytes),
        "--",
        *server_args,
    ]


def parse(argv: Sequence[str]) -> tuple[MlxLimits, list[str]]:
    """Split our own options from the server's (everything after `--`)."""
    parser = argparse.ArgumentParser(prog=MODULE, description=__doc__)
    parser.add_argument("--memory-limit-bytes", type=int, required=True)
    parser.add_argument("--wired-limit-bytes", type=int, required=True)
    args = list(argv)
    split = args.index("--") if "--" in args else len(args)
    ours = parser.parse_args(args[:split])
    for name in ("memory_limit_bytes", "wired_limit_bytes"):
        if getattr(ours, name) < 1:
            parser.error(f"--{name.replace('_', '-')} must be a positive number of bytes")
    limits = MlxLimits(
        memory_limit_bytes=ours.memory_limit_bytes, wired_limit_bytes=ours.wired_limit_bytes
    )
    return limits, args[split + 1 :]


def capped(set_wired_limit: Callable[[int], int], cap_bytes: int) -> Callable[[int], int]:
    """`set_wired_limit` that never sets more than `cap_bytes`."""

    def set_capped(limit: int) -> int:
        return set_wired_limit(min(int(limit), cap_bytes))

    return set_capped


def apply_limits(mx: Any, limits: MlxLimits) -> None:
    """Set both limits on the `mlx.core` module `mx` and cap later wired-limit calls. The
    wired limit also stays within the system's (`max_recommended_working_set_size`), since
    MLX refuses a larger one."""
    mx.set_memory_limit(limits.memory_limit_bytes)
    cap = limits.wired_limit_bytes
    system = mx.device_info().get("max_recommended_working_set_size")
    if system:
        cap = min(cap, int(system))
    mx.set_wired_limit = capped(mx.set_wired_limit, cap)
    mx.set_wired_limit(cap)


def main(argv: Sequence[str] | None = None) -> None:
    limits, server_args = parse(sys.argv[1:] if argv is None else argv)
    import mlx.core as mx  # only on the Mac that runs the engine
    from mlx_lm import server

    apply_limits(mx, limits)
    sys.argv = ["mlx_lm.server", *server_args]
    server.main()


if __name__ == "__main__":
    main()
