"""The background loop the retention purge and the meter share: it runs its step at once and
then on every tick, a step that raises is logged and tried again, and stop ends the thread."""

from __future__ import annotations

import threading

import pytest

from cohabit.service.periodic import Periodic


def test_a_failing_step_is_retried_and_stop_ends_the_thread(
    caplog: pytest.LogCaptureFixture,
) -> None:
    calls: list[int] = []
    third = threading.Event()

    def step() -> None:
        calls.append(1)
        if len(calls) >= 3:
            third.set()
        if len(calls) == 1:
            raise RuntimeError("the database is away")

    periodic = Periodic("test-periodic", step, interval_s=0.01)
    periodic.start()
    assert third.wait(5), "the step was not run again after it failed"
    periodic.stop(timeout_s=5)
    ran = len(calls)
    assert not any(t.name == "test-periodic" for t in threading.enumerate())
    assert len(calls) == ran  # nothing runs after stop
    assert "test-periodic: a step failed" in caplog.text
