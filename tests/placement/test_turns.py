"""The queue's turns (placement/turns.py), as a table of (queue, fleet, idle copies) → the
deployment taken and those passed over, with why; then the order a whole queue is served in
when each turn's placement is held before the next is asked. No database: hand-made fleets."""

from __future__ import annotations

import pytest

from cohabit.placement.decision import Placement
from cohabit.placement.planner import plan
from cohabit.placement.preemption import Candidate
from cohabit.placement.reasons import NoFitReason
from cohabit.placement.state import FleetState
from cohabit.placement.turns import Turn, Waiting, next_turn
from tests.placement.fleets import gpu, held, node, req, state

ONE_CARD = state(node("node-a", gpu(0, 16)))
TWO_CARDS = state(node("node-a", gpu(0, 16), gpu(1, 16)))
HALF_HELD = held(ONE_CARD, ("idle", "node-a", 0, 10, None))


def waiting(name: str, *gib: float, priority: int = 0) -> Waiting:
    """Deployment `name` asking for `gib[0]` GiB, and for its copies `gib[1:]` placed with it
    (no size at all: a request that can never be placed)."""
    requests = tuple(req(f"{name}-{i}", size) for i, size in enumerate(gib))
    return Waiting(deployment=name, priority=priority, requests=requests)


def idle(deployment: str, *, priority: int = 0, stz: bool = False, busy: int = 0) -> Candidate:
    return Candidate(
        deployment=deployment,
        name=f"tiny-{deployment}",
        priority=priority,
        scale_to_zero=stz,
        idle_s=600.0,
        in_flight=busy,
    )


# (case, queue, state, idle copies, taken, passed over with their reasons, copies that fit)
TURNS = [
    ("an empty queue takes nothing", [], ONE_CARD, [], None, []),
    ("the first that fits", [waiting("a", 8), waiting("b", 4)], ONE_CARD, [], "a", []),
    (
        "one too large blocks nobody behind it",
        [waiting("big", 20), waiting("small", 4)],
        ONE_CARD,
        [],
        "small",
        [("big", NoFitReason.INSUFFICIENT_CAPACITY)],
    ),
    (
        "none fits: every one is passed over, in order",
        [waiting("a", 20), waiting("b", 30)],
        ONE_CARD,
        [],
        None,
        [("a", NoFitReason.INSUFFICIENT_CAPACITY), ("b", NoFitReason.INSUFFICIENT_CAPACITY)],
    ),
    (
        "a request that can never be placed takes its turn (placing it ends it)",
        [waiting("big", 20), waiting("broken")],
        ONE_CARD,
        [],
        "broken",
        [("big", NoFitReason.INSUFFICIENT_CAPACITY)],
    ),
    (
        "an idle copy of lower priority is unloaded for it",
        [waiting("urgent", 12, priority=5)],
        HALF_HELD,
        [idle("idle", priority=1)],
        "urgent",
        [],
    ),
    (
        "an idle copy of equal priority is not",
        [waiting("same", 12, priority=1)],
        HALF_HELD,
        [idle("idle", priority=1)],
        None,
        [("same", NoFitReason.INSUFFICIENT_CAPACITY)],
    ),
    (
        "a busy copy is not",
        [waiting("urgent", 12, priority=5)],
        HALF_HELD,
        [idle("idle", priority=1, busy=1)],
        None,
        [("urgent", NoFitReason.INSUFFICIENT_CAPACITY)],
    ),
    (
        "one of equal priority that agreed to scale to zero is",
        [waiting("same", 12, priority=1)],
        HALF_HELD,
        [idle("idle", priority=1, stz=True)],
        "same",
        [],
    ),
    (
        "never one of higher priority, agreed or not",
        [waiting("low", 12, priority=0)],
        HALF_HELD,
        [idle("idle", priority=9, stz=True)],
        None,
        [("low", NoFitReason.INSUFFICIENT_CAPACITY)],
    ),
    (
        "copies placed together fit only all together",
        [waiting("pair", 10, 10), waiting("one", 6)],
        ONE_CARD,
        [],
        "one",
        [("pair", NoFitReason.INSUFFICIENT_CAPACITY)],
    ),
    ("copies that fit together", [waiting("pair", 10, 10)], TWO_CARDS, [], "pair", []),
]


@pytest.mark.parametrize(
    ("line", "fleet_state", "candidates", "taken", "passed"),
    [pytest.param(*case[1:], id=case[0]) for case in TURNS],
)
def test_a_turn(
    line: list[Waiting],
    fleet_state: FleetState,
    candidates: list[Candidate],
    taken: str | None,
    passed: list[tuple[str, NoFitReason]],
) -> None:
    turn = next_turn(line, fleet_state, candidates)
    assert turn.take == taken
    assert [(p.deployment, p.no_fit.reason) for p in turn.passed] == passed


def test_copies_that_do_not_all_fit_say_how_many_did() -> None:
    turn = next_turn([waiting("three", 6, 6, 6)], ONE_CARD, [])
    (passed,) = turn.passed
    assert passed.copies is not None
    assert (passed.copies.wanted, passed.copies.fit) == (3, 2)
    assert passed.no_fit is passed.copies.no_fit


def served(line: list[Waiting], fleet_state: FleetState) -> tuple[list[str], list[str]]:
    """The queue served as the loop serves it: each turn's deployment placed (its
    reservation held), then the next turn asked among those behind it. The deployments
    placed, and those left waiting, in order."""
    placed: list[str] = []
    waiting_still: list[str] = []
    while True:
        turn: Turn = next_turn(line, fleet_state, [])
        waiting_still += [p.deployment for p in turn.passed]
        if turn.take is None:
            return placed, waiting_still
        chosen = line[len(turn.passed)]
        assert chosen.deployment == turn.take
        decision = plan(fleet_state, chosen.requests[0])
        assert isinstance(decision, Placement), decision
        fleet_state = fleet_state.with_reservations(decision.reservations(turn.take))
        placed.append(turn.take)
        line = line[len(turn.passed) + 1 :]


def test_each_turn_sees_what_the_turns_before_it_took() -> None:
    """16 GiB: a (8) and c (6) are placed, b (10) waits behind a though it came second: it
    no longer fits once a holds its 8, and d (4) does not fit beside a and c."""
    line = [waiting("a", 8), waiting("b", 10), waiting("c", 6), waiting("d", 4)]
    assert served(line, ONE_CARD) == (["a", "c"], ["b", "d"])
