"""One model per name: each model's normalised name (`name_key`) under a unique index.

A database from before may hold models whose names are one once normalised (`tiny` twice,
`Tiny` and `tiny`): the oldest keeps its name, and each later one is renamed
`<name>-<the first 8 characters of its id>` (its whole id in the unlikely case that is
taken too), so the upgrade never fails on them. Deployments keep the name they were made
with: an engine serves it until it is stopped.

Revision ID: model_names
Revises: copies
"""

from __future__ import annotations

import hashlib
import itertools
import unicodedata
from datetime import UTC, datetime

import sqlalchemy as sa
from alembic import op

revision = "model_names"
down_revision = "copies"
branch_labels = None
depends_on = None

NAME_CHARS = 255  # the name column's length, as store/records.py has it at this revision


def name_key(name: str) -> str:
    """store/catalog.py's `name_key` at this revision."""
    folded = unicodedata.normalize("NFKC", unicodedata.normalize("NFKC", name).casefold())
    return hashlib.sha256(folded.encode("utf-8", "surrogatepass")).hexdigest()


def free_name(model_id: str, name: str, taken: set[str]) -> str:
    """`name` when no earlier model's name has its key, else `name` with the id's first 8
    characters, or the whole id, appended (cut to fit the column)."""
    suffixes = itertools.chain(
        ("", f"-{model_id[:8]}", f"-{model_id}"),
        (f"-{model_id}-{number}" for number in itertools.count(2)),
    )
    candidates = (f"{name[: NAME_CHARS - len(suffix)]}{suffix}" for suffix in suffixes)
    return next(candidate for candidate in candidates if name_key(candidate) not in taken)


def upgrade() -> None:
    # NOT NULL with a default: SQLite adds such a column in place, without copying the table
    # (a copy would drop `models`, and its files' and configs' rows by cascade with it).
    op.add_column("models", sa.Column("name_key", sa.String(64), nullable=False, server_default=""))
    connection = op.get_bind()
    models = sa.table(
        "models",
        sa.column("id", sa.String),
        sa.column("name", sa.String),
        sa.column("name_key", sa.String),
        sa.column("created_at", sa.DateTime(timezone=True)),
        sa.column("modified_at", sa.DateTime(timezone=True)),
    )
    rows = connection.execute(
        sa.select(models.c.id, models.c.name).order_by(models.c.created_at, models.c.id)
    ).all()
    now = datetime.now(UTC)
    taken: set[str] = set()
    for row in rows:  # oldest first: the first of a name keeps it
        name = free_name(row.id, row.name, taken)
        taken.add(name_key(name))
        values: dict[str, object] = {"name_key": name_key(name)}
        if name != row.name:
            values |= {"name": name, "modified_at": now}
        connection.execute(sa.update(models).where(models.c.id == row.id).values(**values))
    op.create_index("ux_models_name_key", "models", ["name_key"], unique=True)


def downgrade() -> None:
    # Renamed models keep their new names: the old code accepts them as they are. Dropped
    # in place (SQLite 3.35 and later), not by copying the table (see upgrade).
    op.drop_index("ux_models_name_key", table_name="models")
    op.execute("ALTER TABLE models DROP COLUMN name_key")
