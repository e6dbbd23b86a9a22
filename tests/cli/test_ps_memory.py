"""`cohabit ps`'s budget column: the engine's measured memory before its budget once the
meter has sampled it, red and marked "!" while it is over its budget."""

from __future__ import annotations

from typing import Any

import pytest

from cohabit.cli.ps import _memory
from cohabit.cli.table import Styled
from cohabit.sdk import Deployment
from cohabit.units import GIB, MIB


def deployment(**fields: Any) -> Deployment:
    return Deployment.model_validate(
        {
            "id": "6c8fae52-6e82-42d7-a3b8-003f680db8cf",
            "m_id": "0e4c0d0e-54a4-4c39-9d1e-6d3f2d7f0a11",
            "status": "DEPLOYED",
            "allocated_bytes": GIB,
            **fields,
        }
    )


@pytest.mark.parametrize(
    ("fields", "shown", "red"),
    [
        ({}, "1 GiB", False),
        ({"memory_used_bytes": 512 * MIB, "health_details": {"memory": {"over_budget": False}}},
         "0.5 GiB / 1 GiB", False),
        ({"memory_used_bytes": 2 * GIB, "health_details": {"memory": {"over_budget": True}}},
         "! 2 GiB / 1 GiB over budget", True),
    ],
)  # fmt: skip
def test_the_budget_column_shows_measured_memory(
    fields: dict[str, Any], shown: str, red: bool
) -> None:
    cell = _memory(deployment(**fields))
    assert str(cell) == shown
    assert isinstance(cell, Styled) is red
    if isinstance(cell, Styled):
        assert cell.style == "bold red"
