"""A deployment's status by what it means to a client: failed, not ended, ready to serve.
Apart from the schemas so that a reader of the server's JSON (the command line's `ps`) has
them without pydantic."""

from __future__ import annotations

FAILURE_STATUSES = frozenset({"FAILED", "ERROR", "MUST_REDOWNLOAD"})
# Not ended. UNLOADED: scaled to zero (no engine, no budget), still routable: the gateway
# loads it on its next request. QUEUED: waiting for room (a wait keeps polling).
ACTIVE_STATUSES = frozenset(
    {"REQUESTED", "DEPLOYING", "INITIALIZING", "DEPLOYED", "UNLOADED", "QUEUED"}
)
# Statuses a wait for readiness ends on: serving, or routable and loaded on demand.
READY_STATUSES = frozenset({"DEPLOYED", "UNLOADED"})
