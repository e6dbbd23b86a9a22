"""Lease owner ids stay within the claimed_by column whatever the host name (Kubernetes pod
names reach 63 characters, DNS names 253), stay readable, and stay apart for hosts that share
a long prefix."""

from __future__ import annotations

import pytest

from cohabit.store.deployments import owner_id
from cohabit.store.tables import OWNER_CHARS

POD = "inference-server-7f9c6d5b8-" + "x" * 34  # 61 characters


@pytest.mark.parametrize(
    ("host", "pid", "expected"),
    [
        ("gpu-box", 4242, "gpu-box:4242:9f1c2b3a"),
        ("h" * 40, 1, f"{'h' * 40}:1:9f1c2b3a"),  # the longest name kept whole
        (POD, 4194304, "inference-server-7f9c6d5b8-xxxx~d2ed7ed8:4194304:9f1c2b3a"),
    ],
    ids=["short", "forty", "pod-61"],
)
def test_owner_ids(host: str, pid: int, expected: str) -> None:
    assert owner_id(host, pid, "9f1c2b3a") == expected


@pytest.mark.parametrize("length", [41, 61, 63, 64, 253, 1000])
def test_every_host_name_fits_the_column(length: int) -> None:
    owner = owner_id("n" * length, 4194304, "9f1c2b3a")  # Linux's largest pid
    assert len(owner) <= OWNER_CHARS
    assert owner.startswith("n" * 31 + "~")


def test_long_names_that_share_a_prefix_stay_apart() -> None:
    assert owner_id(POD + "-a", 7, "00000000") != owner_id(POD + "-b", 7, "00000000")
