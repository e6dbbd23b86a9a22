"""Faults the store raises; the service turns them into HTTP answers or one line for a person.

StoreError
├── RecordNotFound        no row with that id (the message names the kind and the id)
├── Conflict              the row exists but is not in a state that allows the change
│   └── NameTaken         another model already has that name (the same once normalised)
└── DatabaseUnavailable   the database cannot be opened, checked, migrated, read or written
"""

from __future__ import annotations


class StoreError(Exception):
    """Base of every store fault."""


class RecordNotFound(StoreError):
    """No row of that kind with that id."""

    def __init__(self, kind: str, row_id: str) -> None:
        super().__init__(f"{kind} {row_id} not found")
        self.kind = kind
        self.row_id = row_id


class Conflict(StoreError):
    """The change does not apply to the row as it is now."""


class NameTaken(Conflict):
    """A model name whose key (`catalog.name_key`) another model's name already has."""

    def __init__(self, name: str, *, holder_id: str, holder_name: str) -> None:
        same = "" if holder_name == name else f" as {holder_name!r}"
        super().__init__(f"model name {name!r} is taken by model {holder_id}{same}")
        self.holder_id = holder_id


class DatabaseUnavailable(StoreError):
    """The database cannot be opened, reached, checked or brought up to the current schema,
    or a read or write failed for a reason of the database's (disk full, read-only, locked,
    unreachable, damaged) rather than the request's."""
