"""The login failure throttle on a hand-driven clock: the limit, the window's end, a success
forgetting the count, and the bound on the addresses it remembers."""

from __future__ import annotations

from cohabit.service.access.throttle import FailureThrottle


class Clock:
    def __init__(self) -> None:
        self.now_s = 1000.0

    def __call__(self) -> float:
        return self.now_s


def test_the_limit_holds_until_the_window_ends() -> None:
    clock = Clock()
    throttle = FailureThrottle(max_failures=3, window_s=60, clock=clock)
    for _ in range(3):
        assert throttle.retry_after_s("10.0.0.1") is None
        throttle.failed("10.0.0.1")
    assert throttle.retry_after_s("10.0.0.1") == 60
    assert throttle.retry_after_s("10.0.0.2") is None  # per address
    clock.now_s += 59.5
    assert throttle.retry_after_s("10.0.0.1") == 1
    clock.now_s += 0.5
    assert throttle.retry_after_s("10.0.0.1") is None


def test_a_success_forgets_the_failures() -> None:
    throttle = FailureThrottle(max_failures=2, window_s=60, clock=Clock())
    throttle.failed("a")
    throttle.succeeded("a")
    throttle.failed("a")
    assert throttle.retry_after_s("a") is None


def test_it_remembers_at_most_max_clients_addresses() -> None:
    """Failures from ever new addresses cannot fill memory: the oldest is forgotten."""
    throttle = FailureThrottle(max_failures=1, window_s=60, max_clients=100, clock=Clock())
    for n in range(10_000):
        throttle.failed(f"10.0.{n // 256}.{n % 256}")
    assert len(throttle) == 100
    assert throttle.retry_after_s("10.0.39.15") == 60  # the newest is still held
    assert throttle.retry_after_s("10.0.0.0") is None  # the oldest went
