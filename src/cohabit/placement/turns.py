"""The queue's turns (pure): which of the deployments waiting for room is placed next, and
why each one passed over still waits.

The queue is tried in its order (highest priority, then the earliest request; the store
keeps that order). The first deployment that fits now, unloading idle copies of lower
priority where that helps (placement/preemption.py), takes its turn; the ones before it that
do not fit stay where they are and block nobody behind them. A deployment whose request can
never be placed takes its turn at once: placing it ends it, saying why. A deployment placed
with copies waiting beside it fits only when every copy does, together (placement/copies.py);
preemption makes room for one copy, so it is not counted on there.

After a turn the caller places the deployment, reads the fleet again and asks for the next
turn among the deployments behind it: each turn sees what the previous one took.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass

from cohabit.placement.copies import CopiesNoFit, plan_copies
from cohabit.placement.preemption import Candidate, plan_with_preemption
from cohabit.placement.reasons import NoFit
from cohabit.placement.request import PlacementRequest
from cohabit.placement.state import FleetState


@dataclass(frozen=True, slots=True, kw_only=True)
class Waiting:
    """One queued deployment, as the queue sees it."""

    deployment: str
    priority: int
    # Its own request, then those of its copies waiting to be placed with it; empty when its
    # request can never be placed.
    requests: tuple[PlacementRequest, ...]


@dataclass(frozen=True, slots=True, kw_only=True)
class Passed:
    """A deployment that does not fit now, and why."""

    deployment: str
    no_fit: NoFit
    copies: CopiesNoFit | None = None  # when its copies were planned together


@dataclass(frozen=True, slots=True, kw_only=True)
class Turn:
    """The deployment to take off the queue and place (None: none fits now), and those
    before it that were passed over, in the queue's order."""

    take: str | None
    passed: tuple[Passed, ...]


def next_turn(line: Sequence[Waiting], state: FleetState, candidates: Sequence[Candidate]) -> Turn:
    """The next turn of `line` (in the queue's order) on `state`, where `candidates` are the
    copies preemption may unload (see the module)."""
    passed: list[Passed] = []
    for waiting in line:
        refused = _refusal(waiting, state, candidates)
        if refused is None:
            return Turn(take=waiting.deployment, passed=tuple(passed))
        passed.append(refused)
    return Turn(take=None, passed=tuple(passed))


def _refusal(waiting: Waiting, state: FleetState, candidates: Sequence[Candidate]) -> Passed | None:
    """Why `waiting` does not fit on `state`; None when it does (or can never fit)."""
    if not waiting.requests:
        return None
    found = plan_with_preemption(
        state, waiting.requests[0], priority=waiting.priority, candidates=candidates
    )
    if isinstance(found, NoFit):
        return Passed(deployment=waiting.deployment, no_fit=found)
    if len(waiting.requests) == 1:
        return None
    together = plan_copies(state, waiting.requests)
    if not isinstance(together, CopiesNoFit):
        return None
    return Passed(deployment=waiting.deployment, no_fit=together.no_fit, copies=together)
