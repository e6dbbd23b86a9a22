"""resourceVersions as numbers. Kubernetes calls them opaque, but the API server numbers every
write of the cluster with etcd's one revision, and the kube-scheduler's assume cache compares
them so (kubernetes pkg/scheduler/util/assumecache/assume_cache.go parses them with
strconv.ParseInt); the operator does the same to know whether a read includes a write.
"""

from __future__ import annotations


def version_number(text: object) -> int:
    """A resourceVersion as a number; -1 for none (or one that is not a number)."""
    value = str(text or "")
    return int(value) if value.isdigit() else -1


def newest(*versions: str | None) -> str | None:
    """The latest of these resourceVersions (None when none is given)."""
    known = [v for v in versions if version_number(v) >= 0]
    return max(known, key=version_number) if known else None
