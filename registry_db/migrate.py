"""Schema management: Alembic, driven from code, with the scripts shipped inside the package."""

from __future__ import annotations

from pathlib import Path

from alembic import command
from alembic.config import Config
from alembic.runtime.migration import MigrationContext
from alembic.script import ScriptDirectory

from ..zoo.errors import SchemaOutOfDate
from .session import Database

SCRIPTS = Path(__file__).parent / "migrations"


def _config() -> Config:
    cfg = Config()
    cfg.set_main_option("script_location", str(SCRIPTS))
    return cfg


def head() -> str:
    return ScriptDirectory.from_config(_config()).get_current_head()


def current(db: Database) -> str | None:
    with db.engine.connect() as conn:
        return MigrationContext.configure(conn).get_current_revision()


def upgrade(db: Database, revision: str = "head") -> None:
    """Migrate to `revision` in one transaction (PostgreSQL has transactional DDL)."""
    cfg = _config()
    with db.engine.begin() as conn:
        cfg.attributes["connection"] = conn
        command.upgrade(cfg, revision)


def ensure_schema(db: Database, upgrade_empty: bool = True) -> None:
    """Migrate an empty database; refuse one that is behind (migrating live data is explicit).

    Raises SchemaOutOfDate when the database has an older schema than this code.
    """
    rev = current(db)
    if rev == head():
        return
    if rev is None and upgrade_empty and not _has_tables(db):
        upgrade(db)
        return
    raise SchemaOutOfDate(f"the registry database is at schema {rev or '(none)'}, this code needs "
                          f"{head()}; run `oscar-zoo db upgrade` (back up the database first)")


def _has_tables(db: Database) -> bool:
    from sqlalchemy import inspect

    with db.engine.connect() as conn:
        return bool(inspect(conn).get_table_names())
