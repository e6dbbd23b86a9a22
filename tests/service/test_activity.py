"""The gateway's traffic counters: in flight rises and falls, last use follows the clock,
finished requests land in the right latency bucket, and threads racing on one deployment
lose no count."""

from __future__ import annotations

import threading

from cohabit.service.telemetry.activity import LATENCY_BUCKETS_S, Activity


def test_counts_follow_requests() -> None:
    now = [100.0]
    activity = Activity(clock=lambda: now[0])
    assert activity.in_flight("a") == 0 and activity.last_used("a") is None
    activity.begin("a")
    activity.begin("a")
    assert activity.in_flight("a") == 2 and activity.last_used("a") == 100.0
    now[0] = 107.5
    activity.finish("a", seconds=0.003, ok=True, completion_tokens=5)
    activity.finish("a", seconds=12.0, ok=False)
    usage = activity.get("a")
    assert (usage.in_flight, usage.requests, usage.errors) == (0, 2, 1)
    assert usage.completion_tokens == 5 and usage.last_used == 107.5
    assert usage.buckets[0] == 1  # 3 ms: the first bucket (≤ 5 ms)
    assert usage.buckets[LATENCY_BUCKETS_S.index(30.0)] == 1  # 12 s: the ≤ 30 s bucket
    assert activity.get("b").requests == 0
    activity.forget("a")
    assert "a" not in activity.snapshot()


def test_threads_lose_no_count() -> None:
    activity = Activity()

    def work() -> None:
        for _ in range(2_000):
            activity.begin("a")
            activity.finish("a", seconds=0.01, ok=True)

    threads = [threading.Thread(target=work) for _ in range(4)]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join()
    usage = activity.get("a")
    assert usage.requests == 8_000 and usage.in_flight == 0
    assert sum(usage.buckets) == 8_000
