"""A copy's engine failed: start it again, or let the failure stand — a table with no database
and no reconciler (service/control/copies.py: restart_after_failure)."""

from __future__ import annotations

import pytest

from cohabit.service.control.copies import (
    MAX_RESTARTS,
    CopyFailure,
    Restart,
    restart_after_failure,
)


def seen(
    *, copies: bool = True, another: bool = True, starts: int = 0, held: bool = True
) -> CopyFailure:
    return CopyFailure(
        has_copies=copies, another_serves=another, failed_starts=starts, budget_held=held
    )


CASES: list[tuple[str, CopyFailure, Restart | None]] = [
    ("another copy serves: start it again", seen(), Restart(failed_starts=1)),
    ("the second failed start in a row", seen(starts=1), Restart(failed_starts=2)),
    ("the last start allowed", seen(starts=MAX_RESTARTS - 1), Restart(failed_starts=MAX_RESTARTS)),
    ("failed every start allowed: it stands", seen(starts=MAX_RESTARTS), None),
    ("no other copy serves: the deployment fails as one engine would", seen(another=False), None),
    ("a deployment of one engine", seen(copies=False, another=False), None),
    ("its budget is gone (a device left the fleet)", seen(held=False), None),
]


@pytest.mark.parametrize(
    ("failure", "wanted"), [case[1:] for case in CASES], ids=[case[0] for case in CASES]
)
def test_restart_after_failure(failure: CopyFailure, wanted: Restart | None) -> None:
    assert restart_after_failure(failure) == wanted
