"""Stable ids for what the fleet holds, as the cluster API and model instances show them:
each node, its hardware record, the one cluster a server runs and that cluster's location.
They are UUIDv5 of the node's name, so they survive restarts and are equal on every replica
of a server that shares the database."""

from __future__ import annotations

import uuid

_NAMESPACE = uuid.uuid5(uuid.NAMESPACE_URL, "https://cohabit.dev/cluster")
CLUSTER_NAME = "cohabit"


def node_id(node_name: str) -> uuid.UUID:
    return uuid.uuid5(_NAMESPACE, f"node:{node_name}")


def hardware_id(node_name: str) -> uuid.UUID:
    return uuid.uuid5(_NAMESPACE, f"hardware:{node_name}")


def cluster_id() -> uuid.UUID:
    """One server places on one fleet: one cluster."""
    return uuid.uuid5(_NAMESPACE, f"cluster:{CLUSTER_NAME}")


def location_id() -> uuid.UUID:
    return uuid.uuid5(_NAMESPACE, f"location:{CLUSTER_NAME}")
