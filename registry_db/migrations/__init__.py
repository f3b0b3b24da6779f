"""Alembic migrations of the registry schema; run them with `oscar-zoo db upgrade`."""
