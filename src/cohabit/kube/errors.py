"""Faults of the Kubernetes layer. Outcomes are not faults: a NoFit is recorded on the
ModelDeployment's status, and a pod that ends Unschedulable is mapped to the same reasons.

KubeError(Exception)
 ├── InvalidSpec        a ModelDeployment spec that can never be served as written
 │                      (bad size, unknown engine, a model the estimator cannot read)
 ├── ClusterError       the API server refused or failed a call we cannot do without
 │    └── AlreadyExists an object of that name is there already (409 on create)
 └── AgentError         the node agent cannot publish (no GPU found, kubelet refused the
                        device plugin's registration)
"""

from __future__ import annotations


class KubeError(Exception):
    """Base of the Kubernetes layer's faults."""


class InvalidSpec(KubeError):
    """A ModelDeployment spec that is wrong as written; the message names the field."""


class ClusterError(KubeError):
    """An API call failed; the message names the call, the status and what the API server
    said. `status`: the HTTP status (None: no answer at all)."""

    def __init__(self, message: str, *, status: int | None = None) -> None:
        super().__init__(message)
        self.status = status


class AlreadyExists(ClusterError):
    """A create found an object of that name; whether it is the one wanted is the caller's
    to check (an old generation's pod may still be terminating under that name)."""


class AgentError(KubeError):
    """The node agent cannot publish labels or budgets."""
