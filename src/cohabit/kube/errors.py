"""Faults of the Kubernetes layer. Outcomes are not faults: a NoFit is recorded on the
ModelDeployment's status, and a pod that ends Unschedulable is mapped to the same reasons.

KubeError(Exception)
 ├── InvalidSpec        a ModelDeployment spec that can never be served as written
 │                      (bad size, unknown engine, a model the estimator cannot read)
 ├── ClusterError       the API server refused or failed a call we cannot do without
 └── AgentError         the node agent cannot publish (no GPU found, kubelet refused the
                        device plugin's registration)
"""

from __future__ import annotations


class KubeError(Exception):
    """Base of the Kubernetes layer's faults."""


class InvalidSpec(KubeError):
    """A ModelDeployment spec that is wrong as written; the message names the field."""


class ClusterError(KubeError):
    """An API call failed; the message names the call and the status."""


class AgentError(KubeError):
    """The node agent cannot publish labels or budgets."""
