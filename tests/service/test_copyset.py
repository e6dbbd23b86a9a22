"""A deployment seen through its copies: the status it shows and the route table's target
(store/copyset.py, service/gateway/routing.py) — pure, from records as `list_active` gives them."""

from __future__ import annotations

from dataclasses import replace
from datetime import UTC, datetime, timedelta

import pytest

from cohabit.service.gateway.routing import snapshot_of
from cohabit.store import copyset
from cohabit.store.records import ACTIVE, DeploymentRecord, DeploymentStatus

S = DeploymentStatus
DEPLOYMENT = "6c8fae52-6e82-42d7-a3b8-003f680db8cf"
COPY_1 = "0e4c0d0e-54a4-4c39-9d1e-6d3f2d7f0a11"
COPY_2 = "9b1f7b3a-51a8-4a57-8d0e-2c9b7f6a4e21"
OTHER = "4f0c9d1a-7e53-4bb0-9a5c-1d2e3f405162"
T0 = datetime(2026, 12, 1, 6, 0, tzinfo=UTC)


def row(
    row_id: str,
    status: DeploymentStatus,
    *,
    copy_of: str | None = None,
    copy_index: int = 0,
    port: int | None = None,
    name: str = "tiny",
) -> DeploymentRecord:
    """A row as the store hands it back; `port`: its engine's (a handle once started)."""
    handle = None
    if port is not None:
        handle = {"deployment_id": row_id, "port": port, "base_url": f"http://127.0.0.1:{port}/"}
    return DeploymentRecord(
        id=row_id,
        model_id="m",
        config_id="c",
        file_id=None,
        model_name=name,
        engine="llamacpp",
        status=status,
        request={},
        model_path=None,
        requested_bytes=1,
        tensor_parallel=1,
        max_model_len=None,
        estimate=None,
        engine_settings={},
        placement=None,
        no_fit=None,
        last_error_code=None,
        last_error_message=None,
        last_error_at=None,
        engine_handle=handle,
        claimed_by=None,
        claimed_until=None,
        requested_at=T0 + timedelta(seconds=copy_index),
        deployed_at=T0 + timedelta(minutes=1) if status is S.DEPLOYED else None,
        stopped_at=None,
        released_at=None,
        copy_of=copy_of,
        copy_index=copy_index,
    )


@pytest.mark.parametrize(
    ("statuses", "shown"),
    [
        ((S.DEPLOYED,), S.DEPLOYED),
        ((S.INITIALIZING, S.DEPLOYED), S.DEPLOYED),  # copy 0 restarting, copy 1 serving
        ((S.ERROR, S.DEPLOYED), S.DEPLOYED),  # copy 0 failed, copy 1 serving
        ((S.REQUESTED, S.INITIALIZING), S.INITIALIZING),  # furthest along
        ((S.QUEUED, S.DEPLOYING), S.DEPLOYING),
        ((S.UNLOADED,), S.UNLOADED),
        ((S.STOPPED, S.STOPPED), S.STOPPED),  # ended: copy 0's
        ((S.ERROR, S.STOPPED), S.ERROR),
        ((S.FAILED, S.REQUESTED), S.REQUESTED),  # a copy still on its way: not ended
    ],
)  # fmt: skip
def test_a_deployment_shows_deployed_while_any_copy_serves(
    statuses: tuple[DeploymentStatus, ...], shown: DeploymentStatus
) -> None:
    copies = [
        row(COPY_1 if i else DEPLOYMENT, status, copy_of=DEPLOYMENT if i else None, copy_index=i)
        for i, status in enumerate(statuses)
    ]
    assert copyset.status_of(copies) is shown


def test_every_active_status_has_a_rank() -> None:
    for status in ACTIVE:
        assert copyset.status_of([row(DEPLOYMENT, status)]) is status


def test_rows_group_under_their_deployment_copy_0_first() -> None:
    rows = [
        row(COPY_2, S.DEPLOYED, copy_of=DEPLOYMENT, copy_index=2),
        row(OTHER, S.DEPLOYED, name="other"),
        row(DEPLOYMENT, S.DEPLOYED),
        row(COPY_1, S.REQUESTED, copy_of=DEPLOYMENT, copy_index=1),
    ]
    groups = copyset.by_deployment(rows)
    assert list(groups) == [DEPLOYMENT, OTHER]
    assert [c.id for c in groups[DEPLOYMENT]] == [DEPLOYMENT, COPY_1, COPY_2]
    assert copyset.serving(groups[DEPLOYMENT]) == []  # no engine started


def test_one_target_carries_every_serving_copy_and_copies_are_no_names() -> None:
    rows = [
        row(DEPLOYMENT, S.DEPLOYED, port=9000),
        row(COPY_1, S.DEPLOYED, copy_of=DEPLOYMENT, copy_index=1, port=9001),
        row(COPY_2, S.INITIALIZING, copy_of=DEPLOYMENT, copy_index=2, port=9002),
        row(OTHER, S.DEPLOYED, name="other", port=9100),
    ]
    snapshot = snapshot_of(rows, taken_at=0.0)
    target = snapshot.by_id[DEPLOYMENT]
    assert target.engines == ("http://127.0.0.1:9000", "http://127.0.0.1:9001")
    assert target.status is S.DEPLOYED
    # A copy's id routes to its deployment; copies are neither targets nor served names.
    assert snapshot.by_id[COPY_1] is target and snapshot.by_id[COPY_2] is target
    assert set(snapshot.by_name) == {"tiny", DEPLOYMENT, "other", OTHER}
    assert snapshot.by_name["tiny"] == (target,)


# Copy 0 on its way, or DEPLOYED with no engine (its failed engine starting again), or
# ended (None).
@pytest.mark.parametrize("copy_0", [S.REQUESTED, S.INITIALIZING, S.DEPLOYED, None])
def test_copy_0_not_serving_while_copy_1_serves_still_routes(
    copy_0: DeploymentStatus | None,
) -> None:
    rows = [row(COPY_1, S.DEPLOYED, copy_of=DEPLOYMENT, copy_index=1, port=9001)]
    if copy_0 is not None:
        rows.insert(0, row(DEPLOYMENT, copy_0))
    target = snapshot_of(rows, taken_at=0.0).by_id[DEPLOYMENT]
    assert target.deployment_id == DEPLOYMENT  # traffic counted under the deployment
    assert (target.status, target.engines) == (S.DEPLOYED, ("http://127.0.0.1:9001",))
    assert [c.id for c in copyset.serving(rows)] == [COPY_1]


def test_no_copy_serving_is_a_target_on_its_way() -> None:
    rows = [
        row(DEPLOYMENT, S.INITIALIZING, port=9000),
        row(COPY_1, S.QUEUED, copy_of=DEPLOYMENT, copy_index=1),
    ]
    target = snapshot_of(rows, taken_at=0.0).by_id[DEPLOYMENT]
    assert (target.status, target.engines, target.starting) == (S.INITIALIZING, (), True)
    unloaded = snapshot_of([replace(rows[0], status=S.UNLOADED)], taken_at=0.0)
    assert unloaded.by_id[DEPLOYMENT].starting is False  # loaded on demand
