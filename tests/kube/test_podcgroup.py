"""Which pod a process is in, from /proc/<pid>/cgroup files recorded on real nodes (cgroup v1
and v2, cgroupfs and systemd drivers, docker, containerd and cri-o; sources in
tests/fixtures/kube/proc_cgroup.json), and from a /proc laid out as the kernel lays it out."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import pytest

from cohabit.kube.podcgroup import pod_uid_in, pod_uid_of
from tests.conftest import FIXTURES

RECORDED: list[dict[str, Any]] = json.loads((FIXTURES / "kube" / "proc_cgroup.json").read_text())[
    "files"
]


@pytest.mark.parametrize("recorded", RECORDED, ids=[r["name"] for r in RECORDED])
def test_the_pod_uid_is_read_from_each_recorded_cgroup_file(recorded: dict[str, Any]) -> None:
    assert pod_uid_in(recorded["text"]) == recorded["uid"]


def test_the_recordings_cover_both_versions_and_both_drivers() -> None:
    pods = [r for r in RECORDED if r["uid"]]
    v2 = [r for r in pods if r["text"].startswith("0::")]
    v1 = [r for r in pods if not r["text"].startswith("0::")]
    assert any("/kubepods/" in r["text"] for r in v1) and any(".slice" in r["text"] for r in v1)
    assert any("/kubepods/" in r["text"] for r in v2) and any(".slice" in r["text"] for r in v2)


def test_a_path_seen_from_another_cgroup_namespace_still_names_its_pod() -> None:
    """A private cgroup namespace shows other cgroups relative to its own root."""
    text = (
        "0::/../../kubepods-burstable-pod7d4424e6_bb13_42f4_a47a_45a4828bf54d.slice/"
        "cri-containerd-d0b3604b67ac7930dd34ba3a796627e3e4717d12309e90a4afe3f38b6816ac98.scope\n"
    )
    assert pod_uid_in(text) == "7d4424e6-bb13-42f4-a47a-45a4828bf54d"


def test_names_that_only_look_like_pods_are_not_taken() -> None:
    assert pod_uid_in("0::/system.slice/podman-1234.scope\n") is None
    assert pod_uid_in("0::/user.slice/user-1000.slice/session-3.scope\n") is None
    assert pod_uid_in("") is None


def test_a_process_file_is_read_from_proc_and_a_gone_process_says_none(tmp_path: Path) -> None:
    assert pod_uid_of(2**22 + 12345) is None  # above pid_max's ceiling: never a process
    recorded = RECORDED[0]
    (tmp_path / "4242").mkdir()
    (tmp_path / "4242" / "cgroup").write_text(recorded["text"])
    assert pod_uid_of(4242, proc=tmp_path) == recorded["uid"]
