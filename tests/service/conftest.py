"""Service tests run on SQLite and PostgreSQL (see databases.py)."""

from tests.store.databases import database_url, module_database_url

__all__ = ["database_url", "module_database_url"]
