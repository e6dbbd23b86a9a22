"""Which pod a process belongs to, from its `/proc/<pid>/cgroup`: the kubelet names every pod's
cgroup after the pod's UID, so the node agent can tell cohabit's engine pods' processes from
everyone else's without asking the container runtime.

The names, as kubernetes builds them (pkg/kubelet/cm/pod_container_manager_linux.go
`GetPodContainerName`: the QoS parent — `kubepods`, `kubepods/burstable` or
`kubepods/besteffort` — plus `GetPodCgroupNameSuffix`, "pod" + the UID;
pkg/kubelet/cm/cgroup_manager_linux.go `ToCgroupfs` / `ToSystemd`):

- cgroupfs driver: one path component per name part, the UID as is:
  `/kubepods/burstable/pod9a18ffb8-8513-11e7-b26e-7e29fbe2a5a3/<container id>`;
- systemd driver: the parts joined by "-" with every "-" inside a part escaped to "_"
  (`escapeSystemdCgroupName`) and expanded into nested slices:
  `/kubepods.slice/kubepods-burstable.slice/kubepods-burstable-pod7d4424e6_bb13_….slice/
  cri-containerd-<id>.scope` (containerd; `crio-…`, `docker-…` for the others). A kubelet
  `--cgroup-root` adds its own prefix (kind: `/kubelet.slice/kubelet-kubepods.slice/…`).

The file itself: cgroup v1 has one `hierarchy-id:controllers:path` line per hierarchy, cgroup
v2 one `0::path` line; containerd's systemd cgroup paths sometimes show in v1 hierarchies as
`…-pod<uid>.slice:cri-containerd:<id>`. A process seen from another cgroup namespace shows a
relative path (`/../../…-pod<uid>.slice/…`). The pod component is recognised in all of them;
a static pod's UID is a 32-digit hash rather than a UUID, and is recognised too.
"""

from __future__ import annotations

import re
from pathlib import Path

PROC = Path("/proc")

# "pod<uid>" as a whole cgroupfs component, or "<parent>-pod<uid>.slice" under systemd (its
# "-" escaped to "_"); a UUID (36) or a static pod's config hash (32 hex digits).
_POD = re.compile(
    r"(?:^|/|-)pod(?P<uid>[0-9a-f]{8}[-_][0-9a-f]{4}[-_][0-9a-f]{4}[-_][0-9a-f]{4}[-_][0-9a-f]{12}"
    r"|[0-9a-f]{32})(?:\.slice)?(?=/|:|$)"
)


def pod_uid_in(cgroup_text: str) -> str | None:
    """The pod UID named by a `/proc/<pid>/cgroup` file's text (any of its lines), as the API
    spells it (with "-"); None for a process in no pod."""
    for line in cgroup_text.splitlines():
        _hierarchy, _sep, rest = line.partition(":")
        _controllers, _sep, path = rest.partition(":")
        found = _POD.search(path)
        if found is not None:
            return found["uid"].replace("_", "-")
    return None


def pod_uid_of(pid: int, *, proc: Path = PROC) -> str | None:
    """The pod UID of a running process; None outside a pod or once the process is gone."""
    try:
        text = (proc / str(pid) / "cgroup").read_text()
    except OSError:  # gone, or a pid of another namespace
        return None
    return pod_uid_in(text)
