"""Autoscaling's decision as a table: (load, scaling, memory, now) → action and memory, with no
database, no reconciler and no clock (service/control/autoscale.py: decide)."""

from __future__ import annotations

import pytest

from cohabit.service.control.autoscale import (
    AddCopy,
    Load,
    RemoveCopy,
    ScaleAction,
    ScaleMemory,
    ScalePolicy,
    decide,
)
from cohabit.store.records import Scaling

POLICY = ScalePolicy(per_copy=4, window_s=30.0, cooldown_s=60.0)
NOW = 1000.0


def load(copies: int, ready: int, in_flight: int, waiting: int = 0) -> Load:
    return Load(copies=copies, ready=ready, in_flight=in_flight, waiting=waiting)


def scaling(min_copies: int = 1, max_copies: int | None = 2, starting: int = 1) -> Scaling:
    return Scaling(min_copies=min_copies, max_copies=max_copies, starting_copies=starting)


CASES: list[tuple[str, Load, Scaling, ScaleMemory, ScaleAction | None, ScaleMemory]] = [
    (
        "load above, first seen: the window starts",
        load(1, 1, 9),
        scaling(),
        ScaleMemory(),
        None,
        ScaleMemory(above_since=NOW),
    ),
    (
        "load above for 29 s: not yet",
        load(1, 1, 9),
        scaling(),
        ScaleMemory(above_since=NOW - 29),
        None,
        ScaleMemory(above_since=NOW - 29),
    ),
    (
        "load above for the whole window: one more copy",
        load(1, 1, 9),
        scaling(),
        ScaleMemory(above_since=NOW - 30),
        AddCopy(why="9 requests in flight on 1 copy, above 4 per copy for 30 s"),
        ScaleMemory(above_since=NOW - 30),
    ),
    (
        "requests held for a load count as load",
        load(1, 1, 2, waiting=3),
        scaling(),
        ScaleMemory(above_since=NOW - 30),
        AddCopy(why="2 requests in flight and 3 waiting on 1 copy, above 4 per copy for 30 s"),
        ScaleMemory(above_since=NOW - 30),
    ),
    (
        "exactly four per copy is not above",
        load(1, 1, 4),
        scaling(),
        ScaleMemory(above_since=NOW - 30),
        None,
        ScaleMemory(),
    ),
    (
        "at max_copies: above forgets its window",
        load(2, 2, 9),
        scaling(max_copies=2),
        ScaleMemory(above_since=NOW - 120),
        None,
        ScaleMemory(),
    ),
    (
        "a copy on its way: what serves is not judged",
        load(2, 1, 20),
        scaling(max_copies=3),
        ScaleMemory(above_since=NOW - 120),
        None,
        ScaleMemory(),
    ),
    (
        "below min_copies: a copy at once, no window",
        load(1, 1, 0),
        scaling(min_copies=2, max_copies=3),
        ScaleMemory(),
        AddCopy(why="below min_copies 2"),
        ScaleMemory(),
    ),
    (
        "one copy fewer carries half per copy or less, for the window: one copy less",
        load(2, 2, 1),
        scaling(),
        ScaleMemory(below_since=NOW - 30),
        RemoveCopy(why="1 request in flight on 2 copies, at most 2 per copy on 1 for 30 s"),
        ScaleMemory(below_since=NOW - 30),
    ),
    (
        "low load, first seen: the window starts",
        load(2, 2, 1),
        scaling(),
        ScaleMemory(),
        None,
        ScaleMemory(below_since=NOW),
    ),
    (
        "three on one copy fewer is above half: no removal",
        load(2, 2, 3),
        scaling(),
        ScaleMemory(below_since=NOW - 300),
        None,
        ScaleMemory(),
    ),
    (
        "at min_copies nothing is removed, idle or not",
        load(1, 1, 0),
        scaling(min_copies=1),
        ScaleMemory(below_since=NOW - 300),
        None,
        ScaleMemory(),
    ),
    (
        "a scale-to-zero deployment keeps one copy while loaded",
        load(1, 1, 0),
        scaling(min_copies=0, max_copies=2),
        ScaleMemory(),
        None,
        ScaleMemory(),
    ),
    (
        "cooling down after a decision: nothing, and nothing remembered",
        load(1, 1, 20),
        scaling(max_copies=3),
        ScaleMemory(decided_at=NOW - 59),
        None,
        ScaleMemory(decided_at=NOW - 59),
    ),
    (
        "the cool-down over: the window starts again",
        load(1, 1, 20),
        scaling(max_copies=3),
        ScaleMemory(decided_at=NOW - 60),
        None,
        ScaleMemory(above_since=NOW, decided_at=NOW - 60),
    ),
    (
        "no max_copies: starting_copies is the most",
        load(2, 2, 20),
        scaling(max_copies=None, starting=2),
        ScaleMemory(above_since=NOW - 30),
        None,
        ScaleMemory(),
    ),
]


@pytest.mark.parametrize(
    ("observed", "wanted", "memory", "action", "remembered"),
    [case[1:] for case in CASES],
    ids=[case[0] for case in CASES],
)
def test_the_decision_and_what_it_remembers(
    observed: Load,
    wanted: Scaling,
    memory: ScaleMemory,
    action: ScaleAction | None,
    remembered: ScaleMemory,
) -> None:
    assert decide(observed, wanted, memory, policy=POLICY, now=NOW) == (action, remembered)


def test_a_decision_carried_out_starts_the_cool_down_and_forgets_the_windows() -> None:
    memory = ScaleMemory(above_since=NOW - 30, below_since=None)
    assert memory.decided(NOW) == ScaleMemory(decided_at=NOW)
