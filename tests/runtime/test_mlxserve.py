"""The MLX launcher module: its command line, and the limits it sets on an `mlx.core`
stand-in (mlx runs only on Apple silicon; the module must import without it)."""

from __future__ import annotations

import sys
from typing import Any

import pytest

from cohabit.runtime import mlxserve
from cohabit.runtime.mlxserve import MlxLimits
from cohabit.units import GIB

SERVER_ARGS = ["--model", "/models/m", "--host", "127.0.0.1", "--port", "41234"]


def test_the_module_imports_without_mlx() -> None:
    assert "mlx" not in sys.modules and "mlx_lm" not in sys.modules
    assert mlxserve.MODULE == "cohabit.runtime.mlxserve"


def test_argv_round_trips_through_parse() -> None:
    limits = MlxLimits(memory_limit_bytes=12 * GIB, wired_limit_bytes=10 * GIB)
    argv = mlxserve.launcher_argv("python3", limits, SERVER_ARGS)
    assert argv[:3] == ["python3", "-m", "cohabit.runtime.mlxserve"]
    assert mlxserve.parse(argv[3:]) == (limits, SERVER_ARGS)


@pytest.mark.parametrize(
    "argv",
    [["--wired-limit-bytes", "1", "--"], ["--memory-limit-bytes", "0", "--wired-limit-bytes", "1"]],
    ids=["memory-missing", "memory-zero"],
)
def test_bad_limits_exit_with_usage(argv: list[str], capsys: pytest.CaptureFixture[str]) -> None:
    with pytest.raises(SystemExit) as exited:
        mlxserve.parse(argv)
    assert exited.value.code == 2
    assert "memory-limit-bytes" in capsys.readouterr().err


class FakeMx:
    """Records what mlx.core would be told; `device_info` as on a 64 GB M2 Max (its
    `max_recommended_working_set_size` is about three quarters of the memory)."""

    def __init__(self, recommended: int) -> None:
        self.calls: list[tuple[str, int]] = []
        self.recommended = recommended

    def set_memory_limit(self, limit: int) -> int:
        self.calls.append(("memory", limit))
        return 0

    def set_wired_limit(self, limit: int) -> int:
        self.calls.append(("wired", limit))
        return 0

    def device_info(self) -> dict[str, Any]:
        return {"max_recommended_working_set_size": self.recommended, "memory_size": 64 * GIB}


def test_limits_are_set_and_later_wired_calls_are_capped() -> None:
    """mlx_lm.server's main() sets the wired limit to the whole recommended working set;
    after apply_limits that call lands at the deployment's budget."""
    mx = FakeMx(recommended=48 * GIB)
    mlxserve.apply_limits(mx, MlxLimits(memory_limit_bytes=12 * GIB, wired_limit_bytes=12 * GIB))
    mx.set_wired_limit(mx.device_info()["max_recommended_working_set_size"])
    assert mx.calls == [("memory", 12 * GIB), ("wired", 12 * GIB), ("wired", 12 * GIB)]


def test_wired_limit_stays_within_the_systems() -> None:
    mx = FakeMx(recommended=8 * GIB)
    mlxserve.apply_limits(mx, MlxLimits(memory_limit_bytes=12 * GIB, wired_limit_bytes=12 * GIB))
    assert mx.calls == [("memory", 12 * GIB), ("wired", 8 * GIB)]
