"""Batch planning: place the most requests, then the most bytes, never fewer than online."""

from __future__ import annotations

import pytest

from cohabit.placement.batch import plan_batch
from cohabit.placement.decision import Placement
from cohabit.placement.planner import plan_online
from tests.placement.fleets import gpu, node, req, state


def placed_names(decisions: list) -> list[str]:
    return sorted(d.name for d in decisions if isinstance(d, Placement))


@pytest.mark.parametrize(
    ("fleet_state", "sizes", "online_placed", "batch_placed"),
    [
        pytest.param(state(node("n", gpu(0, 16))), [10, 6, 6, 4], 2, 3, id="issue-example-16gib"),
        pytest.param(
            state(node("n", gpu(0, 10), gpu(1, 10))), [4, 4, 6, 6], 3, 4, id="two-cards-pairing"
        ),
        pytest.param(
            state(node("n", gpu(0, 40, mig=(("3g.20gb", 20), ("1g.5gb", 5))))),
            [12, 4],
            2,
            2,
            id="mig-no-change-when-order-does-not-matter",
        ),
        pytest.param(state(node("n", gpu(0, 8))), [9, 10], 0, 0, id="nothing-fits"),
    ],
)
def test_batch_beats_online_when_order_matters(
    fleet_state, sizes: list[int], online_placed: int, batch_placed: int
) -> None:
    requests = [req(f"r{i}-{size}", size) for i, size in enumerate(sizes)]
    online = plan_online(fleet_state, requests)
    batch = plan_batch(fleet_state, requests)
    assert sum(d.placed for d in online) == online_placed
    assert sum(d.placed for d in batch) == batch_placed
    assert [d.name for d in batch] == [r.name for r in requests]


def test_batch_prefers_more_bytes_at_equal_count() -> None:
    """16 GiB card, 4/5/11 GiB: two fit either as (4, 5) or (5, 11); batch takes 16 GiB."""
    fleet_state = state(node("n", gpu(0, 16)))
    batch = plan_batch(fleet_state, [req("a", 4), req("b", 5), req("c", 11)])
    assert placed_names(batch) == ["b", "c"]


def test_batch_reports_no_fit_for_what_it_leaves_out() -> None:
    fleet_state = state(node("n", gpu(0, 16)))
    batch = plan_batch(fleet_state, [req("a", 10), req("b", 6), req("c", 6), req("d", 4)])
    left_out = [d for d in batch if not d.placed]
    assert [d.name for d in left_out] == ["a"]
    assert left_out[0].reason.value == "insufficient_capacity"
