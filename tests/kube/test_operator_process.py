"""Layer: the operator process (kube/operator.py), without a cluster: what `main()` sets up
before kopf runs."""

from __future__ import annotations

import gc
import json
from collections.abc import Iterator

import pytest

from cohabit.kube import operator


@pytest.fixture
def thresholds() -> Iterator[None]:
    kept = gc.get_threshold()
    yield
    gc.set_threshold(*kept)


def _collections_parsing(document: str) -> int:
    """How many times the cyclic collector ran while `document` was parsed."""
    before = sum(s["collections"] for s in gc.get_stats())
    parsed = json.loads(document)
    after = sum(s["collections"] for s in gc.get_stats())
    del parsed
    return after - before


def test_the_operator_collects_far_less_often_while_it_parses_a_list_of_pods(
    thresholds: None,
) -> None:
    """A pod list like the one a NoFit is confirmed on (1,400 pods, each a few hundred
    nested objects): with Python's default thresholds the collector runs hundreds of times
    while it is parsed, each time over every object the operator already holds; with the
    operator's, a few. The collector runs on counts of allocations, not on time."""
    pods = [
        {
            "metadata": {
                "name": f"chat-{i}-engine",
                "labels": {f"label-{k}": "v" for k in range(6)},
                "annotations": {f"cohabit.dev/a-{k}": "[[0, null]]" for k in range(8)},
            },
            "spec": {
                "containers": [
                    {"env": [{"name": f"E{k}", "value": "x"} for k in range(40)]},
                    {"volumeMounts": [{"name": f"m{k}", "mountPath": "/m"} for k in range(10)]},
                ]
            },
            "status": {"conditions": [{"type": f"C{k}", "status": "True"} for k in range(5)]},
        }
        for i in range(1400)
    ]
    document = json.dumps({"items": pods})
    gc.set_threshold(700, 10, 10)  # Python's defaults
    by_default = _collections_parsing(document)
    operator.collect_less()
    ours = _collections_parsing(document)
    assert gc.get_threshold() == operator.GC_THRESHOLDS
    assert by_default >= 100, by_default
    assert ours * 20 <= by_default, (ours, by_default)
