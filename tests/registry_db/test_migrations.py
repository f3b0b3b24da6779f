"""Schema: the migration builds exactly what the ORM models describe, on both backends."""

from __future__ import annotations

import pytest
from alembic.autogenerate import compare_metadata
from alembic.runtime.migration import MigrationContext
from sqlalchemy import text

from oscar_zoo.registry_db import migrate
from oscar_zoo.registry_db.models import Base
from oscar_zoo.registry_db.registry import open_registry
from oscar_zoo.registry_db.session import Database
from oscar_zoo.zoo.catalog import CATALOG
from oscar_zoo.zoo.errors import SchemaOutOfDate


def test_migration_matches_models(registry_db_url):
    db = Database(registry_db_url)
    migrate.upgrade(db)
    assert migrate.current(db) == migrate.head()
    with db.engine.connect() as conn:
        diff = compare_metadata(MigrationContext.configure(conn, opts={"compare_type": True}),
                                Base.metadata)
    assert diff == [], diff
    # Downgrade works too: nothing left but alembic's own table.
    from alembic import command

    cfg = migrate._config()
    with db.engine.begin() as conn:
        cfg.attributes["connection"] = conn
        command.downgrade(cfg, "base")
    with db.engine.connect() as conn:
        from sqlalchemy import inspect

        assert set(inspect(conn).get_table_names()) <= {"alembic_version"}
    db.dispose()


def test_open_registry_migrates_empty_and_seeds_catalog(registry_db_url, tmp_path):
    registry = open_registry(registry_db_url, tmp_path / "data")
    with registry.db.read() as session:
        names = set(session.scalars(text("select name from models")))
    assert names == {e.name for e in CATALOG}
    registry.close()
    again = open_registry(registry_db_url, tmp_path / "data")  # idempotent on a live database
    from oscar_zoo.registry_db.registry import sync_catalog

    assert sync_catalog(again.db) == 0
    again.close()


def test_refuses_a_database_it_did_not_migrate(registry_db_url, tmp_path):
    db = Database(registry_db_url)
    with db.engine.begin() as conn:
        conn.execute(text("create table legacy (id integer)"))
    db.dispose()
    with pytest.raises(SchemaOutOfDate, match="oscar-zoo db upgrade"):
        open_registry(registry_db_url, tmp_path / "data")


def test_sqlite_pragmas(tmp_path):
    db = Database(f"sqlite:///{tmp_path}/r.sqlite")
    with db.engine.connect() as conn:
        assert conn.exec_driver_sql("pragma journal_mode").scalar() == "wal"
        assert conn.exec_driver_sql("pragma foreign_keys").scalar() == 1
        assert conn.exec_driver_sql("pragma busy_timeout").scalar() == 30000
    db.dispose()
