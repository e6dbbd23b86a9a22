"""What was decided: models, configs, deployments, reservations and nodes in SQL (SQLAlchemy 2,
Alembic migrations run on start). SQLite by default, PostgreSQL when a URL says so."""
