"""Alembic migrations, shipped inside the package and run by `Database.migrate()` on start."""
