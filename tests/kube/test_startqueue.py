"""One engine start per device: which gated pods may start, from the pods' wire JSON (pure;
the pods are shaped as the operator builds them: our annotations, the start gate)."""

from __future__ import annotations

import json
from typing import Any

import pytest

from cohabit.kube.startqueue import START_GATE, devices_of, must_wait, to_release

READY = {"phase": "Running", "conditions": [{"type": "Ready", "status": "True"}]}
STARTING = {"phase": "Running", "conditions": [{"type": "Ready", "status": "False"}]}
CRASHING = {
    "phase": "Running",
    "containerStatuses": [{"state": {"waiting": {"reason": "CrashLoopBackOff"}}}],
}


def pod(
    name: str,
    gpus: list[int],
    *,
    status: dict[str, Any] | None = None,
    gated: bool = False,
    queued: str = "",
    sharing: str = "fractional",
) -> dict[str, Any]:
    return {
        "metadata": {
            "name": name,
            "namespace": "team-a",
            "annotations": {
                "cohabit.dev/deployment": f"team-a/{name}",
                "cohabit.dev/node": "n1",
                "cohabit.dev/slots": json.dumps([[g, None] for g in gpus]),
                "cohabit.dev/sharing-class": sharing,
                "cohabit.dev/queued-at": queued,
            },
        },
        "spec": {"schedulingGates": [{"name": START_GATE}]} if gated else {},
        "status": status or {},
    }


@pytest.mark.parametrize(
    ("pods", "released"),
    [
        pytest.param(
            [pod("a", [0], status=STARTING), pod("b", [0], gated=True, queued="1")],
            [], id="waits-while-the-first-starts",
        ),
        pytest.param(
            [pod("a", [0], status=READY), pod("b", [0], gated=True, queued="1"),
             pod("c", [0], gated=True, queued="2")],
            ["b"], id="first-ready-releases-only-the-oldest",
        ),
        pytest.param(
            [pod("a", [0], status=CRASHING), pod("b", [0], gated=True, queued="1")],
            ["b"], id="a-failing-engine-does-not-hold-the-queue",
        ),
        pytest.param(
            [pod("a", [1], status=STARTING), pod("tp", [0, 1], gated=True, queued="1"),
             pod("c", [0], gated=True, queued="2")],
            [], id="a-later-pod-does-not-jump-an-older-tp-pod",
        ),
        pytest.param(
            [pod("a", [1], status=STARTING), pod("b", [0], gated=True, queued="1")],
            ["b"], id="another-device-is-no-reason-to-wait",
        ),
    ],
)  # fmt: skip
def test_gated_pods_start_in_order_one_per_device(
    pods: list[dict[str, Any]], released: list[str]
) -> None:
    assert [name for _, name in to_release(pods)] == released


def test_cpu_pools_are_not_serialized() -> None:
    cpu = pod("a", [], status=STARTING, sharing="cpu")
    cpu["metadata"]["annotations"]["cohabit.dev/slots"] = "[[null,null]]"
    assert devices_of(cpu) == frozenset()
    assert not must_wait([cpu], frozenset())


def test_a_new_pod_waits_behind_a_gated_one() -> None:
    queue = [pod("a", [0], status=READY), pod("b", [0], gated=True, queued="1")]
    assert must_wait(queue, devices_of(pod("c", [0])))
    assert not must_wait(queue, devices_of(pod("c", [1])))
