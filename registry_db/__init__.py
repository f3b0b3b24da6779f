"""The registry's storage: SQLAlchemy models (models.py) under Alembic migrations (migrate.py,
migrations/), the content-addressed blob store (blobs.py), publishing (publish.py), aliases,
tokens, the audit log and read queries. `registry.open_registry()` opens all of it at once."""
