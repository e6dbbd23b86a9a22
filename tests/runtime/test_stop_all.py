"""`LocalRuntime.stop_all()`, what `cohabit serve` calls when it shuts down: every engine is
signalled at once and those that ignore SIGTERM are killed after the grace period, so the
whole stop takes about one grace period however many engines there are. Real processes
(fake_engine.py, which can ignore SIGTERM and keep a child in its group)."""

from __future__ import annotations

import time
from collections.abc import Callable
from pathlib import Path

from cohabit.runtime.interface import EngineState
from cohabit.runtime.process import group_alive
from cohabit.runtime.spawner import LocalRuntime
from tests.runtime.conftest import fake_launcher, launch_request, wait_for

GRACE_S = 2.0


def test_stop_all_is_one_grace_period_for_all_engines(
    runtimes: Callable[..., LocalRuntime], model_file: Path
) -> None:
    runtime = runtimes(
        stop_grace_s=GRACE_S,
        launchers={"fake": fake_launcher("serve", "--ignore-term", "--child")},
    )
    handles = [
        runtime.start(
            launch_request(
                "cpu", 1, engine="fake", model_path=str(model_file), deployment_id=f"dep-{i}"
            )
        )
        for i in range(3)
    ]
    for handle in handles:
        assert wait_for(runtime, handle, EngineState.READY).state is EngineState.READY
    pids = [runtime.status(handle).pid for handle in handles]
    started = time.monotonic()
    runtime.stop_all()
    took_s = time.monotonic() - started
    assert not [pid for pid in pids if pid is None or group_alive(pid)]
    # One grace period, then SIGKILL to all: one after the other would be at least 3 × 2 s.
    assert GRACE_S <= took_s < 2 * GRACE_S + 1.0
    assert {runtime.status(handle).state for handle in handles} == {EngineState.STOPPED}
